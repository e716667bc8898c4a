//! What a tile-scoped call operates on: a checked 2-D tile of the symmetric heap and its 16-byte
//! units, shared by the tile collectives (`tile`, its LL one-shot `tile_ll`, the hierarchical
//! ones) and the push-as-produced calls, so that none of them depends on another for it.

use crate::abi::{status, SymmContext, MAX_TILES};
use crate::runtime::mem::{div32, unit_bytes};
use crate::runtime::region::Region;

/// `tile` as a tile index, or INVALID_ARGUMENT.
pub fn tile_index(tile: i64) -> Result<usize, i32> {
    if tile < 0 || tile as u64 >= MAX_TILES as u64 {
        return Err(status::INVALID_ARGUMENT);
    }
    Ok(tile as usize)
}

/// A checked 2-D tile of the symmetric heap: `rows` rows of `row_bytes` bytes, the first at heap
/// offset `offset`, each `stride_bytes` after the previous one.
#[derive(Clone, Copy)]
pub struct Tile {
    pub offset: usize,
    pub rows: usize,
    pub row_bytes: usize,
    pub stride_bytes: usize,
}

/// A tile's shape as the caller gave it, in elements, before any check.
#[derive(Clone, Copy)]
pub struct Shape {
    pub rows: i64,
    pub cols: i64,
    pub row_stride: i64,
}

impl Tile {
    /// Checks the tile at `ptr` (`rows` x `cols` elements of `esize` bytes, rows `row_stride`
    /// elements apart): non-negative counts, `row_stride >= cols` when there are several rows,
    /// every row inside this rank's heap and element-aligned.
    pub fn new(c: &SymmContext, ptr: i64, shape: Shape, esize: usize) -> Result<Self, i32> {
        Self::with_blocks(c, ptr, shape, 0, 1, esize).map(|(t, _)| t)
    }

    /// Checks `blocks` tiles of `shape`, the first at `ptr`, each `block_stride` elements after
    /// the previous one, that do not overlap each other (stacked: a block starts after the
    /// previous one ends; or interleaved: the blocks' rows side by side within one row stride).
    /// Returns block 0 and the blocks' distance in bytes.
    pub fn with_blocks(
        c: &SymmContext,
        ptr: i64,
        shape: Shape,
        block_stride: i64,
        blocks: usize,
        esize: usize,
    ) -> Result<(Self, usize), i32> {
        let Shape {
            rows,
            cols,
            row_stride,
        } = shape;
        if rows < 0 || cols < 0 || block_stride < 0 || (rows > 1 && row_stride < cols) {
            return Err(status::INVALID_ARGUMENT);
        }
        let too_big = status::OUT_OF_BOUNDS;
        // The span of one block, from the first element of its first row to the last of its last.
        let one = if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1)
                .checked_mul(row_stride)
                .and_then(|s| s.checked_add(cols))
                .ok_or(too_big)?
        };
        let last = (blocks as i64 - 1)
            .checked_mul(block_stride)
            .ok_or(too_big)?;
        let disjoint = blocks <= 1
            || one == 0
            || block_stride >= one
            || (block_stride >= cols && last.checked_add(cols).is_some_and(|e| e <= row_stride));
        if !disjoint {
            return Err(status::INVALID_ARGUMENT);
        }
        let span = if one == 0 {
            0
        } else {
            last.checked_add(one).ok_or(too_big)?
        };
        let r = Region::new(c, ptr, 0, span, esize)?;
        let row_bytes = cols as usize * esize;
        // The tile's 16-byte units are counted in 32 bits (`mem::split`, `mem::div32`).
        if rows as u64 * row_bytes.div_ceil(16) as u64 > u32::MAX as u64 {
            return Err(status::INVALID_ARGUMENT);
        }
        let tile = Tile {
            offset: r.offset,
            rows: if row_bytes == 0 { 0 } else { rows as usize },
            row_bytes,
            stride_bytes: row_stride as usize * esize,
        };
        Ok((tile, block_stride as usize * esize))
    }

    /// The tile `bytes` further into the heap (another block of the same shape).
    #[inline(always)]
    pub fn shifted(&self, bytes: usize) -> Tile {
        Tile {
            offset: self.offset + bytes,
            ..*self
        }
    }

    /// The bytes from the tile's first element to its last, as a region (for overlap checks).
    pub fn extent(&self) -> Region {
        let bytes = if self.rows == 0 {
            0
        } else {
            (self.rows - 1) * self.stride_bytes + self.row_bytes
        };
        Region {
            offset: self.offset,
            bytes,
        }
    }

    /// 16-byte units per row (the last one partial where a row is not a multiple of 16 bytes).
    #[inline(always)]
    pub fn units_per_row(&self) -> usize {
        self.row_bytes.div_ceil(16)
    }

    /// 16-byte units in the tile, counted row after row.
    #[inline(always)]
    pub fn units(&self) -> usize {
        self.rows * self.units_per_row()
    }

    /// The heap offset of unit `u` (counted row after row) and its valid bytes.
    #[inline(always)]
    pub fn unit(&self, u: usize) -> (usize, usize) {
        self.unit_of::<16>(u)
    }

    /// Data bytes in the tile.
    #[inline(always)]
    pub fn bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    /// 8-byte units (one LL packet's data each) in the tile, counted row after row.
    #[inline(always)]
    pub fn ll_units(&self) -> usize {
        self.rows * self.row_bytes.div_ceil(8)
    }

    /// The heap offset of 8-byte unit `u` (counted row after row) and its valid bytes.
    #[inline(always)]
    pub fn ll_unit(&self, u: usize) -> (usize, usize) {
        self.unit_of::<8>(u)
    }

    /// Unit `u` of `B` bytes, counted row after row (the last of a row partial): heap offset
    /// and valid bytes.
    #[inline(always)]
    fn unit_of<const B: usize>(&self, u: usize) -> (usize, usize) {
        let per_row = self.row_bytes.div_ceil(B);
        let row = div32(u, per_row);
        let i = u - row * per_row;
        (
            self.offset + row * self.stride_bytes + B * i,
            unit_bytes(i, B, self.row_bytes),
        )
    }
}
