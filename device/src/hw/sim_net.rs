//! The simulator's network (`hw::remote` on the host): one-sided puts to ranks on other
//! simulated nodes that land later than they are issued.
//!
//! A put-with-signal goes into its issuing thread's outbox and is performed (the data copied from
//! the source as it is then, then the signal stored with release) when that thread next makes
//! progress: in `quiet`, in a spin of a wait (`spin_pause`), at a CTA barrier, or when its body
//! ends. So a receiver that reads before waiting for the signal sees old data, and a sender that
//! overwrites a source before `quiet` sends the new data. `sim_faults` can delay every delivery
//! (`Delay { kind: RemotePut }`), drop the n-th signal (`Drop { kind: RemoteSignal }`: the
//! waiting rank gets TIMEOUT) or deliver each outbox newest first (`ReorderRemote`; with data
//! landing late, `ReorderRemoteLate`).
//!
//! Target addresses: a context's peer tables hold its own node only, so each simulated world
//! registers every rank's regions here (`attach`, by `sim::Node`); the network translates the
//! issuer's symmetric address to the same byte of the target's region, as NVSHMEM does with its
//! symmetric heap.

extern crate std;

use super::sim_faults::{self, Kind};
use crate::abi::{status, SymmContext};
use core::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::cell::RefCell;
use std::sync::Mutex;
use std::vec::Vec;

/// One rank's regions: (base, bytes) of its heap, signal and scratch regions.
pub type Regions = [(usize, usize); 3];

/// Every attached world: each rank's regions, by rank.
static WORLDS: Mutex<Vec<Vec<Regions>>> = Mutex::new(Vec::new());

/// Makes the ranks of one simulated world reachable through the network (until `detach`).
pub fn attach(ranks: Vec<Regions>) {
    WORLDS.lock().unwrap().push(ranks);
}

/// Forgets the world whose rank 0 has the heap at `heap0`.
pub fn detach(heap0: usize) {
    WORLDS.lock().unwrap().retain(|w| w[0][0].0 != heap0);
}

/// The regions of rank `pe` in the world of the issuer `c`, if attached.
fn regions_of(c: &SymmContext, pe: usize) -> Option<(Regions, Regions)> {
    let me = c.rank as usize;
    let worlds = WORLDS.lock().unwrap();
    let w = worlds
        .iter()
        .find(|w| w.get(me).is_some_and(|r| r[0].0 == c.heap_base(me)))?;
    Some((w[me], *w.get(pe)?))
}

/// One put-with-signal in flight: target addresses, already translated.
#[derive(Clone, Copy)]
struct Put {
    dst: usize,
    src: usize,
    bytes: usize,
    sig: usize,
    value: u64,
    /// Add `value` to the signal word rather than set it.
    add: bool,
}

std::thread_local! {
    static OUTBOX: RefCell<Vec<Put>> = const { RefCell::new(Vec::new()) };
}

/// The same byte as this rank's symmetric `addr` on rank `pe`, or None when `addr` is in none of
/// this rank's regions or `pe` is not a rank of the issuer's attached world.
fn translate(c: &SymmContext, addr: usize, pe: usize) -> Option<usize> {
    let (mine, theirs) = regions_of(c, pe)?;
    (0..3).find_map(|k| {
        let (base, size) = mine[k];
        let inside = base != 0 && addr >= base && addr - base < size;
        (inside && theirs[k].0 != 0).then(|| theirs[k].0 + (addr - base))
    })
}

/// Whether the network reaches `pe`: OK, or PEER_NOT_MAPPED when the issuer's world is not
/// attached or has no rank `pe` (every thread of the CTA returns what the issuing thread does).
pub(super) fn check(c: &SymmContext, pe: usize) -> i32 {
    if regions_of(c, pe).is_some() {
        status::OK
    } else {
        status::PEER_NOT_MAPPED
    }
}

/// Queues a put-with-signal (see `hw::remote::put_signal_nbi`).
pub(super) fn put_signal(
    c: &SymmContext,
    dst: usize,
    src: usize,
    bytes: usize,
    (sig, value, add): (usize, u64, bool),
    pe: usize,
) -> i32 {
    let s = check(c, pe);
    if s != status::OK {
        return s;
    }
    let to = |a: usize| translate(c, a, pe).expect("remote put outside the symmetric regions");
    let put = Put {
        dst: to(dst),
        src,
        bytes,
        sig: to(sig),
        value,
        add,
    };
    assert!(
        bytes == 0 || translate(c, dst + bytes - 1, pe) == Some(put.dst + bytes - 1),
        "remote put leaves its region"
    );
    OUTBOX.with(|o| o.borrow_mut().push(put));
    status::OK
}

/// Performs every put this thread has in flight (in issue order, or newest first under
/// `ReorderRemote`).
pub fn progress() {
    let mut puts = OUTBOX.with(|o| core::mem::take(&mut *o.borrow_mut()));
    if puts.is_empty() {
        return;
    }
    if sim_faults::reorder_remote() {
        puts.reverse();
    }
    for p in puts {
        deliver(p);
    }
}

fn deliver(p: Put) {
    if p.bytes > 0 {
        sim_faults::late_data();
    }
    sim_faults::proceed(Kind::RemotePut); // a delay, if any (data is never dropped: no network loses data silently)
                                          // SAFETY: both ranges were checked inside symmetric regions of live ranks when issued; the
                                          // simulated memory outlives the launch, whose threads deliver before they end.
    unsafe {
        if (p.dst | p.src | p.bytes).is_multiple_of(4) {
            for i in (0..p.bytes).step_by(4) {
                let v = AtomicU32::from_ptr((p.src + i) as *mut u32).load(Ordering::Relaxed);
                AtomicU32::from_ptr((p.dst + i) as *mut u32).store(v, Ordering::Relaxed);
            }
        } else {
            for i in 0..p.bytes {
                let v = AtomicU8::from_ptr((p.src + i) as *mut u8).load(Ordering::Relaxed);
                AtomicU8::from_ptr((p.dst + i) as *mut u8).store(v, Ordering::Relaxed);
            }
        }
        fence(Ordering::Release);
        if sim_faults::proceed(Kind::RemoteSignal) {
            let sig = AtomicU64::from_ptr(p.sig as *mut u64);
            if p.add {
                sig.fetch_add(p.value, Ordering::Release);
            } else {
                sig.store(p.value, Ordering::Release);
            }
        }
    }
}
