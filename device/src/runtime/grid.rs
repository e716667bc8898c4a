//! The grid barrier: every CTA of this rank's launch waits until all of them have arrived, so
//! that what any CTA wrote before it is visible to every CTA after it. A kernel that produces a
//! tensor with many CTAs can then run a whole-tensor collective on it in the same launch.
//!
//! Sense-reversing and self-resetting: thread 0 of each CTA reads the generation, then adds one
//! to the arrival count; the last to arrive resets the count and publishes the next generation,
//! the others wait for it. Nothing needs clearing between launches or graph replays, and any grid
//! size works from one launch to the next. It needs every CTA of the grid resident at once (a CTA
//! that cannot start until another finishes would never arrive): the grid may be at most the
//! number of SMs (`INVALID_ARGUMENT` otherwise), and a grid that still cannot be resident (other
//! work occupying the SMs) ends in `TIMEOUT`, never a hang. Rank-local: it does not wait for peers.

use super::sync::{agree_on_timeout, wait_until, Deadline};
use crate::abi::{signal, status, SymmContext, MAX_CTAS};
use crate::hw;

/// Waits until every CTA of the launch has called it. Every thread of every CTA calls it.
pub fn grid_barrier(c: &SymmContext, which: i32) -> Result<(), i32> {
    let ctas = hw::grid_ctas();
    if ctas as usize > MAX_CTAS || ctas > hw::sm_count() {
        return Err(status::INVALID_ARGUMENT);
    }
    let base = c.signal_base(c.rank as usize) + signal::GRID_OFFSET;
    let (count, generation) = (base as *mut u32, (base + 4) as *mut u32);
    let mut late = false;
    // Every thread's writes before the barrier are done, CTA-wide, before thread 0 arrives.
    hw::sync_threads();
    if hw::thread_rank_fresh() == 0 {
        // SAFETY (all accesses): two words of this rank's signal region, accessed atomically.
        // The generation is read before arriving: it cannot move on until this CTA has arrived.
        let current = unsafe { hw::load_acquire_u32(generation) };
        // Release: cumulative over the CTA's writes that the CTA barrier above ordered first
        // (as in `Call::barrier`); acquire: the last arriver sees every CTA's writes.
        let arrived = unsafe { hw::atomic_add_acq_rel_u32(count, 1) };
        if arrived == ctas - 1 {
            // The next barrier's arrivals come after the new generation, which they acquire.
            unsafe { hw::store_relaxed_u32(count, 0) };
            unsafe { hw::store_release_u32(generation, current.wrapping_add(1)) };
        } else {
            let mut deadline = Deadline::new(c);
            late = !wait_until(&mut deadline, || unsafe {
                hw::load_acquire_u32(generation) != current
            });
        }
    }
    agree_on_timeout(c, which, late)
}
