//! The simulated threads: each GPU thread an OS thread, with a thread-local record of its indices
//! and its CTA's barrier; their launch over ranks x CTAs x threads, the barrier, the timer.

extern crate std;

use std::boxed::Box;
use std::cell::Cell;
use std::string::String;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::held::deliver_held;
use crate::hw::sim_net;

/// How long a simulated CTA barrier waits for all its threads before declaring a deadlock.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(20);

/// A CTA barrier that names the deadlock instead of hanging: `arrive` panics after a timeout.
/// It also ORs the threads' predicates (`bar.red.or.pred`) in the same phase, as the GPU does.
pub struct CtaBarrier {
    threads: u32,
    state: Mutex<BarrierState>,
    cv: Condvar,
    label: String,
}

struct BarrierState {
    arrived: u32,
    generation: u64,
    /// The OR of this generation's predicates so far.
    or_acc: bool,
    /// The OR of the last completed generation: its waiters read it before any of them can
    /// arrive again, and the next generation cannot complete without all of them.
    or_result: bool,
}

impl CtaBarrier {
    fn new(threads: u32, label: String) -> Self {
        CtaBarrier {
            threads,
            state: Mutex::new(BarrierState {
                arrived: 0,
                generation: 0,
                or_acc: false,
                or_result: false,
            }),
            cv: Condvar::new(),
            label,
        }
    }

    /// Waits for all the CTA's threads; returns the OR of their `pred`s.
    fn arrive(&self, pred: bool) -> bool {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let generation = guard.generation;
        guard.or_acc |= pred;
        guard.arrived += 1;
        if guard.arrived == self.threads {
            let result = guard.or_acc;
            *guard = BarrierState {
                arrived: 0,
                generation: generation + 1,
                or_acc: false,
                or_result: result,
            };
            // Woken threads retake the lock: notifying after releasing it spares each a second
            // sleep on a lock still held (one CPU runs the whole CTA in `make test-rust`).
            drop(guard);
            self.cv.notify_all();
            return result;
        }
        let deadline = Instant::now() + BARRIER_TIMEOUT;
        while guard.generation == generation {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let arrived = guard.arrived;
                drop(guard);
                panic!(
                    "simulated CTA barrier deadlock in {}: {} of {} threads arrived",
                    self.label, arrived, self.threads
                );
            }
            guard = self
                .cv
                .wait_timeout(guard, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        guard.or_result
    }
}

#[derive(Clone, Copy)]
struct ThreadHw {
    tid: u32,
    ntid: u32,
    ctaid: u32,
    nctaid: u32,
    barrier: *const CtaBarrier,
    rng: u64,
}

std::thread_local! {
    static HW: Cell<Option<ThreadHw>> = const { Cell::new(None) };
}

fn hw() -> ThreadHw {
    HW.with(|h| h.get())
        .expect("hardware-layer call outside a simulated launch")
}

fn yield_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("IRONLINK_SIM_YIELD").is_ok_and(|v| v != "0"))
}

/// Randomly yields the OS thread (one time in four) when `IRONLINK_SIM_YIELD` is set.
#[inline]
pub(super) fn maybe_yield() {
    deliver_held();
    if !yield_enabled() {
        return;
    }
    HW.with(|h| {
        if let Some(mut t) = h.get() {
            t.rng ^= t.rng << 13;
            t.rng ^= t.rng >> 7;
            t.rng ^= t.rng << 17;
            h.set(Some(t));
            if t.rng & 3 == 0 {
                std::thread::yield_now();
            }
        }
    });
}

/// Runs `body(rank)` on `ranks` x `ctas` x `threads` simulated threads and waits for all of them.
/// A panic in any simulated thread (a barrier deadlock, a failed assertion) is re-raised here
/// with the first panic's message.
pub fn launch<F>(label: &str, ranks: usize, ctas: u32, threads: u32, body: F)
where
    F: Fn(usize) + Sync,
{
    launch_grids(label, &std::vec![ctas; ranks], threads, body)
}

/// `launch` with a grid of its own for each rank (`grids[rank]` CTAs): the misuse of launching
/// one call with different grids on different ranks.
pub fn launch_grids<F>(label: &str, grids: &[u32], threads: u32, body: F)
where
    F: Fn(usize) + Sync,
{
    let ranks = grids.len();
    let barriers: std::vec::Vec<std::vec::Vec<CtaBarrier>> = (0..ranks)
        .map(|rank| {
            (0..grids[rank])
                .map(|cta| CtaBarrier::new(threads, std::format!("{label}: rank {rank} cta {cta}")))
                .collect()
        })
        .collect();
    let first_panic: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|s| {
        for rank in 0..ranks {
            let ctas = grids[rank];
            for cta in 0..ctas {
                for tid in 0..threads {
                    let barrier = &barriers[rank][cta as usize];
                    let body = &body;
                    let first_panic = &first_panic;
                    let seed = 0x9e37_79b9_7f4a_7c15u64
                        ^ ((rank as u64) << 40 | (cta as u64) << 20 | tid as u64).wrapping_mul(31)
                        | 1;
                    std::thread::Builder::new()
                        .stack_size(256 * 1024)
                        .spawn_scoped(s, move || {
                            HW.with(|h| {
                                h.set(Some(ThreadHw {
                                    tid,
                                    ntid: threads,
                                    ctaid: cta,
                                    nctaid: ctas,
                                    barrier: barrier as *const CtaBarrier,
                                    rng: seed,
                                }))
                            });
                            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                body(rank);
                                deliver_held(); // a thread's last packet, if held
                                sim_net::progress(); // and its remote puts in flight
                            }));
                            HW.with(|h| h.set(None));
                            if let Err(e) = r {
                                let msg = panic_message(&e);
                                let mut first =
                                    first_panic.lock().unwrap_or_else(|e| e.into_inner());
                                if first.is_none() {
                                    *first = Some(msg);
                                }
                            }
                        })
                        .expect("spawn simulated thread");
                }
            }
        }
    });
    if let Some(msg) = first_panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
        panic!("{label}: {msg}");
    }
}

fn panic_message(e: &Box<dyn core::any::Any + Send>) -> String {
    if let Some(s) = e.downcast_ref::<&str>() {
        String::from(*s)
    } else if let Some(s) = e.downcast_ref::<String>() {
        s.clone()
    } else {
        String::from("panic with a non-string payload")
    }
}

pub fn thread_idx() -> (u32, u32, u32) {
    (hw().tid, 0, 0)
}

pub fn block_dim() -> (u32, u32, u32) {
    (hw().ntid, 1, 1)
}

pub fn block_idx() -> (u32, u32, u32) {
    (hw().ctaid, 0, 0)
}

pub fn grid_dim() -> (u32, u32, u32) {
    (hw().nctaid, 1, 1)
}

pub fn sync_threads() {
    sim_net::progress(); // a CTA barrier never waits on the network
    maybe_yield();
    // SAFETY: the barrier outlives every simulated thread (`launch` joins them before dropping it).
    unsafe { (*hw().barrier).arrive(false) };
    maybe_yield();
}

pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// SMs of the simulated GPU: small, so that tests can launch a grid larger than the GPU (every
/// simulated CTA runs at once whatever the grid; the device code only compares grids with it).
pub const SIM_SM_COUNT: u32 = 16;

pub fn sm_count() -> u32 {
    SIM_SM_COUNT
}

/// Lets other simulated threads run while one spins (the host has far fewer cores than threads).
pub fn spin_pause() {
    sim_net::progress(); // a thread that waits lets its own puts land
    std::thread::yield_now()
}

/// CTA barrier with an OR over the threads' predicates (`bar.red.or.pred` on the GPU).
pub fn sync_threads_or(pred: bool) -> bool {
    // One barrier phase that ORs the predicates, as `bar.red.or.pred` is one.
    sim_net::progress();
    maybe_yield();
    // SAFETY: the barrier outlives every simulated thread (see `sync_threads`).
    let b = unsafe { &*hw().barrier };
    b.arrive(pred)
}

/// See the nvptx version: the same value, re-read.
pub fn thread_rank_fresh() -> u32 {
    hw().tid
}
