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
//! Small all-reduces run one-shot over LL packets, with no barrier (`tile_ll`; `choice` decides).
//! Every other call runs between two barriers among the tile's CTAs: the first makes every
//! rank's input visible (and its output free), the second makes every result arrive before
//! anyone returns (and keeps a rank from overwriting an input a peer still reads).
//! - all_reduce (two-shot): the tile's 16-byte units are split among the ranks; rank p reduces
//!   its part from every rank's tile, in rank order, and stores the result into every rank's
//!   tile (the whole-tensor two-shot, so results are bitwise equal on every rank).
//! - all_gather: `world` blocks of the tile's shape, `block_stride` elements apart; rank p's
//!   block p is its contribution, which it stores into every peer's block p.
//! - reduce_scatter: rank p reduces block p of every rank's input, in rank order, into its
//!   output tile.
//!
//! Work inside a tile is split by 16-byte units counted row after row, so that narrow tiles keep
//! every thread busy.

use super::choice::{tile_all_reduce, TileAlgorithm};
use super::tile_ll;
use super::tile_shape::Tile;
use crate::abi::{status, SymmContext, MAX_RANKS};
use crate::runtime::elem::{Acc, Reduction};
use crate::runtime::mem::{load_unit, rotate, split, store_unit};
use crate::runtime::region::{overlap, Region};
use crate::runtime::sync::Call;

/// Peers whose units a thread holds at once (as in `transport::store_rounds`): a tile call runs
/// inside the caller's compute loop, where registers for all eight spilled.
const GROUP: usize = 4;
const _: () = assert!(GROUP * 2 == MAX_RANKS, "unroll2! runs two groups");

/// Calls `f(offset, valid)` for this thread's share (thread-strided) of units `[lo, hi)`.
#[inline(always)]
pub fn for_my_units(
    call: &Call,
    tile: &Tile,
    lo: usize,
    hi: usize,
    mut f: impl FnMut(usize, usize),
) {
    let mut u = lo + call.tid;
    while u < hi {
        let (offset, valid) = tile.unit(u);
        f(offset, valid);
        u += call.threads;
    }
}

/// The unit at heap offset `offset` (`valid` bytes) of every rank, reduced in rank order.
#[inline(always)]
fn reduce_unit(call: &Call, offset: usize, valid: usize, red: &Reduction) -> [u32; 4] {
    let c = call.c;
    let at = |p: usize| c.heap_base(p) + offset;
    // SAFETY (loads): the caller checked `valid` bytes at `offset` inside every rank's heap.
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
    acc.finish(red, call.world)
}

/// In-place all-reduce of `tile` with the same tile on every rank: one-shot over LL packets
/// for small tiles (`tile_ll`), else two-shot (see the module docs); `choice` decides.
pub fn all_reduce(call: &Call, tile: &Tile, red: &Reduction) -> Result<(), i32> {
    // Timing diagnostic, never in a normal build (`bench/probes/diag_build.sh`; results wrong):
    // "call_begun" returns once the checks and `Call::begin_tile` are done.
    if cfg!(ironlink_diag = "call_begun") {
        return Ok(());
    }
    if tile.rows == 0 {
        return Ok(());
    }
    match tile_all_reduce(call.c, call.cta, tile.bytes(), tile.ll_units()) {
        TileAlgorithm::OneShotLl => tile_ll::all_reduce(call, tile, red),
        TileAlgorithm::TwoShot => two_shot(call, tile, red),
    }
}

/// The two-shot tile all-reduce (see the module docs); `tile` is not empty.
fn two_shot(call: &Call, tile: &Tile, red: &Reduction) -> Result<(), i32> {
    let (lo, hi) = split(tile.rows * tile.units_per_row(), call.world, call.rank);
    call.barrier(0)?;
    let c = call.c;
    for_my_units(call, tile, lo, hi, |offset, valid| {
        let sum = reduce_unit(call, offset, valid, red);
        for k in 0..call.world {
            let p = rotate(call.rank, k, call.world);
            // SAFETY: inside the checked tile, at the same offset on every rank.
            unsafe { store_unit::<4>(c.heap_base(p) + offset, valid, sum) };
        }
    });
    call.barrier(1)
}

/// In-place all-gather of `world` blocks of `tile`'s shape, `block_bytes` apart, the first at
/// `tile` (see the module docs).
pub fn all_gather(call: &Call, tile: &Tile, block_bytes: usize) -> Result<(), i32> {
    if tile.rows == 0 {
        return Ok(());
    }
    let mine = tile.shifted(call.rank * block_bytes);
    call.barrier(0)?;
    let c = call.c;
    for_my_units(
        call,
        &mine,
        0,
        mine.rows * mine.units_per_row(),
        |offset, valid| {
            // SAFETY: inside the checked blocks, at the same offset on every rank.
            let v = unsafe { load_unit::<4>(c.heap_base(call.rank) + offset, valid) };
            for k in 1..call.world {
                let p = rotate(call.rank, k, call.world);
                unsafe { store_unit::<4>(c.heap_base(p) + offset, valid, v) };
            }
        },
    );
    call.barrier(1)
}

/// Reduce-scatter of `world` blocks of `out`'s shape, `block_bytes` apart, the first at `input`:
/// `out` gets block `rank` reduced over every rank's input (see the module docs).
pub fn reduce_scatter(
    call: &Call,
    input: &Tile,
    out: &Tile,
    block_bytes: usize,
    red: &Reduction,
) -> Result<(), i32> {
    if out.rows == 0 {
        return Ok(());
    }
    let mine = input.shifted(call.rank * block_bytes);
    let to_out = out.offset.wrapping_sub(mine.offset);
    call.barrier(0)?;
    let local = call.c.heap_base(call.rank);
    for_my_units(
        call,
        &mine,
        0,
        mine.rows * mine.units_per_row(),
        |offset, valid| {
            let sum = reduce_unit(call, offset, valid, red);
            // SAFETY: `out` has the input blocks' shape and was checked inside the heap.
            unsafe { store_unit::<4>(local + offset.wrapping_add(to_out), valid, sum) };
        },
    );
    call.barrier(1)
}

/// `out` may be this rank's block of `input` (in place), but must not overlap anything else of it.
pub fn check_scatter_overlap(
    input: &Tile,
    out: &Tile,
    block_bytes: usize,
    rank: usize,
    world: usize,
) -> Result<(), i32> {
    let whole = Region {
        offset: input.offset,
        bytes: (world - 1) * block_bytes + input.extent().bytes,
    };
    if overlap(&whole, &out.extent()) && out.offset != input.offset + rank * block_bytes {
        return Err(status::INVALID_ARGUMENT);
    }
    Ok(())
}

/// Push-as-produced, the data half: copies `tile` from this process's memory at `src` (the same
/// layout: rows `stride_bytes` apart) into the same place in `peer`'s heap. CTA-cooperative; the
/// caller signals the peer after it (`primitives::tile_signal`).
///
/// # Safety
/// `[src, src + tile.extent().bytes)` is readable and 2-byte aligned; `peer` is a mapped rank.
pub unsafe fn put(c: &SymmContext, tile: &Tile, src: usize, peer: usize) {
    let (tid, threads) = (
        crate::hw::thread_rank() as usize,
        crate::hw::cta_threads() as usize,
    );
    let dst = c.heap_base(peer);
    let mut u = tid;
    while u < tile.rows * tile.units_per_row() {
        let (offset, valid) = tile.unit(u);
        // SAFETY: the source by the caller's guarantee; the destination inside the checked tile.
        let v = unsafe { load_unit::<4>(src + (offset - tile.offset), valid) };
        unsafe { store_unit::<4>(dst + offset, valid, v) };
        u += threads;
    }
}
