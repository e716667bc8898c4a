//! Host implementation of the hardware layer: the CPU simulator.
//!
//! Each simulated GPU thread is an OS thread. A thread-local record holds its thread and block
//! indices and its CTA's barrier; `launch` creates ranks x CTAs x threads of them over shared host
//! memory and runs one body per thread. Every memory operation is a std atomic, so concurrent
//! access between simulated threads and ranks is defined behaviour.
//!
//! What this can and cannot catch: wrong indexing, missing or mismatched barriers (the CTA barrier
//! times out and panics with the thread counts), epochs that drift, waits that never end (the
//! device code's own timeout fires, `now_ns` is wall time here), out-of-bounds writes (into
//! guarded host buffers). The host's memory model is stronger than the GPU's (x86 is TSO, and
//! every access here is an atomic), so a missing release/acquire pair or fence that only matters
//! on weak hardware is NOT caught; those are checked by reading the PTX and on the GPUs.
//! Setting `IRONLINK_SIM_YIELD=1` adds random yields at every memory operation and barrier to
//! shake out orderings the OS scheduler would rarely produce; `sim_faults` drops, delays or
//! reorders synchronizing stores for the fault-injection tests.

extern crate std;

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::boxed::Box;
use std::cell::Cell;
use std::string::String;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::sim_faults::{self, Kind};

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
fn maybe_yield() {
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
                                super::sim_net::progress(); // and its remote puts in flight
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
    super::sim_net::progress(); // a CTA barrier never waits on the network
    maybe_yield();
    // SAFETY: the barrier outlives every simulated thread (`launch` joins them before dropping it).
    unsafe { (*hw().barrier).arrive(false) };
    maybe_yield();
}

pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

// The memory operations mirror nvptx.rs; SeqCst where the device uses acquire/release is a
// strengthening (see the module comment for what that hides).

pub unsafe fn load_acquire_u32(p: *const u32) -> u32 {
    maybe_yield();
    AtomicU32::from_ptr(p as *mut u32).load(Ordering::Acquire)
}

pub unsafe fn load_relaxed_u32(p: *const u32) -> u32 {
    maybe_yield();
    AtomicU32::from_ptr(p as *mut u32).load(Ordering::Relaxed)
}

pub unsafe fn store_release_u32(p: *mut u32, v: u32) {
    maybe_yield();
    if !sim_faults::proceed(Kind::FlagStore) {
        return;
    }
    AtomicU32::from_ptr(p).store(v, Ordering::Release)
}

pub unsafe fn store_relaxed_u32(p: *mut u32, v: u32) {
    // Under `ReorderStores` the data stores this thread issued before are overtaken: they land
    // after this flag store (a relaxed store orders nothing before it).
    let (overtaken, delay) = sim_faults::take_held_stores();
    maybe_yield();
    if sim_faults::proceed(Kind::FlagStore) {
        AtomicU32::from_ptr(p).store(v, Ordering::Relaxed);
    }
    if !overtaken.is_empty() {
        std::thread::sleep(delay);
        for (q, w) in overtaken {
            AtomicU32::from_ptr(q as *mut u32).store(w, Ordering::Relaxed);
            sim_faults::note_overtaken();
        }
    }
}

// Not a flag: no fault plan drops it (it travels with the flag store after it).
pub unsafe fn store_relaxed_u64(p: *mut u64, v: u64) {
    maybe_yield();
    AtomicU64::from_ptr(p).store(v, Ordering::Relaxed)
}

pub unsafe fn load_relaxed_u64(p: *const u64) -> u64 {
    maybe_yield();
    AtomicU64::from_ptr(p as *mut u64).load(Ordering::Relaxed)
}

pub unsafe fn load_acquire_u64(p: *const u64) -> u64 {
    maybe_yield();
    AtomicU64::from_ptr(p as *mut u64).load(Ordering::Acquire)
}

pub unsafe fn store_release_u64(p: *mut u64, v: u64) {
    maybe_yield();
    if !sim_faults::proceed(Kind::FlagStore) {
        return;
    }
    AtomicU64::from_ptr(p).store(v, Ordering::Release)
}

pub unsafe fn atomic_add_release_u64(p: *mut u64, v: u64) -> u64 {
    maybe_yield();
    if !sim_faults::proceed(Kind::FlagAdd) {
        return AtomicU64::from_ptr(p).load(Ordering::Acquire); // the add is lost
    }
    AtomicU64::from_ptr(p).fetch_add(v, Ordering::Release)
}

pub unsafe fn atomic_add_acq_rel_u32(p: *mut u32, v: u32) -> u32 {
    maybe_yield();
    if !sim_faults::proceed(Kind::FlagAdd) {
        return AtomicU32::from_ptr(p).load(Ordering::Acquire); // the add is lost
    }
    AtomicU32::from_ptr(p).fetch_add(v, Ordering::AcqRel)
}

pub unsafe fn red_add_release_u32(p: *mut u32, v: u32) {
    maybe_yield();
    if !sim_faults::proceed(Kind::FlagAdd) {
        return;
    }
    AtomicU32::from_ptr(p).fetch_add(v, Ordering::Release);
}

pub unsafe fn red_add_relaxed_u32(p: *mut u32, v: u32) {
    maybe_yield();
    if !sim_faults::proceed(Kind::FlagAdd) {
        return;
    }
    AtomicU32::from_ptr(p).fetch_add(v, Ordering::Relaxed);
}

/// SMs of the simulated GPU: small, so that tests can launch a grid larger than the GPU (every
/// simulated CTA runs at once whatever the grid; the device code only compares grids with it).
pub const SIM_SM_COUNT: u32 = 16;

pub fn sm_count() -> u32 {
    SIM_SM_COUNT
}

pub unsafe fn atomic_cas_u32(p: *mut u32, current: u32, new: u32) -> u32 {
    maybe_yield();
    match AtomicU32::from_ptr(p).compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(v) | Err(v) => v,
    }
}

/// Emulates an untearable 16-byte store: words are released in order 0..3 and `load_v4_volatile`
/// reads word 3 first with acquire, so a reader that sees word 3 new sees words 0..2 new as well.
/// LL packets put a flag in the last word, which is all the protocol needs.
pub unsafe fn store_v4_volatile(p: *mut [u32; 4], v: [u32; 4]) {
    if sim_faults::hold_packet(p as usize, v) {
        return; // delivered after this thread's next packet, or before its next other operation
    }
    let overtaken = sim_faults::take_held(); // stored after this one
    maybe_yield();
    if sim_faults::proceed(Kind::Packet) {
        store_v4_now(p, v);
    }
    if let Some((q, w)) = overtaken {
        store_v4_now(q as *mut [u32; 4], w);
        sim_faults::note_overtaken();
    }
}

/// Delivers the LL packet this thread holds back under `sim_faults::Fault::ReorderPackets`, if
/// any: before the thread's next other operation, and when its body ends.
fn deliver_held() {
    if let Some((p, v)) = sim_faults::take_held() {
        // SAFETY: the address and value of a packet store the device code issued, held back.
        unsafe { store_v4_now(p as *mut [u32; 4], v) };
    }
    for (p, v) in sim_faults::take_held_stores().0 {
        // SAFETY: the address and value of a plain store the device code issued, held back.
        unsafe { AtomicU32::from_ptr(p as *mut u32).store(v, Ordering::Relaxed) };
    }
}

/// The 16-byte store itself (also how a held packet is delivered).
unsafe fn store_v4_now(p: *mut [u32; 4], v: [u32; 4]) {
    let w = p as *mut u32;
    for (i, x) in v.iter().enumerate() {
        AtomicU32::from_ptr(w.add(i)).store(*x, Ordering::Release);
    }
}

pub unsafe fn load_v4_volatile(p: *const [u32; 4]) -> [u32; 4] {
    maybe_yield();
    let w = p as *mut u32;
    let mut out = [0u32; 4];
    for i in (0..4).rev() {
        out[i] = AtomicU32::from_ptr(w.add(i)).load(Ordering::Acquire);
    }
    out
}

pub unsafe fn load_v4(p: *const [u32; 4]) -> [u32; 4] {
    let w = p as *mut u32;
    let mut out = [0u32; 4];
    for (i, o) in out.iter_mut().enumerate() {
        *o = AtomicU32::from_ptr(w.add(i)).load(Ordering::Relaxed);
    }
    out
}

pub unsafe fn store_v4(p: *mut [u32; 4], v: [u32; 4]) {
    let w = p as *mut u32;
    for (i, x) in v.iter().enumerate() {
        AtomicU32::from_ptr(w.add(i)).store(*x, Ordering::Relaxed);
    }
}

pub fn fence_system() {
    maybe_yield();
    core::sync::atomic::fence(Ordering::SeqCst)
}

/// No bulk asynchronous copies in the simulator: nothing to wait for.
pub fn bulk_stores_complete() {}

/// No async proxy in the simulator: its loads are ordered by the fences around them.
pub fn fence_proxy_async() {}

pub fn fence_gpu() {
    deliver_held();
    core::sync::atomic::fence(Ordering::SeqCst)
}

/// Lets other simulated threads run while one spins (the host has far fewer cores than threads).
pub fn spin_pause() {
    super::sim_net::progress(); // a thread that waits lets its own puts land
    std::thread::yield_now()
}

/// CTA barrier with an OR over the threads' predicates (`bar.red.or.pred` on the GPU).
pub fn sync_threads_or(pred: bool) -> bool {
    // One barrier phase that ORs the predicates, as `bar.red.or.pred` is one.
    super::sim_net::progress();
    maybe_yield();
    // SAFETY: the barrier outlives every simulated thread (see `sync_threads`).
    let b = unsafe { &*hw().barrier };
    b.arrive(pred)
}

pub unsafe fn load_u16(p: *const u16) -> u16 {
    core::sync::atomic::AtomicU16::from_ptr(p as *mut u16).load(Ordering::Relaxed)
}

pub unsafe fn store_u16(p: *mut u16, v: u16) {
    core::sync::atomic::AtomicU16::from_ptr(p).store(v, Ordering::Relaxed)
}

pub unsafe fn load_u32(p: *const u32) -> u32 {
    deliver_held(); // a thread reads its own stores (only ever held under sim_faults)
    AtomicU32::from_ptr(p as *mut u32).load(Ordering::Relaxed)
}

pub unsafe fn store_u32(p: *mut u32, v: u32) {
    if sim_faults::hold_store(p as usize, v) {
        return; // stored after this thread's next relaxed flag store, or before its next other operation
    }
    AtomicU32::from_ptr(p).store(v, Ordering::Relaxed)
}

pub unsafe fn load_u8(p: *const u8) -> u8 {
    core::sync::atomic::AtomicU8::from_ptr(p as *mut u8).load(Ordering::Relaxed)
}

pub unsafe fn store_u8(p: *mut u8, v: u8) {
    core::sync::atomic::AtomicU8::from_ptr(p).store(v, Ordering::Relaxed)
}

/// f16 bits -> f32, exact (as `cvt.f32.f16`).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    match exp {
        0 => {
            // Zero or subnormal: man * 2^-24, exact in f32.
            let v = man as f32 * (1.0 / 16_777_216.0);
            f32::from_bits(v.to_bits() | sign)
        }
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (man << 13)),
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
    }
}

/// f32 -> f16 bits, round to nearest even (as `cvt.rn.f16.f32`).
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 112; // f16 biased exponent
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1; // a carry into the exponent is the correct rounding (up to infinity)
    }
    sign | r as u16
}

/// f32 -> bf16 bits, round to nearest even (as `cvt.rn.bf16.f32`; NaN stays a quiet NaN).
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let lsb = (b >> 16) & 1;
    (b.wrapping_add(0x7fff + lsb) >> 16) as u16
}

/// See the nvptx version: the same value, re-read.
pub fn thread_rank_fresh() -> u32 {
    hw().tid
}
