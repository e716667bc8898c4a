//! broadcast: `buf = buf@root` on every rank, pulled from the root between two barriers.

use super::my_units;
use crate::runtime::region::Region;
use crate::runtime::sync::Call;
use crate::transport::bulk::{copy_between, Copy, Direction};

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
