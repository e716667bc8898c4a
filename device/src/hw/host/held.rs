//! The stores `sim_faults` holds back to reorder them, delivered: before the thread's next other
//! operation (`threads::maybe_yield`, a load of its own), and when its body ends.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::hw::sim_faults;

/// Delivers the LL packet this thread holds back under `sim_faults::Fault::ReorderPackets`, if
/// any: before the thread's next other operation, and when its body ends.
pub(super) fn deliver_held() {
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
pub(super) unsafe fn store_v4_now(p: *mut [u32; 4], v: [u32; 4]) {
    let w = p as *mut u32;
    for (i, x) in v.iter().enumerate() {
        AtomicU32::from_ptr(w.add(i)).store(*x, Ordering::Release);
    }
}
