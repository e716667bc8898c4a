//! nvptx implementation of the hardware layer: intrinsics and inline PTX, one instruction each.
//!
//! Safety contract shared by every pointer-taking function here: the caller passes an address
//! that is valid, mapped in this process (local or peer memory) and aligned to the access size.

use core::arch::asm;
use core::arch::nvptx;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[inline(always)]
pub fn thread_idx() -> (u32, u32, u32) {
    // SAFETY: reading special registers has no preconditions.
    unsafe {
        (
            nvptx::_thread_idx_x() as u32,
            nvptx::_thread_idx_y() as u32,
            nvptx::_thread_idx_z() as u32,
        )
    }
}

#[inline(always)]
pub fn block_dim() -> (u32, u32, u32) {
    // SAFETY: reading special registers has no preconditions.
    unsafe {
        (
            nvptx::_block_dim_x() as u32,
            nvptx::_block_dim_y() as u32,
            nvptx::_block_dim_z() as u32,
        )
    }
}

#[inline(always)]
pub fn block_idx() -> (u32, u32, u32) {
    // SAFETY: reading special registers has no preconditions.
    unsafe {
        (
            nvptx::_block_idx_x() as u32,
            nvptx::_block_idx_y() as u32,
            nvptx::_block_idx_z() as u32,
        )
    }
}

#[inline(always)]
pub fn grid_dim() -> (u32, u32, u32) {
    // SAFETY: reading special registers has no preconditions.
    unsafe {
        (
            nvptx::_grid_dim_x() as u32,
            nvptx::_grid_dim_y() as u32,
            nvptx::_grid_dim_z() as u32,
        )
    }
}

/// CTA barrier (`bar.sync 0`). Every thread of the CTA must reach it: device functions are
/// called by all threads of the CTA (Triton's scalar extern semantics).
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: all threads of the CTA execute every exported function, so all reach this barrier.
    unsafe { nvptx::_syncthreads() }
}

/// Nanoseconds of the global timer (`%globaltimer`), for timeouts.
#[inline(always)]
pub fn now_ns() -> u64 {
    let t: u64;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nomem, nostack)) };
    t
}

#[inline(always)]
pub unsafe fn load_acquire_u32(p: *const u32) -> u32 {
    AtomicU32::from_ptr(p as *mut u32).load(Ordering::Acquire)
}

#[inline(always)]
pub unsafe fn load_relaxed_u32(p: *const u32) -> u32 {
    AtomicU32::from_ptr(p as *mut u32).load(Ordering::Relaxed)
}

#[inline(always)]
pub unsafe fn store_release_u32(p: *mut u32, v: u32) {
    AtomicU32::from_ptr(p).store(v, Ordering::Release)
}

#[inline(always)]
pub unsafe fn store_relaxed_u32(p: *mut u32, v: u32) {
    AtomicU32::from_ptr(p).store(v, Ordering::Relaxed)
}

#[inline(always)]
pub unsafe fn store_relaxed_u64(p: *mut u64, v: u64) {
    AtomicU64::from_ptr(p).store(v, Ordering::Relaxed)
}

#[inline(always)]
pub unsafe fn load_relaxed_u64(p: *const u64) -> u64 {
    AtomicU64::from_ptr(p as *mut u64).load(Ordering::Relaxed)
}

#[inline(always)]
pub unsafe fn load_acquire_u64(p: *const u64) -> u64 {
    AtomicU64::from_ptr(p as *mut u64).load(Ordering::Acquire)
}

#[inline(always)]
pub unsafe fn store_release_u64(p: *mut u64, v: u64) {
    AtomicU64::from_ptr(p).store(v, Ordering::Release)
}

// The read-modify-write adds are written out in PTX: LLVM's NVPTX backend (Rust's, and the one
// Triton links with) lowers `atomicrmw add` to a bare `atom.add` (relaxed, GPU scope), dropping
// the ordering; a flag added that way can reach a peer before the data it announces.

/// `atom.release.sys.add.u64`: adds `v`, after this thread's earlier accesses (cumulatively).
#[inline(always)]
pub unsafe fn atomic_add_release_u64(p: *mut u64, v: u64) -> u64 {
    let old: u64;
    asm!(
        "atom.release.sys.add.u64 {old}, [{p}], {v};",
        p = in(reg64) p, v = in(reg64) v, old = out(reg64) old,
        options(nostack)
    );
    old
}

/// `atom.acq_rel.sys.add.u32`: adds `v`, ordered after this thread's earlier accesses and before
/// its later ones.
#[inline(always)]
pub unsafe fn atomic_add_acq_rel_u32(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    asm!(
        "atom.acq_rel.sys.add.u32 {old}, [{p}], {v};",
        p = in(reg64) p, v = in(reg32) v, old = out(reg32) old,
        options(nostack)
    );
    old
}

/// `red.release.sys.add.u32`: adds `v` after this thread's earlier accesses (cumulatively), without
/// waiting for the result: to a peer's memory it is posted, not a round trip over NVLink.
#[inline(always)]
pub unsafe fn red_add_release_u32(p: *mut u32, v: u32) {
    asm!(
        "red.release.sys.add.u32 [{p}], {v};",
        p = in(reg64) p, v = in(reg32) v,
        options(nostack)
    );
}

/// `red.relaxed.sys.add.u32`: an atomic add with no ordering (e.g. taking a semaphore count that
/// an acquire load already synchronized with).
#[inline(always)]
pub unsafe fn red_add_relaxed_u32(p: *mut u32, v: u32) {
    asm!(
        "red.relaxed.sys.add.u32 [{p}], {v};",
        p = in(reg64) p, v = in(reg32) v,
        options(nostack)
    );
}

/// Number of SM identifiers of the GPU (`%nsmid`): at least the number of SMs.
#[inline(always)]
pub fn sm_count() -> u32 {
    let n: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {n}, %nsmid;", n = out(reg32) n, options(nomem, nostack)) };
    n
}

#[inline(always)]
pub unsafe fn atomic_cas_u32(p: *mut u32, current: u32, new: u32) -> u32 {
    match AtomicU32::from_ptr(p).compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(v) | Err(v) => v,
    }
}

/// 16-byte volatile load (`ld.volatile.global.v4.u32`): one transaction, never torn.
#[inline(always)]
pub unsafe fn load_v4_volatile(p: *const [u32; 4]) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    asm!(
        "ld.volatile.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
        p = in(reg64) p,
        a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
        options(nostack, readonly)
    );
    [a, b, c, d]
}

/// 16-byte volatile store (`st.volatile.global.v4.u32`): a peer sees all of it or none of it.
#[inline(always)]
pub unsafe fn store_v4_volatile(p: *mut [u32; 4], v: [u32; 4]) {
    asm!(
        "st.volatile.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
        p = in(reg64) p,
        a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
        options(nostack)
    );
}

/// Plain 16-byte load for bulk data (`ld.global.v4.u32`, L1 bypass not needed: data is read once).
#[inline(always)]
pub unsafe fn load_v4(p: *const [u32; 4]) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    asm!(
        "ld.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
        p = in(reg64) p,
        a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
        options(nostack, readonly, preserves_flags)
    );
    [a, b, c, d]
}

/// Plain 16-byte store for bulk data.
#[inline(always)]
pub unsafe fn store_v4(p: *mut [u32; 4], v: [u32; 4]) {
    asm!(
        "st.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
        p = in(reg64) p,
        a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
        options(nostack, preserves_flags)
    );
}

/// System-scope fence (`fence.sc.sys`): orders this thread's accesses to peers' memory.
#[inline(always)]
pub fn fence_system() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.sc.sys;", options(nostack)) }
}

/// Waits until this thread's bulk asynchronous copies (TMA stores, `cp.async.bulk`) have completed
/// their writes, and orders them before this thread's later generic accesses: a release after a
/// CTA barrier then covers the writes of a TMA store that any thread of the CTA issued. Before
/// sm_90 there are no bulk copies and nothing to wait for.
#[inline(always)]
pub fn bulk_stores_complete() {
    #[cfg(target_feature = "sm_90")]
    // SAFETY: waits on this thread's own bulk async-groups (none is fine); no operands.
    unsafe {
        asm!(
            "cp.async.bulk.wait_group 0;",
            "fence.proxy.async.global;",
            options(nostack)
        )
    }
}

/// Orders this thread's earlier generic accesses before later bulk asynchronous (TMA) accesses
/// of global memory (`fence.proxy.async.global`): after a wait, TMA loads see what the wait
/// announced. Before sm_90 there is no async proxy.
#[inline(always)]
pub fn fence_proxy_async() {
    #[cfg(target_feature = "sm_90")]
    // SAFETY: a fence has no operands.
    unsafe {
        asm!("fence.proxy.async.global;", options(nostack))
    }
}

/// GPU-scope fence (`fence.acq_rel.gpu`).
#[inline(always)]
pub fn fence_gpu() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) }
}

/// Hint to back off inside a spin loop (`nanosleep` exists from sm_70).
#[inline(always)]
pub fn spin_pause() {}

/// CTA barrier that also ORs a predicate over all threads (`bar.red.or.pred`): how a CTA agrees
/// that some thread saw a timeout without shared memory.
#[inline(always)]
pub fn sync_threads_or(pred: bool) -> bool {
    let r: u32;
    // SAFETY: all threads of the CTA reach every call site (see `sync_threads`).
    unsafe {
        asm!(
            "{{ .reg .pred %p_in, %p_out;",
            "setp.ne.u32 %p_in, {x}, 0;",
            "bar.red.or.pred %p_out, 0, %p_in;",
            "selp.u32 {r}, 1, 0, %p_out; }}",
            x = in(reg32) pred as u32,
            r = out(reg32) r,
            options(nostack)
        )
    };
    r != 0
}

#[inline(always)]
pub unsafe fn load_u16(p: *const u16) -> u16 {
    core::ptr::read_volatile(p)
}

#[inline(always)]
pub unsafe fn store_u16(p: *mut u16, v: u16) {
    core::ptr::write_volatile(p, v)
}

#[inline(always)]
pub unsafe fn load_u32(p: *const u32) -> u32 {
    core::ptr::read_volatile(p)
}

#[inline(always)]
pub unsafe fn store_u32(p: *mut u32, v: u32) {
    core::ptr::write_volatile(p, v)
}

#[inline(always)]
pub unsafe fn load_u8(p: *const u8) -> u8 {
    core::ptr::read_volatile(p)
}

#[inline(always)]
pub unsafe fn store_u8(p: *mut u8, v: u8) {
    core::ptr::write_volatile(p, v)
}

/// f16 bits -> f32 (`cvt.f32.f16`, exact).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let f: f32;
    // SAFETY: a register-only conversion.
    unsafe {
        asm!("cvt.f32.f16 {f}, {h};", f = out(reg32) f, h = in(reg16) h, options(pure, nomem, nostack))
    };
    f
}

/// f32 -> f16 bits, round to nearest even (`cvt.rn.f16.f32`).
#[inline(always)]
pub fn f32_to_f16(f: f32) -> u16 {
    let h: u16;
    // SAFETY: a register-only conversion.
    unsafe {
        asm!("cvt.rn.f16.f32 {h}, {f};", h = out(reg16) h, f = in(reg32) f, options(pure, nomem, nostack))
    };
    h
}

/// f32 -> bf16 bits, round to nearest even (`cvt.rn.bf16.f32`, sm_80+).
#[inline(always)]
pub fn f32_to_bf16(f: f32) -> u16 {
    let h: u16;
    // SAFETY: a register-only conversion.
    unsafe {
        asm!("cvt.rn.bf16.f32 {h}, {f};", h = out(reg16) h, f = in(reg32) f, options(pure, nomem, nostack))
    };
    h
}

/// `%tid.x` (+ y, z flattened) read by a volatile `mov`, so the compiler re-reads it instead of
/// keeping it, or a predicate computed from it, live across a long region: ptxas spills such a
/// long-lived predicate to local memory (seen in the barrier's `tid < world` test, CSE'd across
/// the two barriers of a collective).
#[inline(always)]
pub fn thread_rank_fresh() -> u32 {
    let (x, y, z): (u32, u32, u32);
    // SAFETY: reads special registers.
    unsafe {
        asm!("mov.u32 {x}, %tid.x;", "mov.u32 {y}, %tid.y;", "mov.u32 {z}, %tid.z;",
             x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, options(nomem, nostack))
    };
    let (nx, ny, _) = block_dim();
    x + nx * (y + ny * z)
}
