//! The simulator's network (`hw::remote` on the host): one-sided puts to ranks on other
//! simulated nodes that land later than they are issued.
//!
//! A put-with-signal goes into its issuing thread's outbox and is performed (the data copied from
//! the source as it is then, then the signal stored with release) when that thread next makes
//! progress: in `quiet`, in a spin of a wait (`spin_pause`), at a CTA barrier, or when its body
//! ends. So a receiver that reads before waiting for the signal sees old data, and a sender that
//! overwrites a source before `quiet` sends the new data. `sim_faults` can delay every delivery
//! (`Delay { kind: RemotePut }`), drop the n-th signal (`Drop { kind: RemoteSignal }`: the
//! waiting rank gets TIMEOUT) or deliver each outbox newest first (`ReorderRemote`).
//!
//! Target addresses: the simulator maps every rank's regions, so the network translates the
//! issuer's symmetric address to the same byte of the target's region, as NVSHMEM does with its
//! symmetric heap.

extern crate std;

use super::sim_faults::{self, Kind};
use crate::abi::{status, SymmContext};
use core::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::cell::RefCell;
use std::vec::Vec;

/// One put-with-signal in flight: target addresses, already translated.
#[derive(Clone, Copy)]
struct Put {
    dst: usize,
    src: usize,
    bytes: usize,
    sig: usize,
    value: u64,
}

std::thread_local! {
    static OUTBOX: RefCell<Vec<Put>> = const { RefCell::new(Vec::new()) };
}

/// The same byte as this rank's symmetric `addr` on rank `pe`, or None when `addr` is in none of
/// this rank's regions or `pe` has no address for that region.
fn translate(c: &SymmContext, addr: usize, pe: usize) -> Option<usize> {
    let me = c.rank as usize;
    let regions = [
        (c.peer_heap, c.heap_size),
        (c.peer_signal, c.signal_size),
        (c.peer_scratch, c.scratch_size),
    ];
    regions.iter().find_map(|(bases, size)| {
        let base = bases[me] as usize;
        let inside = base != 0 && addr >= base && addr - base < *size as usize;
        (inside && bases[pe] != 0).then(|| bases[pe] as usize + (addr - base))
    })
}

/// Whether this build can reach `pe`: OK, or PEER_NOT_MAPPED when the simulated node left its
/// regions out of the context (every thread of the CTA returns what the issuing thread does).
pub(super) fn check(c: &SymmContext, pe: usize) -> i32 {
    let reachable = c.peer_heap[pe] != 0 && c.peer_signal[pe] != 0;
    if reachable {
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
    sig: usize,
    value: u64,
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
            AtomicU64::from_ptr(p.sig as *mut u64).store(p.value, Ordering::Release);
        }
    }
}
