//! all_to_all with equal splits, pushed into every peer's output between two barriers.

use super::my_units;
use crate::runtime::region::Region;
use crate::runtime::sync::Call;
use crate::transport::bulk::{copy_between, Copy, Direction};

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
