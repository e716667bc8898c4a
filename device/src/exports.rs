//! The exported device functions: the whole C ABI of the bitcode library.
//!
//! Every function is called by every thread of the CTA (Triton's scalar extern semantics) and is
//! CTA-cooperative: it elects threads and synchronizes by itself. Status-returning functions give
//! 0 on success and a negative `abi::status` code otherwise.

use crate::abi::{status, ABI_VERSION};
use crate::ctx;

/// Packs a status into an i64 return: a valid value is >= 0; an error is the negative status.
#[inline(always)]
fn or_status(r: Result<u64, i32>) -> i64 {
    match r {
        Ok(v) => v as i64,
        Err(e) => e as i64,
    }
}

exports! {
    /// ABI version of this library (`abi::ABI_VERSION`); `unused` is ignored (Triton needs an argument).
    fn ironlink_abi_version(unused: i32) -> i32 {
        let _ = unused;
        ABI_VERSION as i32
    }

    /// This process's rank in the context's group, or a negative status.
    fn symm_rank(ctx: i64) -> i32 {
        match ctx::context(ctx) {
            Ok(c) => c.rank,
            Err(e) => e,
        }
    }

    /// Number of ranks in the context's group, or a negative status.
    fn symm_world_size(ctx: i64) -> i32 {
        match ctx::context(ctx) {
            Ok(c) => c.world_size,
            Err(e) => e,
        }
    }

    /// The address of the same byte as `ptr` in `peer`'s copy of the symmetric heap.
    /// Returns 0 when `ptr` is not inside the local heap, `peer` is out of range or the context is bad.
    fn symm_peer_ptr(ctx: i64, ptr: i64, peer: i32) -> i64 {
        let r = ctx::context(ctx).and_then(|c| ctx::peer_address(c, ptr as u64, 0, peer));
        match r {
            Ok(a) => a as i64,
            Err(_) => 0,
        }
    }

    /// The first error a device function recorded in the context (0 if none), or a negative status
    /// for a bad context. The host clears it; kernels may read it to bail out early.
    fn symm_last_error(ctx: i64) -> i32 {
        match ctx::context(ctx) {
            Ok(c) => c.error,
            Err(e) => e,
        }
    }

    /// Like `symm_peer_ptr`, but returns the negative status instead of 0 on failure
    /// (`OUT_OF_BOUNDS` when `[ptr, ptr + nbytes)` leaves the heap, `INVALID_ARGUMENT` for a bad peer).
    fn symm_peer_ptr_checked(ctx: i64, ptr: i64, nbytes: i64, peer: i32) -> i64 {
        if nbytes < 0 {
            return status::INVALID_ARGUMENT as i64;
        }
        or_status(ctx::context(ctx).and_then(|c| ctx::peer_address(c, ptr as u64, nbytes as u64, peer)))
    }
}
