"""Launch choices of all_reduce_rmsnorm (`ironlink.fused.all_reduce_rmsnorm`): its mode by the
decode table of the world size (`runtime/tuning/decode_table.py`), and each mode's shape: warps, the
slices of "split", the rows a CTA normalizes at once. Why each number is what it is: the comment
above it (the measurements behind it are in docs/record.md)."""

from __future__ import annotations

from dataclasses import dataclass

from ...language._abi import MAX_CTAS, MAX_LL_TILES, MAX_RANKS, SIGNAL_LAYOUT, THRESHOLDS
from . import decode_table


def tile_all_reduce_takes_ll(tile: int, rows: int, row_bytes: int, world: int) -> bool:
    """Whether `symm_tile_all_reduce` runs one-shot over LL packets (no barrier) for tile index
    `tile` of `rows` rows of `row_bytes` bytes over `world` ranks of one node, on a heap whose
    signal region holds the LL area (every `SymmetricHeap`'s): the device's rule
    (`collectives::choice::tile_all_reduce`, `transport::tile_inbox`), mirrored here for launch
    planning and tested against it (`_native.tile_all_reduce_algorithm`)."""
    if not 2 <= world <= MAX_RANKS or not 0 <= tile < MAX_LL_TILES:
        return False
    layout = SIGNAL_LAYOUT
    capacity = layout["TILE_LL_BYTES"] // (MAX_LL_TILES * 2 * (world - 1) * 16)  # packets per box
    packets = rows * -(-row_bytes // 8)
    return rows * row_bytes <= THRESHOLDS["TILE_LL_MAX_BYTES"] and packets <= capacity


# all_reduce_rmsnorm's mode and ironlink.all_reduce's path by bytes come from the decode table of
# the world size (runtime/tuning/decode_table.py: a user's tuning file from `python -m ironlink.tune`,
# else the committed runtime/tuning/tables/decode-w{world}.json, else one derived from the nearest world).
# The committed tables are the tuner's runs on H200s (their files hold every timing). Before the
# tuner, world 2's choices were made by hand from these measurements (docs/record.md has the rest):
# - all_reduce_rmsnorm "split" up to 256 KiB: below, after RMSNORM_SPLIT_MAX_PARTS.
# - "lamport" up to 8 MiB: below, after RMSNORM_SPLIT_LAMPORT.
# - "push" (rows stored into the peers' slots, a tile signal per CTA: the bytes cross NVLink once
#   where LL packets double them) up to 32 MiB. 2 H200s, hidden 8192 bf16, push + PDL against rows
#   + PDL (git 7bc5bf5, bench/results/fused-2xNVIDIA-H200-20261126-074602.json): 1 token 13.5 /
#   10.6 us, 8 9.4 / 9.9, 32 10.2 / 13.0, 128 13.4 / 19.3, 512 39.2 / 41.3, 2048 162.5 / 153.7. With
#   a CTA's rows pipelined in chunks (git 85d32ab, 2 H100s, bench/probes/ab.sh, two runs each): 2048 tokens
#   push + PDL 122.0 / 130.2 us against rows + PDL 155.3 / 169.4 (the push before the pipeline:
#   187.3 / 184.6); 512 40.0 / 40.7 against 41.2 / 42.2. Its workspace in the heap: twice x.
# - "rows" beyond: rows + PDL beat whole + PDL at 2048 tokens of hidden 8192 (32 MiB) on 2 H100s
#   (158.5 against 163.3 us, git 99b169a) and on 2 H200s (151.8 against 154.2, git 784be2d).
# - ironlink.all_reduce "lamport" up to 256 KiB: below, after ALL_REDUCE_LAMPORT_WARPS.
# World 4's choice before the tuner: "whole" (every CTA
# all-reduces, a grid barrier, then the norm) up to 16 KiB and from 32 MiB, "rows" between (each
# CTA all-reduces and normalizes its own rows). Measured on 4 H200s, hidden 8192 bf16, before the
# LL tile all-reduce (bench/results/fused-4xNVIDIA-H200-20261122-125136.json): whole won at 1 token
# (9.7 vs 12.0 us) and 2048 (210 vs 222 us), rows from 8 to 512 tokens (12.9 vs 15.4 us at 8).


# all_reduce_rmsnorm's "split" cuts each row into slices of at least RMSNORM_SPLIT_MIN_SLICE_BYTES,
# one CTA each, at most RMSNORM_SPLIT_MAX_PARTS a row, every CTA resident with an LL tile (it runs
# for a shape only where at least two fit: `rmsnorm_mode_runs`). Why world 2 runs it up to 256 KiB
# of x: one CTA moves a row's LL packets in about 2 us at
# 2 KiB and 4.3 at 16 KiB (2 H100s, bench/probes/rmsnorm_timeline.py, hidden 1024 and 8192, 1 token:
# all_reduce_us 3.75 and 6.0 of which 1.75 outside the exchange). On 2 H100s, hidden 8192 bf16,
# with PDL, us, split / rows / push (git 5f070ee, one run of bench/fused.py:
# bench/results/experiments/rmsnorm-split-2xH100-5f070ee.json): 1 token 6.71 / 9.70 / 9.17,
# 4 7.36 / 8.99 / 9.30, 8 7.48 / 9.64 / 9.25, 16 7.64 / 8.48 / 8.44, 32 11.46 / 13.08 / 10.78.
RMSNORM_SPLIT_MIN_SLICE_BYTES = 2 << 10
RMSNORM_SPLIT_MAX_PARTS = 8
# Whether "split" exchanges its slices through lamport slots (mode "lamport"'s: the bytes cross
# NVLink once, read as they land) rather than LL packets (two bytes on the link per data byte).
# 2 H100s, hidden 8192 bf16, PDL, in turns (git 2edce18,
# bench/results/experiments/rmsnorm-lamport-2xH100-2edce18.json), us, split over lamport slots /
# over LL: 1 token 6.03 / 6.69, 8 7.01 / 8.13, 16 8.15 / 9.60, 32 7.60 / 9.71.
RMSNORM_SPLIT_LAMPORT = True


@dataclass(frozen=True)
class RmsnormConfig:
    """all_reduce_rmsnorm's choices beyond its decode table and `mode=` (`all_reduce_rmsnorm(config=)`):
    whether "split" exchanges its slices through lamport slots or LL packets (bench/fused.py times
    the other one, the GPU suites check it)."""

    split_lamport: bool = RMSNORM_SPLIT_LAMPORT


# Why world 2's "lamport" (push's layout, the rows read as they land: no signal, no fence) runs
# from split's bytes up to 8 MiB: the run of RMSNORM_SPLIT_LAMPORT, lamport / push / split (its
# default exchange), us: 16 tokens 8.18 / 10.78 / 8.15, 32 7.53 / 8.80 / 7.60, 64 8.73 / 10.82 /
# 9.13, 128 12.19 / 14.12, 512 37.87 / 39.48, 2048 185.35 / 121.68 (push pipelines a CTA's 16
# rows; lamport sends them all, then reads and empties them one at a time).


def rmsnorm_warps(block_h: int) -> int:
    """Warps of an all_reduce_rmsnorm CTA that holds rows of `block_h` elements (a power of two):
    a warp per 512 elements (16 a thread), from 4 to 16 (hidden 8192: 16 warps, one CTA an SM
    at 114 registers a thread)."""
    return max(4, min(16, block_h // 512))


def rmsnorm_split_warps(block: int) -> int:
    """Warps of a "split" CTA that holds a slice of `block` elements (a power of two): a warp per
    128 elements (a thread per LL unit, 8 data bytes, at 2-byte elements), from 8 to 16 (with 4,
    ptxas keeps 24 bytes of stack in the kernel on sm_90)."""
    return max(8, min(16, block // 128))


def rmsnorm_split_slice_bytes(row_bytes: int, parts: int) -> int:
    """Bytes of each slice (the last may have fewer) when "split" cuts a row of `row_bytes` into
    `parts`: whole 16-byte units, so every slice starts aligned as the row does."""
    return -(-row_bytes // (16 * parts)) * 16


# all_reduce_rmsnorm's "two_shot" cuts each row into slices of `world` chunks (a CTA a slice) where
# few rows leave SMs idle: a CTA sends a chunk to each peer twice (the reduce-scatter, then the
# sum), and one CTA's stores move about 7 GB/s on an H200, so 32 rows of hidden 8192 on 32 CTAs
# spend ~3.4 us storing 24 KiB each. At most RMSNORM_TWO_SHOT_MAX_PARTS slices a row, chunks of at
# least RMSNORM_TWO_SHOT_MIN_CHUNK_BYTES, every CTA resident (the slices of a row wait for each
# other's sums of squares). 4 H200s, hidden 8192 bf16, PDL (bench/probes/rmsnorm_timeline.py
# --two-shot-parts 1,2,4,8, one run: bench/results/experiments/two-shot-parts-timeline-4xH200-56fcab4.json),
# us for 1 / 2 / 4 / 8 slices a row: 1 token 11.07 / 9.66 / 7.57 / 8.48; 8 tokens 12.59 / 9.59 /
# 8.75 / 9.19; 16 tokens 12.48 / 9.79 / 9.20 / 10.02; 32 tokens 13.33 / 11.27 / 10.14; 64 tokens
# 15.63 / 12.83. Chunks of 512 bytes (8 slices of a row of 16 KiB) lose to 1 KiB (4 slices).
RMSNORM_TWO_SHOT_MAX_PARTS = 8
RMSNORM_TWO_SHOT_MIN_CHUNK_BYTES = 1024


def rmsnorm_two_shot_parts(tokens: int, row_bytes: int, world: int, sms: int) -> int:
    """Slices per row of all_reduce_rmsnorm's "two_shot" for `tokens` rows of `row_bytes` over
    `world` ranks with `sms` SMs for its grid: the most (a power of two up to
    RMSNORM_TWO_SHOT_MAX_PARTS) whose chunks hold RMSNORM_TWO_SHOT_MIN_CHUNK_BYTES and whose grid
    (a CTA a slice) fits the SMs; 1 (a CTA a row, rows strided over the CTAs) where two do not."""
    parts = 1
    while (2 * parts <= RMSNORM_TWO_SHOT_MAX_PARTS and row_bytes >= 2 * parts * world * RMSNORM_TWO_SHOT_MIN_CHUNK_BYTES
           and tokens * 2 * parts <= min(sms, MAX_CTAS)):
        parts *= 2
    return parts


def rmsnorm_split_parts(tokens: int, row_bytes: int, world: int, sms: int) -> int:
    """Slices per row of all_reduce_rmsnorm's "split" mode for `tokens` rows of `row_bytes` on
    `world` ranks of one node with `sms` SMs for its grid: the most (a power of two up to
    RMSNORM_SPLIT_MAX_PARTS) whose slices hold RMSNORM_SPLIT_MIN_SLICE_BYTES each and whose grid
    fits the SMs and the LL tiles (every CTA resident, as a slice waits for its row's others); 1
    where not even two do."""
    parts = 1
    while (2 * parts <= RMSNORM_SPLIT_MAX_PARTS and row_bytes >= 2 * parts * RMSNORM_SPLIT_MIN_SLICE_BYTES
           and tokens * 2 * parts <= min(sms, MAX_LL_TILES)):
        parts *= 2
    if parts > 1 and not tile_all_reduce_takes_ll(tokens * parts - 1, 1, rmsnorm_split_slice_bytes(row_bytes, parts),
                                                  world):
        return 1
    return parts


def rmsnorm_rows_per_cta(tokens: int, ctas: int) -> int:
    """Rows of each CTA in all_reduce_rmsnorm's "rows" mode on a grid of `ctas` (the last CTAs may
    have fewer, or none)."""
    return -(-tokens // max(1, ctas))


# all_reduce_rmsnorm "rows": a CTA with several rows normalizes this many at a time (their loads
# in flight together, their reductions side by side). On 2 H200s, hidden 8192, in turns (git
# 345ed84, bench/probes/rmsnorm_timeline.py --rows-at-once 1,2,
# bench/results/experiments/rmsnorm-rows-at-once-2xNVIDIA-H200-20261126-052212.json), us, one
# row / two at a time: 512 tokens (4 rows a CTA) 40.9 / 40.0, FP8 out 43.4 / 42.7; 2048 (16)
# 150.6 / 144.4, FP8 158.8 / 146.8. With one row a CTA two at a time is slower (1 token 9.5 /
# 9.8), so such CTAs keep one.
RMSNORM_ROWS_AT_ONCE = 2


# The largest world at which each mode with blocks of rows a CTA normalizes RMSNORM_ROWS_AT_ONCE
# rows at a time (one row above it), where two rows would spill on sm_90 (hidden 8192, 16 warps:
# 128 registers a thread): "push" sums every rank's rows at once, so two rows from 4 ranks spill;
# "push_two_shot" sums a chunk of every rank's rows, two rows spill 112 bytes at world 8 (none
# with one); "lamport" takes one row at any world, as its wait loop keeps a second row live (440
# bytes of spill at two rows). "rows" and "whole" (not listed) take two at any world, several
# nodes' too.
RMSNORM_TWO_ROWS_MAX_WORLD = {"push": 2, "push_two_shot": 4, "lamport": 0}


def rmsnorm_rows_at_once(tokens: int, ctas: int, mode: str = "rows", world: int = 2) -> int:
    """Rows a CTA of all_reduce_rmsnorm's `mode` ("rows", "whole" or a mode of blocks of rows a
    CTA) normalizes at a time over `world` ranks: RMSNORM_ROWS_AT_ONCE where it has that many and
    the world allows (RMSNORM_TWO_ROWS_MAX_WORLD), else 1."""
    if world > RMSNORM_TWO_ROWS_MAX_WORLD.get(mode, world) or rmsnorm_rows_per_cta(tokens, ctas) < RMSNORM_ROWS_AT_ONCE:
        return 1
    return RMSNORM_ROWS_AT_ONCE


def rmsnorm_mode_runs(mode: str, tokens: int, row_bytes: int, world: int, sms: int = MAX_CTAS) -> bool:
    """Whether all_reduce_rmsnorm's `mode` runs for `tokens` rows of `row_bytes` over `world`
    ranks of one node with `sms` SMs for its grid: "split" where it cuts rows into two slices or
    more (`rmsnorm_split_parts`); "two_shot" at a power-of-two world; every other mode at any
    shape."""
    if mode == "two_shot":
        return world & (world - 1) == 0
    return mode != "split" or rmsnorm_split_parts(tokens, row_bytes, world, sms) > 1


def rmsnorm_mode(tokens: int, row_bytes: int, world: int, sms: int = MAX_CTAS) -> str:
    """How `all_reduce_rmsnorm` runs for `tokens` rows of `row_bytes` over `world` ranks with
    `sms` SMs per rank for its grid (one node; several nodes run "whole" unless asked): the decode
    table's mode for the bytes of x, or where that one cannot run for the shape
    (`rmsnorm_mode_runs`) the next entry's that can; "rows", which runs at any shape, where none
    can. An FP8 out runs the same mode (its extra cost is the norm's peak and the narrower
    stores)."""
    modes = decode_table.table_for(world).rmsnorm_modes(tokens * row_bytes)
    mode = next((mode for mode in modes if rmsnorm_mode_runs(mode, tokens, row_bytes, world, sms)), "rows")
    return mode


__all__ = ["RMSNORM_ROWS_AT_ONCE", "RMSNORM_TWO_ROWS_MAX_WORLD", "RmsnormConfig", "RMSNORM_SPLIT_LAMPORT",
           "RMSNORM_SPLIT_MAX_PARTS", "RMSNORM_SPLIT_MIN_SLICE_BYTES", "RMSNORM_TWO_SHOT_MAX_PARTS",
           "RMSNORM_TWO_SHOT_MIN_CHUNK_BYTES", "rmsnorm_two_shot_parts", "rmsnorm_mode", "rmsnorm_mode_runs",
           "rmsnorm_rows_at_once", "rmsnorm_rows_per_cta", "rmsnorm_split_parts", "rmsnorm_split_slice_bytes",
           "rmsnorm_split_warps", "rmsnorm_warps", "tile_all_reduce_takes_ll"]
