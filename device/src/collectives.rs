//! The bandwidth collectives over the symmetric buffers, with 16-byte vectors: reductions pull
//! (each rank loads what it reduces from every peer; large reduce-scatters push through the
//! scratch instead, see `two_shot_push`); pure data movement pushes where every rank
//! sends (all_gather, all_to_all: stores are posted, loads wait a round trip). A barrier among
//! same-index CTAs before the transfers makes the peers' inputs visible and their outputs free;
//! one after makes the results complete and keeps a rank from overwriting an input a peer still
//! reads. Work is split by 16-byte units: across CTAs, then across threads.

use crate::bulk::{copy_between, push_to_all, reduce_units, Copy, Deliver, Direction};
use crate::elem::Reduction;
use crate::ll_gather;
use crate::mem::split;
use crate::region::Region;
use crate::sync::Call;
use crate::two_shot_push;

/// From this input size on, reduce_scatter moves its data by stores through the scratch
/// (`two_shot_push`) where the blocks are whole 16-byte units. Measured on 4 H200s (bf16, one
/// session, pull vs push): 16 MiB 48.8 vs 55.6 us, 64 MiB 169.5 vs 176.8, 256 MiB 642.1 vs
/// 627.8, 1 GiB 2484 vs 2418.
pub const PUSH_REDUCE_SCATTER_MIN_BYTES: usize = 256 << 20;

/// CTA `call.cta`'s share of a region of `bytes` bytes, in 16-byte units.
#[inline(always)]
fn my_units(call: &Call, bytes: usize) -> (usize, usize) {
    split(bytes.div_ceil(16), call.ctas, call.cta)
}

/// `out = reduce over p of input@p[rank * n ..][.. n]`; `input` holds `world` blocks of `out.bytes`.
pub fn reduce_scatter(
    call: &Call,
    input: &Region,
    out: &Region,
    red: &Reduction,
) -> Result<(), i32> {
    if ll_gather::use_ll(call.c, call.ctas, input.bytes, out.bytes) {
        return ll_gather::reduce_scatter(call, input, out, red);
    }
    if input.bytes >= PUSH_REDUCE_SCATTER_MIN_BYTES
        && two_shot_push::usable_for_reduce_scatter(call.c, input, out)
    {
        return two_shot_push::reduce_scatter(call, input, out, red);
    }
    call.barrier(0)?;
    let block = input.sub(call.rank * out.bytes, out.bytes);
    let (lo, hi) = my_units(call, out.bytes);
    reduce_units(call, &block, out, lo, hi, red, Deliver::Local);
    call.barrier(1)
}

/// `out[p * n ..][.. n] = input@p` for every rank p: every rank pushes its input into block
/// `rank` of every rank's `out`. In place when `input` is this rank's block of `out` (then
/// there is nothing to copy locally).
pub fn all_gather(call: &Call, input: &Region, out: &Region) -> Result<(), i32> {
    if ll_gather::use_ll(call.c, call.ctas, out.bytes, input.bytes) {
        return ll_gather::all_gather(call, input, out);
    }
    call.barrier(0)?;
    let n = input.bytes;
    let in_place = input.offset == out.offset + call.rank * n;
    let (lo, hi) = my_units(call, n);
    push_to_all(
        call,
        input.offset,
        out.offset + call.rank * n,
        n,
        lo,
        hi,
        !in_place,
    );
    call.barrier(1)
}

/// `buf = buf@root` on every rank.
pub fn broadcast(call: &Call, buf: &Region, root: usize) -> Result<(), i32> {
    call.barrier(0)?;
    let (lo, hi) = my_units(call, buf.bytes);
    copy_between(call, Direction::Pull, |p| {
        (p == root && call.rank != root).then_some(Copy {
            src: buf.offset,
            dst: buf.offset,
            bytes: buf.bytes,
            lo,
            hi,
        })
    });
    call.barrier(1)
}

/// On `root`: `out = reduce over p of input@p`. Other ranks only take part in the barriers.
pub fn reduce(
    call: &Call,
    input: &Region,
    out: &Region,
    red: &Reduction,
    root: usize,
) -> Result<(), i32> {
    call.barrier(0)?;
    if call.rank == root {
        let (lo, hi) = my_units(call, input.bytes);
        reduce_units(call, input, out, lo, hi, red, Deliver::Local);
    }
    call.barrier(1)
}

/// `out[p * n ..][.. n] = input@p[rank * n ..][.. n]` for every rank p (blocks of `n` bytes):
/// every rank pushes its block p into block `rank` of rank p's `out`.
pub fn all_to_all(call: &Call, input: &Region, out: &Region, n: usize) -> Result<(), i32> {
    call.barrier(0)?;
    let (lo, hi) = my_units(call, n);
    copy_between(call, Direction::Push, |p| {
        Some(Copy {
            src: input.offset + p * n,
            dst: out.offset + call.rank * n,
            bytes: n,
            lo,
            hi,
        })
    });
    call.barrier(1)
}
