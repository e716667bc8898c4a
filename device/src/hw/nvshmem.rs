//! NVSHMEM's device functions, declared for the NVSHMEM bitcode (`--cfg ironlink_nvshmem`, see the
//! Makefile's `nvshmem` target). They stay undefined in ironlink's bitcode: Triton links
//! `libnvshmem_device.bc` after it (`@ironlink.jit(nvshmem=True)`), which defines them. The P2P
//! bitcode is built without this module, so it never references NVSHMEM.
//!
//! Prototypes as in NVSHMEM 3.4's `host/nvshmem_api.h` / `nvshmemx_api.h` (C types: `size_t` is
//! usize, `int` i32, `uint64_t` u64; every pointer is a generic address). The constants are
//! NVSHMEM's own (`nvshmem_common_transport.h`, `nvshmem_constants.h`), which differ from
//! ironlink's `abi::signal_op` and `abi::cmp` codes: callers map one to the other.
//!
//! Safety contract of every function here: NVSHMEM's device state in this module was set up by
//! `nvshmemx_cumodule_init` (the Python side does it when the module is loaded), and symmetric
//! addresses are local addresses of objects in the NVSHMEM symmetric heap.

use core::ffi::c_void;

/// `NVSHMEM_SIGNAL_SET` / `NVSHMEM_SIGNAL_ADD` (`nvshmemx_signal_op_t`).
pub const NVSHMEM_SIGNAL_SET: i32 = 9;
pub const NVSHMEM_SIGNAL_ADD: i32 = 10;

/// `nvshmem_cmp_type`: EQ, NE, GT, LE, LT, GE in this order from 0.
pub const NVSHMEM_CMP_EQ: i32 = 0;
pub const NVSHMEM_CMP_NE: i32 = 1;
pub const NVSHMEM_CMP_GT: i32 = 2;
pub const NVSHMEM_CMP_LE: i32 = 3;
pub const NVSHMEM_CMP_LT: i32 = 4;
pub const NVSHMEM_CMP_GE: i32 = 5;

extern "C" {
    /// Block-collective put of `nelems` bytes to `pe`, then the signal update, without waiting
    /// for completion (`nvshmem_quiet` waits). Every thread of the CTA calls it with the same
    /// arguments.
    fn nvshmemx_putmem_signal_nbi_block(
        dest: *mut c_void,
        source: *const c_void,
        nelems: usize,
        sig_addr: *mut u64,
        signal: u64,
        sig_op: i32,
        pe: i32,
    );
    /// Waits until `*sig_addr cmp cmp_val` holds; returns the value that satisfied it.
    fn nvshmem_signal_wait_until(sig_addr: *mut u64, cmp: i32, cmp_val: u64) -> u64;
    /// Completes this thread's outstanding puts and signals (visible at their targets).
    fn nvshmem_quiet();
    /// `ptr`'s counterpart on `pe` if this GPU can load and store it, else null.
    fn nvshmem_ptr(ptr: *const c_void, pe: i32) -> *mut c_void;
    fn nvshmem_my_pe() -> i32;
    fn nvshmem_n_pes() -> i32;
}

/// See `nvshmemx_putmem_signal_nbi_block` above.
///
/// # Safety
/// All threads of the CTA call it with the same arguments; `dest` and `sig_addr` are symmetric,
/// `[source, source + nbytes)` is readable, `pe` is a valid PE and `sig_op` an NVSHMEM code.
#[inline(always)]
pub unsafe fn put_signal_nbi_block(
    dest: usize,
    source: usize,
    nbytes: usize,
    sig_addr: usize,
    signal: u64,
    sig_op: i32,
    pe: i32,
) {
    nvshmemx_putmem_signal_nbi_block(
        dest as *mut c_void,
        source as *const c_void,
        nbytes,
        sig_addr as *mut u64,
        signal,
        sig_op,
        pe,
    )
}

/// # Safety
/// `sig_addr` is a symmetric, 8-byte aligned u64; `cmp` an NVSHMEM code.
#[inline(always)]
pub unsafe fn signal_wait_until(sig_addr: usize, cmp: i32, value: u64) -> u64 {
    nvshmem_signal_wait_until(sig_addr as *mut u64, cmp, value)
}

#[inline(always)]
pub fn quiet() {
    // SAFETY: no arguments; needs only the module's NVSHMEM state (this file's contract).
    unsafe { nvshmem_quiet() }
}

/// # Safety
/// `pe` is a valid PE (NVSHMEM indexes its peer table with it).
#[inline(always)]
pub unsafe fn ptr(p: usize, pe: i32) -> usize {
    nvshmem_ptr(p as *const c_void, pe) as usize
}

#[inline(always)]
pub fn my_pe() -> i32 {
    // SAFETY: reads the module's NVSHMEM state (this file's contract).
    unsafe { nvshmem_my_pe() }
}

#[inline(always)]
pub fn n_pes() -> i32 {
    // SAFETY: as `my_pe`.
    unsafe { nvshmem_n_pes() }
}
