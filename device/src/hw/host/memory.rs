//! The memory operations, mirroring nvptx.rs: every access a std atomic, so concurrent access
//! between simulated threads and ranks is defined behaviour; `sim_faults` drops, delays or
//! reorders the synchronizing ones for the fault-injection tests.

extern crate std;

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::held::{deliver_held, store_v4_now};
use super::threads::maybe_yield;
use crate::hw::sim_faults::{self, Kind};

// SeqCst where the device uses acquire/release is a strengthening (hw/host/mod.rs says what
// that hides).

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
