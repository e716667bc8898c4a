//! How a call finds that its ranks disagree and says why it failed: the call words a first barrier
//! or an LL exchange announces to the peers (`call_id`: the grid and the heap's digest) and
//! compares, and the error each failure records (`GRID_MISMATCH`, `HEAP_ASYMMETRIC`, `TIMEOUT`).
//! Off the fast path but for the announcement and one vote.

use super::{signal_base_fresh, Call};
use crate::abi::{is_failure_among_ranks, signal, status, MAX_RANKS};
use crate::hw;
use crate::runtime::{call_id, context};

impl Call<'_> {
    /// The call word `[slot][from]` in the signal region at `rank_base` (indexed as `flag`).
    #[inline(always)]
    pub(super) fn call_word(&self, rank_base: usize, from: usize) -> *mut u64 {
        let from = from & (MAX_RANKS - 1);
        let words = if self.is_tile() {
            signal::TILE_BARRIER_ID_OFFSET
        } else {
            signal::BARRIER_ID_OFFSET
        };
        (rank_base + words + (self.cta * MAX_RANKS + from) * 8) as *mut u64
    }

    /// Announces this call's word (`call_id`) to every peer, as a first barrier does, where an
    /// LL exchange (`ll_packet`) has no barrier: a peer on another grid may have chosen a
    /// barrier path for the same bytes (the LL paths fit a CTA's share of them), and on a timeout
    /// each side reads the other's word (`grid_differs`). One posted store per peer; none for a
    /// tile call, whose grid may differ by rank. Every thread calls it.
    #[inline(always)]
    pub fn announce(&self) {
        let tid = hw::thread_rank_fresh() as usize;
        if !self.is_tile() && tid < self.world && tid != self.rank {
            // SAFETY: peer tid's signal region is mapped; the slot is inside its call words.
            unsafe {
                hw::store_relaxed_u64(
                    self.call_word(signal_base_fresh(self.c, tid), self.rank),
                    self.call_id(),
                )
            };
        }
    }

    /// Whether a peer announced this call (this epoch) on another grid, at a first barrier or an
    /// LL exchange (`announce`): thread p reads peer p's word, the CTA votes. Off the fast path:
    /// after a wait timed out. Every thread calls it.
    #[cold]
    #[inline(always)]
    fn grid_differs(&self) -> bool {
        let tid = hw::thread_rank_fresh() as usize;
        let mut differs = false;
        if !self.is_tile() && tid < self.world && tid != self.rank {
            // SAFETY: our own signal region, inside its call words.
            let seen = unsafe {
                hw::load_relaxed_u64(self.call_word(signal_base_fresh(self.c, self.rank), tid))
            };
            differs = call_id::differences(self.call_id(), seen) & call_id::GRID_DIFFERS != 0;
        }
        hw::sync_threads_or(differs)
    }

    /// What this rank announces at this call's first barrier (`call_id`).
    #[inline(always)]
    pub(super) fn call_id(&self) -> u64 {
        call_id::of(self.c, self.epoch, self.ctas)
    }

    /// Ends a first barrier: once the CTA agrees that no thread timed out, the threads that
    /// waited compare the call word each peer announced with the one this rank announced (the
    /// thread of our own rank stored it in our region too, visible to the CTA after the vote),
    /// and the CTA votes on differences. Two local loads from one cache line, and a second vote,
    /// rather than our word kept or recomputed across the wait: that pushed tile reduce-scatter
    /// into spills.
    #[inline(always)]
    pub(super) fn check_call_words(
        &self,
        late: bool,
        first: usize,
        count: usize,
    ) -> Result<(), i32> {
        // Uniform: every thread takes the same branches to the votes below.
        let timed_out = hw::sync_threads_or(late);
        let tid = hw::thread_rank_fresh() as usize;
        let mut differs = 0;
        if !timed_out && tid < count {
            let own = signal_base_fresh(self.c, self.rank);
            // SAFETY (both): our own signal region, inside its call words. The peer's word came
            // before its flag, which we acquired; ours before the vote above.
            let seen = unsafe { hw::load_relaxed_u64(self.call_word(own, first + tid)) };
            let mine = unsafe { hw::load_relaxed_u64(self.call_word(own, self.rank)) };
            differs = call_id::differences(mine, seen);
        }
        if timed_out || hw::sync_threads_or(differs != 0) {
            return Err(self.failed_barrier(timed_out, differs));
        }
        Ok(())
    }

    /// Why a first barrier failed, recorded and returned: if a thread timed out, the timeout, or
    /// `GRID_MISMATCH` when another CTA of this rank already recorded one (a CTA beyond a peer's
    /// grid has no partner and times out; its siblings that had one saw the grids differ); else
    /// a grid mismatch if any thread saw one, else an asymmetric heap. Every thread calls it
    /// (`timed_out` is the CTA's vote). Off the fast path, and small: it inlines everywhere.
    #[cold]
    #[inline(always)]
    fn failed_barrier(&self, timed_out: bool, differs: u32) -> i32 {
        let code = if timed_out {
            // A peer on another grid may have taken an LL path for these bytes: its word says so.
            self.timeout_cause()
        } else if hw::sync_threads_or(differs & call_id::GRID_DIFFERS != 0) {
            status::GRID_MISMATCH
        } else {
            status::HEAP_ASYMMETRIC
        };
        self.record_failure(code)
    }

    /// Why a wait of this call timed out: `GRID_MISMATCH` if a peer announced it on another grid
    /// (`grid_differs`), else `TIMEOUT`. Every thread calls it.
    #[cold]
    #[inline(always)]
    fn timeout_cause(&self) -> i32 {
        if self.grid_differs() {
            status::GRID_MISMATCH
        } else {
            status::TIMEOUT
        }
    }

    /// Records a failed call's `code` and returns what the CTA returns. The error that stands is
    /// the same for every thread: the first recorded (a grid mismatch found only after a timeout
    /// replaces that timeout), and a timeout after a sibling's grid mismatch or asymmetric heap
    /// returns that (the wait gave up because it was recorded: `Deadline`).
    #[cold]
    #[inline(always)]
    fn record_failure(&self, code: i32) -> i32 {
        let standing = if code == status::GRID_MISMATCH {
            context::record_grid_mismatch(self.c, self.which)
        } else {
            context::record_error(self.c, code, self.which)
        };
        if code == status::TIMEOUT && is_failure_among_ranks(standing) {
            return standing;
        }
        code
    }

    /// Ends an LL exchange (`ll_packet`): a CTA barrier at which its threads agree whether any
    /// wait timed out; then `GRID_MISMATCH` if a peer announced this call on another grid
    /// (`grid_differs`: its packets were never taken) or another CTA of this rank recorded one
    /// first, else `TIMEOUT`, recorded and returned. A CTA beyond a peer's grid has no partner
    /// and no word from it: it may return `TIMEOUT`, while the recorded error (what the host
    /// raises) becomes `GRID_MISMATCH` (`record_grid_mismatch`). Every thread calls it.
    #[inline(always)]
    pub fn agree_on_wait(&self, late: bool) -> Result<(), i32> {
        if !hw::sync_threads_or(late) {
            return Ok(());
        }
        Err(self.record_failure(self.timeout_cause()))
    }
}
