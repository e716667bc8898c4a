//! reduce: on `root`, `out = reduce over p of input@p`, pulled from every rank between two
//! barriers.

use super::my_units;
use crate::runtime::elem::Reduction;
use crate::runtime::region::Region;
use crate::runtime::sync::Call;
use crate::transport::bulk::{reduce_units, Deliver};

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
