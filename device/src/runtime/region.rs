//! Checking the regions that device functions are given, before anything is touched.

use crate::abi::{status, SymmContext};

/// A region of the symmetric heap: `bytes` bytes at `offset` from every rank's heap base.
#[derive(Clone, Copy)]
pub struct Region {
    pub offset: usize,
    pub bytes: usize,
}

impl Region {
    /// Largest region: its count of 16-byte units fits 32 bits (see `mem::div32`).
    pub const MAX_BYTES: u64 = (1 << 36) - 16;

    /// Checks `[ptr + byte_offset, + count * esize)`: non-negative arguments, element-aligned,
    /// entirely inside this rank's heap.
    pub fn new(
        c: &SymmContext,
        ptr: i64,
        byte_offset: i64,
        count: i64,
        esize: usize,
    ) -> Result<Self, i32> {
        if byte_offset < 0 || count < 0 {
            return Err(status::INVALID_ARGUMENT);
        }
        let bytes = (count as u64)
            .checked_mul(esize as u64)
            .ok_or(status::OUT_OF_BOUNDS)?;
        let addr = (ptr as u64)
            .checked_add(byte_offset as u64)
            .ok_or(status::OUT_OF_BOUNDS)?;
        let base = c.heap_base(c.rank as usize) as u64;
        if addr < base || addr - base > c.heap_size || bytes > c.heap_size - (addr - base) {
            return Err(status::OUT_OF_BOUNDS);
        }
        if bytes > Self::MAX_BYTES {
            return Err(status::INVALID_ARGUMENT);
        }
        if addr & (esize as u64 - 1) != 0 {
            return Err(status::MISALIGNED);
        }
        Ok(Region {
            offset: (addr - base) as usize,
            bytes: bytes as usize,
        })
    }

    /// The region's address in `rank`'s heap, as mapped in this process.
    #[inline(always)]
    pub fn at(&self, c: &SymmContext, rank: usize) -> usize {
        c.heap_base(rank) + self.offset
    }

    /// A sub-region `[from, from + bytes)` of this one (callers stay inside it).
    #[inline(always)]
    pub fn sub(&self, from: usize, bytes: usize) -> Region {
        Region {
            offset: self.offset + from,
            bytes,
        }
    }
}

/// Two regions overlap (for rejecting out-of-place calls whose input and output alias badly).
pub fn overlap(a: &Region, b: &Region) -> bool {
    a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes
}
