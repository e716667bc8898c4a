//! The argument checks of the exported functions: each gives the status code that rejects an
//! argument, before anything is written.

use crate::abi::{dtype_size, status, SymmContext};
use crate::runtime::elem::op_supported;
use crate::runtime::region::Region;

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
