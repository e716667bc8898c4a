//! The argument checks of the exported functions: each gives the status code that rejects an
//! argument, before anything is written.

use crate::abi::{dtype_size, status, SymmContext};
use crate::collectives::all_to_all_v::Plan;
use crate::runtime::elem::op_supported;
use crate::runtime::region::{overlap, Region};

pub(super) fn check_op_dtype(op: i32, dt: i32) -> Result<usize, i32> {
    if !op_supported(op) {
        return Err(status::UNSUPPORTED_OP);
    }
    check_dtype(dt)
}

pub(super) fn check_dtype(dt: i32) -> Result<usize, i32> {
    match dtype_size(dt) {
        0 => Err(status::UNSUPPORTED_DTYPE),
        s => Ok(s),
    }
}

/// A root or peer argument: a rank of the context's group.
pub(super) fn check_rank(c: &SymmContext, rank: i32) -> Result<usize, i32> {
    if rank < 0 || rank >= c.world_size {
        return Err(status::INVALID_ARGUMENT);
    }
    Ok(rank as usize)
}

/// A region of `world` blocks of `count` elements.
pub(super) fn blocks(c: &SymmContext, ptr: i64, count: i64, esize: usize) -> Result<Region, i32> {
    let n = count
        .checked_mul(c.world_size as i64)
        .ok_or(status::OUT_OF_BOUNDS)?;
    Region::new(c, ptr, 0, n, esize)
}

/// `block` (as large as one of `whole`'s `world` blocks) may be this rank's block of `whole` and
/// must not overlap it otherwise: reduce-scatter's output, all-gather's input.
#[inline(always)]
fn own_block_or_apart(c: &SymmContext, whole: &Region, block: &Region) -> Result<(), i32> {
    let mine = whole.sub(c.rank as usize * block.bytes, block.bytes);
    if overlap(whole, block) && block.offset != mine.offset {
        return Err(status::INVALID_ARGUMENT);
    }
    Ok(())
}

/// Reduce-scatter's regions: `input` of `world` blocks of `count` elements, `out` of one block,
/// which may be this rank's block of `input` and must not overlap it otherwise.
#[inline(always)]
pub(super) fn reduce_scatter_regions(
    c: &SymmContext,
    in_ptr: i64,
    out_ptr: i64,
    count: i64,
    esize: usize,
) -> Result<(Region, Region), i32> {
    let input = blocks(c, in_ptr, count, esize)?;
    let out = Region::new(c, out_ptr, 0, count, esize)?;
    own_block_or_apart(c, &input, &out)?;
    Ok((input, out))
}

/// All-gather's regions: `input` of one block of `count` elements, `out` of `world` blocks;
/// `input` may be this rank's block of `out` and must not overlap it otherwise.
#[inline(always)]
pub(super) fn all_gather_regions(
    c: &SymmContext,
    in_ptr: i64,
    out_ptr: i64,
    count: i64,
    esize: usize,
) -> Result<(Region, Region), i32> {
    let input = Region::new(c, in_ptr, 0, count, esize)?;
    let out = blocks(c, out_ptr, count, esize)?;
    own_block_or_apart(c, &out, &input)?;
    Ok((input, out))
}

/// All-to-all's regions: `input` and `out` of `world` blocks of `count` elements each, not
/// overlapping; and the block's bytes.
#[inline(always)]
pub(super) fn all_to_all_regions(
    c: &SymmContext,
    in_ptr: i64,
    out_ptr: i64,
    count: i64,
    esize: usize,
) -> Result<(Region, Region, usize), i32> {
    let input = blocks(c, in_ptr, count, esize)?;
    let out = blocks(c, out_ptr, count, esize)?;
    if overlap(&input, &out) {
        return Err(status::INVALID_ARGUMENT);
    }
    Ok((input, out, count as usize * esize))
}

/// Reduce's regions and root: `input` and `out` of `count` elements, the same or not
/// overlapping; `root` a rank of the context.
#[inline(always)]
pub(super) fn reduce_regions(
    c: &SymmContext,
    in_ptr: i64,
    out_ptr: i64,
    count: i64,
    esize: usize,
    root: i32,
) -> Result<(Region, Region, usize), i32> {
    let input = Region::new(c, in_ptr, 0, count, esize)?;
    let out = Region::new(c, out_ptr, 0, count, esize)?;
    if overlap(&input, &out) && input.offset != out.offset {
        return Err(status::INVALID_ARGUMENT);
    }
    Ok((input, out, check_rank(c, root)?))
}

/// All-to-all-v's plan: `input` and `out` of `(pointer, rows)` rows of `row_elements` elements;
/// the `[world]` i64 arrays of send counts and `(receive counts, receive offsets)`. This rank's
/// own counts (written before the call; the peers' are read after a barrier) are each >= 0 and
/// together at most the input's rows; no two regions overlap.
#[inline(always)]
pub(super) fn all_to_all_v_plan(
    c: &SymmContext,
    (in_ptr, in_rows): (i64, i64),
    send_counts_ptr: i64,
    (out_ptr, out_rows): (i64, i64),
    (recv_counts_ptr, recv_offsets_ptr): (i64, i64),
    row_elements: i64,
    dtype: i32,
) -> Result<Plan, i32> {
    let es = check_dtype(dtype)?;
    let world = c.world_size as i64;
    let send_counts = Region::new(c, send_counts_ptr, 0, world, 8)?;
    let recv_counts = Region::new(c, recv_counts_ptr, 0, world, 8)?;
    let recv_offsets = Region::new(c, recv_offsets_ptr, 0, world, 8)?;
    if row_elements < 0 || in_rows < 0 || out_rows < 0 {
        return Err(status::INVALID_ARGUMENT);
    }
    let rows = |n: i64| n.checked_mul(row_elements).ok_or(status::OUT_OF_BOUNDS);
    let input = Region::new(c, in_ptr, 0, rows(in_rows)?, es)?;
    let out = Region::new(c, out_ptr, 0, rows(out_rows)?, es)?;
    let mut sent: i64 = 0;
    for p in 0..world as usize {
        // SAFETY: entry p of the checked [world] i64 region.
        let n = unsafe {
            core::ptr::read_volatile((send_counts.at(c, c.rank as usize) as *const i64).add(p))
        };
        if n < 0 {
            return Err(status::INVALID_ARGUMENT);
        }
        sent = sent.saturating_add(n);
    }
    if sent > in_rows {
        return Err(status::INVALID_ARGUMENT);
    }
    let arrays = [&send_counts, &recv_counts, &recv_offsets];
    let clash = arrays.iter().enumerate().any(|(i, a)| {
        overlap(a, &input) || overlap(a, &out) || arrays[i + 1..].iter().any(|b| overlap(a, b))
    });
    if clash || overlap(&input, &out) {
        return Err(status::INVALID_ARGUMENT);
    }
    let (capacity, row_bytes) = (out_rows as usize, row_elements as usize * es);
    Ok(Plan {
        input,
        send_counts,
        out,
        capacity,
        recv_counts,
        recv_offsets,
        row_bytes,
    })
}
