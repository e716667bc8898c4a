//! Tile-scoped collectives: one CTA communicates exactly the tile it names, by itself, matched
//! with the tile of the same index on every rank (not the CTA of the same index: a persistent
//! kernel runs many tiles per CTA, in any order). A tile is 2-D: `rows` rows of `cols` elements,
//! `row_stride` elements apart, as a GEMM output tile is laid out in its matrix.
//!
//! Each tile index has its own call counter and barrier slots in the signal region (see
//! `runtime::sync`), so back-to-back calls on a tile and CUDA-graph replays need no reset. The
//! tile's data must be complete before the call as seen by the calling CTA: written by it, or by
//! an earlier kernel.
//!
//! all-reduce: the tile's 16-byte units are split among the ranks; after a barrier among the
//! tile's CTAs (every rank's tile is written), rank p reduces its part from every rank's tile, in
//! rank order, and stores the result into every rank's tile; a second barrier makes every part
//! arrive everywhere. As the whole-tensor two-shot: each element is computed by one rank, so the
//! results are bitwise equal on every rank.

use crate::abi::{status, SymmContext, MAX_RANKS, MAX_TILES};
use crate::runtime::elem::{Acc, Reduction};
use crate::runtime::mem::{load_unit, rotate, split, store_unit, unit_bytes};
use crate::runtime::region::Region;
use crate::runtime::sync::Call;

/// Peers whose units a thread holds at once (as in `transport::store_rounds`): a tile call runs
/// inside the caller's compute loop, where registers for all eight spilled.
const GROUP: usize = 4;
const _: () = assert!(GROUP * 2 == MAX_RANKS, "unroll2! runs two groups");

/// A checked 2-D tile of the symmetric heap: `rows` rows of `row_bytes` bytes, the first at heap
/// offset `offset`, each `stride_bytes` after the previous one.
#[derive(Clone, Copy)]
pub struct Tile {
    pub offset: usize,
    pub rows: usize,
    pub row_bytes: usize,
    pub stride_bytes: usize,
}

impl Tile {
    /// Checks the tile at `ptr` (`rows` x `cols` elements of `esize` bytes, rows `row_stride`
    /// elements apart) and its index: non-negative counts, `row_stride >= cols` when there are
    /// several rows, every row inside this rank's heap and element-aligned, `tile < MAX_TILES`.
    pub fn new(
        c: &SymmContext,
        ptr: i64,
        rows: i64,
        cols: i64,
        row_stride: i64,
        tile: i64,
        esize: usize,
    ) -> Result<Self, i32> {
        if rows < 0 || cols < 0 || tile < 0 || tile as u64 >= MAX_TILES as u64 {
            return Err(status::INVALID_ARGUMENT);
        }
        if rows > 1 && row_stride < cols {
            return Err(status::INVALID_ARGUMENT);
        }
        // The span from the first element of the first row to the last of the last row.
        let span = if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1)
                .checked_mul(row_stride)
                .and_then(|s| s.checked_add(cols))
                .ok_or(status::OUT_OF_BOUNDS)?
        };
        let r = Region::new(c, ptr, 0, span, esize)?;
        let row_bytes = cols as usize * esize;
        // The tile's 16-byte units are counted in 32 bits (`mem::split`).
        if rows as u64 * row_bytes.div_ceil(16) as u64 > u32::MAX as u64 {
            return Err(status::INVALID_ARGUMENT);
        }
        Ok(Tile {
            offset: r.offset,
            rows: if row_bytes == 0 { 0 } else { rows as usize },
            row_bytes,
            stride_bytes: row_stride as usize * esize,
        })
    }

    /// Row `i` as a region.
    #[inline(always)]
    fn row(&self, i: usize) -> Region {
        Region {
            offset: self.offset + i * self.stride_bytes,
            bytes: self.row_bytes,
        }
    }
}

/// In-place all-reduce of `tile` with the same tile on every rank (see the module docs).
pub fn all_reduce(call: &Call, tile: &Tile, red: &Reduction) -> Result<(), i32> {
    if tile.rows == 0 {
        return Ok(());
    }
    // 16-byte units per row (the last one partial where a row is not a multiple of 16 bytes):
    // rank p takes units [lo, hi) of the tile, counted row after row.
    let per_row = tile.row_bytes.div_ceil(16);
    let (lo, hi) = split(tile.rows * per_row, call.world, call.rank);
    call.barrier(0)?;
    let mut row = lo / per_row.max(1);
    while row < tile.rows && row * per_row < hi {
        let first = row * per_row;
        let (a, b) = (lo.max(first) - first, hi.min(first + per_row) - first);
        let r = tile.row(row);
        reduce_and_deliver(call, &r, a, b, red);
        row += 1;
    }
    call.barrier(1)
}

/// Units `[a, b)` of row `r` (thread-strided): the reduction over ranks in rank order, stored
/// into the row on every rank (this one first).
#[inline(always)]
fn reduce_and_deliver(call: &Call, r: &Region, a: usize, b: usize, red: &Reduction) {
    let c = call.c;
    let mut i = a + call.tid;
    while i < b {
        let valid = unit_bytes(i, 16, r.bytes);
        let at = |p: usize| r.at(c, p) + 16 * i;
        // SAFETY (loads and stores): `valid` bytes of unit i lie inside the checked row, at the
        // same offsets on every rank.
        let mut acc = Acc::<4>::first(red, unsafe { load_unit::<4>(at(0), valid) });
        // Peers four at a time, all four loads before their adds.
        unroll2!(MAX_RANKS / GROUP, g => {
            let mut v = [[0u32; 4]; GROUP];
            for_each_rank!(p => if p / GROUP == g && p >= 1 && p < call.world {
                v[p % GROUP] = unsafe { load_unit::<4>(at(p), valid) };
            });
            for_each_rank!(p => if p / GROUP == g && p >= 1 && p < call.world {
                acc.add(red, v[p % GROUP]);
            });
        });
        let sum = acc.finish(red, call.world);
        for k in 0..call.world {
            unsafe { store_unit::<4>(at(rotate(call.rank, k, call.world)), valid, sum) };
        }
        i += call.threads;
    }
}
