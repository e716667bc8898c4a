//! The shapes every exported function shares: a status from a result, the prologue of a
//! collective and of a tile call (context, arguments, then the call's epoch), and the checks of
//! one-sided copies and heap words.

use crate::abi::{status, SymmContext};
use crate::collectives::tile_shape::tile_index;
use crate::primitives;
use crate::runtime::context as ctx;
use crate::runtime::sync::Call;

pub(super) fn code(r: Result<(), i32>) -> i32 {
    match r {
        Ok(()) => status::OK,
        Err(e) => e,
    }
}

/// The shape shared by every collective: check the context, check the arguments (`prepare`,
/// which must not touch memory), then run `body` inside a call (epoch advanced, CTA synced).
/// A multi-node context gets UNSUPPORTED_OP from `ctx::context`'s backend check (a gate of its
/// own in this prologue, even two compares, made all_gather spill on sm_90/100).
#[inline(always)]
pub(super) fn collective<P>(
    ctx: i64,
    which: i32,
    prepare: impl FnOnce(&SymmContext) -> Result<P, i32>,
    body: impl FnOnce(&Call, P) -> Result<(), i32>,
) -> i32 {
    code(call_in(ctx::context(ctx), which, prepare, body))
}

/// `collective` for one with a multi-node version (`symm_*_hierarchical`): serves every context.
#[inline(always)]
pub(super) fn any_nodes_collective<P>(
    ctx: i64,
    which: i32,
    prepare: impl FnOnce(&SymmContext) -> Result<P, i32>,
    body: impl FnOnce(&Call, P) -> Result<(), i32>,
) -> i32 {
    code(call_in(ctx::any_context(ctx), which, prepare, body))
}

#[inline(always)]
pub(super) fn call_in<P>(
    c: Result<&SymmContext, i32>,
    which: i32,
    prepare: impl FnOnce(&SymmContext) -> Result<P, i32>,
    body: impl FnOnce(&Call, P) -> Result<(), i32>,
) -> Result<(), i32> {
    c.and_then(|c| {
        let p = prepare(c)?;
        // Timing diagnostic "call_checked" (never in a normal build; results wrong): every call
        // returns once its context and arguments are checked, before `Call::begin`.
        if cfg!(ironlink_diag = "call_checked") {
            return Ok(());
        }
        let call = Call::begin(c, which)?;
        body(&call, p)
    })
}

/// The shape of every tile collective: check the context, the tile index and the arguments
/// (`prepare`, which must not touch memory and returns the body), then run the body in a tile call.
#[inline(always)]
pub(super) fn tile_call<B: FnOnce(&Call) -> Result<(), i32>>(
    ctx: i64,
    which: i32,
    tile: i64,
    prepare: impl FnOnce(&SymmContext) -> Result<B, i32>,
) -> i32 {
    tile_call_in(ctx::context(ctx), which, tile, prepare)
}

/// `tile_call` for one with a multi-node version (`symm_tile_*_hierarchical`): serves every context.
#[inline(always)]
pub(super) fn any_nodes_tile_call<B: FnOnce(&Call) -> Result<(), i32>>(
    ctx: i64,
    which: i32,
    tile: i64,
    prepare: impl FnOnce(&SymmContext) -> Result<B, i32>,
) -> i32 {
    tile_call_in(ctx::any_context(ctx), which, tile, prepare)
}

#[inline(always)]
pub(super) fn tile_call_in<B: FnOnce(&Call) -> Result<(), i32>>(
    c: Result<&SymmContext, i32>,
    which: i32,
    tile: i64,
    prepare: impl FnOnce(&SymmContext) -> Result<B, i32>,
) -> i32 {
    let r = c.and_then(|c| {
        let index = tile_index(tile)?;
        let body = prepare(c)?;
        if cfg!(ironlink_diag = "call_checked") {
            return Ok(()); // as in `call_in`
        }
        body(&Call::begin_tile(c, which, index))
    });
    code(r)
}

/// Which end of a put/get is the symmetric address on the peer.
pub(super) enum Side {
    Src,
    Dst,
}

/// `symm_put` (the destination is on `peer`) and `symm_get` (the source is): the symmetric end
/// is checked inside the heap and translated to the peer; the other end is the caller's memory.
pub(super) fn peer_copy(
    ctx: i64,
    dst: i64,
    src: i64,
    nbytes: i64,
    peer: i32,
    remote: Side,
) -> Result<(), i32> {
    // Any context: a peer on another node of a multi-node one is PEER_NOT_MAPPED (peer_address).
    let c = ctx::any_context(ctx)?;
    if nbytes < 0 {
        return Err(status::INVALID_ARGUMENT);
    }
    let (mut dst, mut src) = (dst as u64, src as u64);
    match remote {
        Side::Dst => dst = ctx::peer_address(c, dst, nbytes as u64, peer)?,
        Side::Src => src = ctx::peer_address(c, src, nbytes as u64, peer)?,
    }
    // SAFETY: the remote end was checked inside the peer's heap; the local end is the caller's.
    unsafe { primitives::cta_copy(dst as usize, src as usize, nbytes as usize) };
    Ok(())
}

/// The context and `peer`'s copy of the u64 at `ptr` (this rank's heap, 8-byte aligned), for
/// `symm_signal_at` / `symm_signal_wait_at`.
pub(super) fn heap_word<'a>(
    ctx: i64,
    ptr: i64,
    peer: i32,
) -> Result<(&'a SymmContext, *mut u64), i32> {
    let c = ctx::any_context(ctx)?;
    if !(ptr as u64).is_multiple_of(8) {
        return Err(status::MISALIGNED);
    }
    let word = ctx::peer_address(c, ptr as u64, 8, peer)?;
    Ok((c, word as *mut u64))
}
