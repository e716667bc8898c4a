//! Every algorithm choice of the collectives, and every threshold behind one: the only place
//! where a collective's algorithm is decided. Each choice depends only on arguments and context
//! fields that are equal on every rank, so every rank chooses the same algorithm.
//!
//! Two kinds of limits:
//! - context fields (`SymmContext::ar_one_shot_max_bytes`, `ar_ll_max_bytes`,
//!   `gather_ll_max_bytes`): set per heap from the measured tuning table
//!   (`python/ironlink/runtime/tuning_table.py`, written by `bench/report/make_tuning.py`), defaults below;
//! - the named constants below: measured switches that do not depend on the world size.
//!
//! They reach Python through the generated `python/ironlink/language/_abi.py` (`THRESHOLDS`).

use crate::abi::SymmContext;
use crate::runtime::mem::div_ceil32;
use crate::runtime::region::Region;
use crate::transport::{ll_packet, store_rounds, tile_inbox};

/// Defines `pub mod thresholds` with one `pub const` per entry (bytes) and `ALL`, the
/// (name, value) table that `build.rs` projects into Python.
macro_rules! thresholds {
    ($($(#[$m:meta])* $name:ident = $val:expr;)*) => {
        $($(#[$m])* pub const $name: usize = $val;)*
        /// Every threshold of this module as (name, bytes), for the Python projection.
        pub const ALL: &[(&str, i64)] = &[$((stringify!($name), $name as i64)),*];
    };
}

thresholds! {
    /// Default for `SymmContext::ar_one_shot_max_bytes`, for contexts the benchmark's tuning
    /// table does not cover (the heap applies the measured crossovers,
    /// `python/ironlink/runtime/tuning_table.py`).
    DEFAULT_AR_ONE_SHOT_MAX_BYTES = 64 << 10;
    /// Default for `SymmContext::ar_ll_max_bytes` (as above).
    DEFAULT_AR_LL_MAX_BYTES = 2 << 20;
    /// Scratch bytes per rank when the heap's creator does not choose: the packet buffers of the
    /// collectives, cut into one slice per CTA (`runtime::scratch`). The large all-reduce moves
    /// in rounds of one scratch buffer per CTA: on 4 H200s, 64 -> 256 MiB took 1 GiB from 0.95x
    /// to 1.00x NCCL (128 MiB did not help; 512 no further).
    DEFAULT_SCRATCH_BYTES = 256 << 20;
    /// Default for `SymmContext::gather_ll_max_bytes`: off. The heap turns it on where the
    /// benchmark measured it to win (`python/ironlink/runtime/tuning_table.py`).
    DEFAULT_GATHER_LL_MAX_BYTES = 0;
    /// From this size on, two-shot all-reduce runs as `Push` where it can. Measured on 4 H200s
    /// (bf16, A/B/B/A, same GPUs, best grid of each), fused vs push: 2 MiB 17.4 vs 21.1 us,
    /// 4 MiB 27.2 vs 30.3, 6 MiB 38.0 vs 40.0, 8 MiB 49.0 vs 48.9, 12 MiB 68.4 vs 66.0,
    /// 16 MiB 87.2 vs 84.0.
    PUSH_MIN_BYTES = 8 << 20;
    /// From this size on, two-shot all-reduce runs its two halves one after the other where
    /// `Push` cannot run. Measured on 4 H200s (bf16, same session), fused vs separate: 16 MiB
    /// 88.0 vs 89.4 us, 64 MiB 331 vs 320 us, 256 MiB 1285 vs 1259 us, 1 GiB 5070 vs 4887 us;
    /// separate vs push (one run each): 64 MiB 317.5 vs 312.1 us, 256 MiB 1247 vs 1219 us,
    /// 1 GiB 4871 vs 4823 us.
    SEPARATE_PHASES_MIN_BYTES = 32 << 20;
    /// From this input size on, reduce_scatter moves its data by stores through the scratch
    /// (`store_rounds`) where the blocks are whole 16-byte units. Measured on 4 H200s (bf16, one
    /// session, pull vs push): 16 MiB 48.8 vs 55.6 us, 64 MiB 169.5 vs 176.8, 256 MiB 642.1 vs
    /// 627.8, 1 GiB 2484 vs 2418.
    PUSH_REDUCE_SCATTER_MIN_BYTES = 256 << 20;
    /// Tile all-reduces of up to this many data bytes run one-shot over LL packets where the
    /// packets fit the tile's boxes (`transport::tile_inbox`), two-shot between barriers above:
    /// one hidden-8192 bf16 row, all_reduce_rmsnorm's tile at up to one token per CTA. Not yet
    /// measured against the two-shot at other sizes.
    TILE_LL_MAX_BYTES = 16 << 10;
}
const _: () = assert!(PUSH_MIN_BYTES <= SEPARATE_PHASES_MIN_BYTES);

/// `c` with the default algorithm limits, for contexts the tuning table does not cover.
pub const fn with_default_limits(mut c: SymmContext) -> SymmContext {
    c.ar_one_shot_max_bytes = DEFAULT_AR_ONE_SHOT_MAX_BYTES as u64;
    c.ar_ll_max_bytes = DEFAULT_AR_LL_MAX_BYTES as u64;
    c.gather_ll_max_bytes = DEFAULT_GATHER_LL_MAX_BYTES as u64;
    c
}

/// The all-reduce algorithms (see `collectives::all_reduce`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    OneShotLl,
    TwoShotLl,
    TwoShot,
}

/// The all-reduce algorithm for a message of `bytes` on a grid of `ctas` CTAs: by the context's
/// size limits, where the packets fit.
#[inline(always)]
pub fn choose(c: &SymmContext, ctas: usize, bytes: usize) -> Algorithm {
    if bytes > ll_packet::LL_HARD_MAX_BYTES {
        return Algorithm::TwoShot;
    }
    let world = c.world_size as usize;
    let units = bytes.div_ceil(8);
    if bytes as u64 <= c.ar_one_shot_max_bytes && ll_packet::fits(c, ctas, units, world) {
        Algorithm::OneShotLl
    } else if bytes as u64 <= c.ar_ll_max_bytes
        && ll_packet::fits(c, ctas, div_ceil32(units, world), 2 * world)
    {
        Algorithm::TwoShotLl
    } else {
        Algorithm::TwoShot
    }
}

/// How the two-shot all-reduce runs a message (the same on every rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwoShot {
    /// Each thread loads a unit from every rank, reduces it and stores the result to every rank.
    Fused,
    /// All loads, a barrier, then all stores (large messages whose region is not 16-byte
    /// aligned, or when the scratch is too small for `Push`).
    Separate,
    /// Stores only, in rounds through the scratch (`store_rounds`): large messages.
    Push,
}

#[inline(always)]
pub fn two_shot_variant(c: &SymmContext, r: &Region) -> TwoShot {
    if r.bytes >= PUSH_MIN_BYTES && store_rounds::usable(c, r) {
        TwoShot::Push
    } else if r.bytes >= SEPARATE_PHASES_MIN_BYTES {
        TwoShot::Separate
    } else {
        TwoShot::Fused
    }
}

/// Whether an all_gather or reduce_scatter over a buffer of `total` bytes (blocks of `n`) goes
/// over one hop of LL packets: up to the context's `gather_ll_max_bytes`, where this CTA's share
/// fits its mailboxes. (all_gather passes its output, reduce_scatter its input.)
#[inline(always)]
pub fn use_ll(c: &SymmContext, ctas: usize, total: usize, n: usize) -> bool {
    total <= ll_packet::LL_HARD_MAX_BYTES
        && total as u64 <= c.gather_ll_max_bytes
        && ll_packet::fits(c, ctas, n.div_ceil(8), c.world_size as usize)
}

/// Whether a reduce_scatter that does not go over LL packets moves its data by stores in rounds
/// through the scratch (else it pulls between two barriers).
#[inline(always)]
pub fn reduce_scatter_by_stores(c: &SymmContext, input: &Region, out: &Region) -> bool {
    input.bytes >= PUSH_REDUCE_SCATTER_MIN_BYTES
        && store_rounds::usable_for_reduce_scatter(c, input, out)
}

/// The tile all-reduce algorithms (see `collectives::tile` and `collectives::tile_ll`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TileAlgorithm {
    /// Every rank pushes its tile to every peer as LL packets and reduces what it receives.
    OneShotLl,
    /// Rank p reduces part p of the tile from every rank and stores it into every rank, between
    /// two barriers.
    TwoShot,
}

/// The algorithm of a tile all-reduce on tile index `tile` of `bytes` data bytes that travel
/// as `packets` LL packets (its 8-byte units, counted per row): LL up to `TILE_LL_MAX_BYTES`
/// where the tile's boxes hold them. Equal on every rank when the tile's shape is.
#[inline(always)]
pub fn tile_all_reduce(
    c: &SymmContext,
    tile: usize,
    bytes: usize,
    packets: usize,
) -> TileAlgorithm {
    if bytes <= TILE_LL_MAX_BYTES && tile_inbox::fits(c, tile, packets) {
        TileAlgorithm::OneShotLl
    } else {
        TileAlgorithm::TwoShot
    }
}
