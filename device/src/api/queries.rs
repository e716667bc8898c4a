//! The exported queries of the context: the ABI version, rank, world size, peer addresses and
//! the recorded error.

use crate::abi::{status, ABI_VERSION};
use crate::runtime::context as ctx;

exports! {
    /// ABI version of this library (`abi::ABI_VERSION`); `unused` is ignored (Triton needs an argument).
    fn ironlink_abi_version(unused: i32) -> i32 {
        let _ = unused;
        ABI_VERSION as i32
    }

    /// This process's rank in the context's group, or a negative status.
    fn symm_rank(ctx: i64) -> i32 {
        match ctx::any_context(ctx) {
            Ok(c) => c.rank,
            Err(e) => e,
        }
    }

    /// Number of ranks in the context's group, or a negative status.
    fn symm_world_size(ctx: i64) -> i32 {
        match ctx::any_context(ctx) {
            Ok(c) => c.world_size,
            Err(e) => e,
        }
    }

    /// The address of the same byte as `ptr` in `peer`'s copy of the symmetric heap.
    /// Returns 0 when `ptr` is not inside the local heap, `peer` is out of range or on another
    /// node, or the context is bad.
    fn symm_peer_ptr(ctx: i64, ptr: i64, peer: i32) -> i64 {
        let r = ctx::any_context(ctx).and_then(|c| ctx::peer_address(c, ptr as u64, 0, peer));
        match r {
            Ok(a) => a as i64,
            Err(_) => 0,
        }
    }

    /// Like `symm_peer_ptr`, but returns the negative status instead of 0 on failure
    /// (`OUT_OF_BOUNDS` when `[ptr, ptr + nbytes)` leaves the heap, `INVALID_ARGUMENT` for a bad peer,
    /// `PEER_NOT_MAPPED` for a peer on another node).
    fn symm_peer_ptr_checked(ctx: i64, ptr: i64, nbytes: i64, peer: i32) -> i64 {
        if nbytes < 0 {
            return status::INVALID_ARGUMENT as i64;
        }
        match ctx::any_context(ctx).and_then(|c| ctx::peer_address(c, ptr as u64, nbytes as u64, peer)) {
            Ok(a) => a as i64,
            Err(e) => e as i64,
        }
    }

    /// The first error a device function recorded in the context (0 if none), or a negative
    /// status for a bad context. The host clears it.
    fn symm_last_error(ctx: i64) -> i32 {
        match ctx::any_context(ctx) {
            Ok(c) => c.error,
            Err(e) => e,
        }
    }
}
