//! Fault injection for the CPU simulator (tests only): what the interconnect could do to the
//! stores that carry synchronization, so a test can show each protocol answers it with `TIMEOUT`
//! or with the right result, never with a wrong one.
//!
//! Five kinds of operation are counted over all simulated threads of the process: flag stores
//! (`store_release_*`, `store_relaxed_u32`), flag adds (`atomic_add_*`, `red_add_*`), LL
//! packets (`store_v4_volatile`), and the data and signal of remote puts (`sim_net`). A plan (`set`) drops the n-th of a kind, delays every one of a
//! kind, or lets each LL packet be overtaken by the same thread's next packet (it is stored after
//! it; any other operation of the thread delivers a held packet first, so release ordering is
//! kept; `host/memory.rs` delivers held packets). `ReorderStores` does to plain 32-bit data stores
//! (`store_u32`) what the GPU's weak memory model allows: a later relaxed flag store of the same
//! thread (`store_relaxed_u32`) becomes visible first, the data `delay_us` later; a release
//! store, fence, acquire or other flag operation delivers held data first, as release ordering
//! requires (device/tests/tutorial_ordering.rs). One plan per process: tests that use it hold
//! `serial()` and run alone.

extern crate std;

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::cell::{Cell, RefCell};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use std::vec::Vec;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    FlagStore,
    FlagAdd,
    Packet,
    /// The data of a remote put-with-signal, when the simulated network delivers it
    /// (`sim_net`); delays apply, drops do not (a network does not lose data silently).
    RemotePut,
    /// The signal of a remote put-with-signal.
    RemoteSignal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The `nth` (0-based) operation of `kind` is not performed.
    Drop { kind: Kind, nth: u64 },
    /// Every operation of `kind` waits a pseudo-random 0..`max_us` microseconds first.
    Delay { kind: Kind, max_us: u64 },
    /// Each LL packet is stored after the same thread's next packet (or before its next other
    /// operation).
    ReorderPackets,
    /// Each plain 32-bit store is held until the same thread's next relaxed flag store has been
    /// performed, then stored `delay_us` later; any other flag operation, fence or plain 32-bit
    /// load of the thread delivers held stores first.
    ReorderStores { delay_us: u64 },
    /// The simulated network (`sim_net`) delivers each thread's puts in flight newest first.
    ReorderRemote,
    /// As `ReorderRemote`, and each put with data lands a pseudo-random 0..`max_us` microseconds
    /// late (a signal alone at once): a signal that overtakes data shows.
    ReorderRemoteLate { max_us: u64 },
}

static ON: AtomicBool = AtomicBool::new(false);
static PLAN: Mutex<Option<Fault>> = Mutex::new(None);
static COUNT: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
static SERIAL: Mutex<()> = Mutex::new(());
static OVERTAKEN: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// A packet this thread holds back under `ReorderPackets`: (address, value).
    static HELD: Cell<Option<(usize, [u32; 4])>> = const { Cell::new(None) };
    /// Plain stores this thread holds back under `ReorderStores`: (address, value), in order.
    static HELD_STORES: RefCell<Vec<(usize, u32)>> = const { RefCell::new(Vec::new()) };
    static RNG: Cell<u64> = const { Cell::new(0x9e37_79b9_7f4a_7c15) };
}

/// Holds off other fault tests of the process while the guard lives.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs `plan` (None: no faults) and resets the counters.
pub fn set(plan: Option<Fault>) {
    for c in &COUNT {
        c.store(0, Ordering::SeqCst);
    }
    OVERTAKEN.store(0, Ordering::SeqCst);
    *PLAN.lock().unwrap_or_else(|e| e.into_inner()) = plan;
    ON.store(plan.is_some(), Ordering::SeqCst);
}

/// Operations of `kind` counted since `set`.
pub fn count(kind: Kind) -> u64 {
    COUNT[kind as usize].load(Ordering::SeqCst)
}

/// Packets stored after a later packet of their thread since `set` (under `ReorderPackets`).
pub fn overtaken() -> u64 {
    OVERTAKEN.load(Ordering::SeqCst)
}

/// Notes that a held packet was delivered after a later one.
pub(super) fn note_overtaken() {
    OVERTAKEN.fetch_add(1, Ordering::SeqCst);
}

/// Called before an operation of `kind`: false when it must be dropped (after any delay).
#[inline]
pub(super) fn proceed(kind: Kind) -> bool {
    if !ON.load(Ordering::Relaxed) {
        return true;
    }
    let n = COUNT[kind as usize].fetch_add(1, Ordering::SeqCst);
    match *PLAN.lock().unwrap_or_else(|e| e.into_inner()) {
        Some(Fault::Drop { kind: k, nth }) if k == kind => n != nth,
        Some(Fault::Delay { kind: k, max_us }) if k == kind => {
            sleep_up_to(max_us);
            true
        }
        _ => true,
    }
}

/// Sleeps a pseudo-random 0..=`max_us` microseconds.
fn sleep_up_to(max_us: u64) {
    let r = RNG.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    });
    std::thread::sleep(Duration::from_micros(r % (max_us + 1)));
}

/// Under `ReorderRemoteLate`: called before a put's data lands, waits its random lateness.
#[inline]
pub(super) fn late_data() {
    if let Some(Fault::ReorderRemoteLate { max_us }) =
        ON.load(Ordering::Relaxed).then(plan).flatten()
    {
        sleep_up_to(max_us);
    }
}

/// Under `ReorderPackets`: holds `v` for `p` if nothing is held (true: the caller stores nothing
/// now); otherwise the caller stores `v` and then the held packet is delivered.
#[inline]
pub(super) fn hold_packet(p: usize, v: [u32; 4]) -> bool {
    if !ON.load(Ordering::Relaxed)
        || *PLAN.lock().unwrap_or_else(|e| e.into_inner()) != Some(Fault::ReorderPackets)
    {
        return false;
    }
    HELD.with(|h| match h.get() {
        None => {
            h.set(Some((p, v)));
            true
        }
        Some(_) => false,
    })
}

/// Takes the packet this thread holds, if any (for the caller to deliver after its own).
#[inline]
pub(super) fn take_held() -> Option<(usize, [u32; 4])> {
    if !ON.load(Ordering::Relaxed) {
        return None;
    }
    HELD.with(|h| h.take())
}

/// Under `ReorderStores`: holds the plain store of `v` to `p` (true: the caller stores nothing now).
#[inline]
pub(super) fn hold_store(p: usize, v: u32) -> bool {
    if !ON.load(Ordering::Relaxed) || !matches!(plan(), Some(Fault::ReorderStores { .. })) {
        return false;
    }
    HELD_STORES.with(|h| h.borrow_mut().push((p, v)));
    true
}

/// Takes the plain stores this thread holds, and how long after an overtaking flag store they
/// land (empty when none are held).
#[inline]
pub(super) fn take_held_stores() -> (Vec<(usize, u32)>, Duration) {
    if !ON.load(Ordering::Relaxed) {
        return (Vec::new(), Duration::ZERO);
    }
    let delay = match plan() {
        Some(Fault::ReorderStores { delay_us }) => Duration::from_micros(delay_us),
        _ => Duration::ZERO,
    };
    (
        HELD_STORES.with(|h| core::mem::take(&mut *h.borrow_mut())),
        delay,
    )
}

/// Under `ReorderRemote` or `ReorderRemoteLate`: whether the network delivers each outbox newest
/// first.
#[inline]
pub(super) fn reorder_remote() -> bool {
    ON.load(Ordering::Relaxed)
        && matches!(
            plan(),
            Some(Fault::ReorderRemote | Fault::ReorderRemoteLate { .. })
        )
}

fn plan() -> Option<Fault> {
    *PLAN.lock().unwrap_or_else(|e| e.into_inner())
}
