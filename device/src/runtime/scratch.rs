//! Each rank's scratch region is cut into `MAX_CTAS` equal slices, slice `c` belonging to CTA `c`
//! (of every call, whatever the grid): a CTA's data in a peer's scratch can then only be
//! disturbed by the same-index CTA of another rank, which the collectives' protocols order.

use crate::abi::{SymmContext, MAX_CTAS};

/// Bytes in one CTA's slice (the same on every rank).
#[inline(always)]
pub fn slice_bytes(c: &SymmContext) -> usize {
    (c.scratch_size as usize / MAX_CTAS).min(u32::MAX as usize)
}

/// Address of CTA `cta`'s slice in `rank`'s scratch region, as mapped in this process.
#[inline(always)]
pub fn slice_base(c: &SymmContext, rank: usize, cta: usize) -> usize {
    c.scratch_base(rank) + cta * slice_bytes(c)
}
