"""Launch configs (CTAs, num_warps) of ironlink's host-level collectives.

The measurements live in `tuning_table.py`, generated from a benchmark by `bench/report/make_tuning.py`;
this module only looks them up.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, Mapping, NamedTuple, Optional, Sequence

from ..language._abi import MAX_CTAS, MAX_LL_TILES, MAX_RANKS, MAX_TILES, SIGNAL_LAYOUT, THRESHOLDS
from . import decode_table
from .tuning_table import ALGORITHM_LIMITS, TABLES

Tables = Mapping[str, Mapping[int, Sequence[tuple[int, int, int]]]]


def choose(collective: str, nbytes: int, world: int, tables: Tables = TABLES) -> tuple[int, int]:
    """(ctas, num_warps) for a `collective` of `nbytes` bytes over `world` ranks.

    A size between two measured ones takes the next larger one's config (above the largest, the
    largest's); an unmeasured world size takes the nearest measured one's table (larger on a tie).
    The result depends only on the arguments, so every rank launches the same grid."""
    by_world = tables.get(collective)
    if by_world is None:
        raise ValueError(f"no tuning for {collective!r}; known: {', '.join(tables)}")
    w = min(by_world, key=lambda m: (abs(m - world), -m))
    ctas, warps = 1, 4
    for max_bytes, ctas, warps in by_world[w]:
        if nbytes <= max_bytes:
            break
    return max(1, min(MAX_CTAS, ctas)), warps


# Context limits (one_shot_max_bytes, ll_max_bytes, gather_ll_max_bytes) under which each
# algorithm is the one chosen wherever its packets fit: how the benchmark and the GPU suite
# measure and test every algorithm at every size.
_ALWAYS = 1 << 62
FORCED_LIMITS: dict[str, tuple[int, int, int]] = {
    "one_shot_ll": (_ALWAYS, _ALWAYS, 0),
    "two_shot_ll": (0, _ALWAYS, 0),
    "two_shot": (0, 0, 0),
    "gather_ll": (0, 0, _ALWAYS),
    "gather_bulk": (0, 0, 0),
}


def algorithm_limits(
    world: int, limits: Mapping[int, tuple[int, int, int]] = ALGORITHM_LIMITS
) -> Optional[tuple[int, int, int]]:
    """The measured algorithm limits (one_shot_max_bytes, ll_max_bytes, gather_ll_max_bytes) for
    `world` ranks: the nearest measured world size's (larger on a tie); None if nothing was
    measured."""
    if not limits:
        return None
    w = min(limits, key=lambda m: (abs(m - world), -m))
    return limits[w]


# all_to_all_v's grid, by a bound on the bytes it moves that is the same on every rank (its ranks
# send different amounts, and CTAs are matched by index, so the grid cannot follow the counts):
# (max_bytes, ctas), ascending; above the last, the last. ironlink.all_to_all_v called without
# `ctas` takes the first (small exchanges); MoeExchange passes its buffers' size.
ALL_TO_ALL_V_CTAS: tuple[tuple[int, int], ...] = ((1 << 20, 32), (1 << 62, 132))


def all_to_all_v_launch(max_bytes: int = 0) -> tuple[int, int]:
    """(ctas, num_warps) of an all_to_all_v moving at most `max_bytes` per rank."""
    ctas = ALL_TO_ALL_V_CTAS[-1][1]
    for limit, ctas in ALL_TO_ALL_V_CTAS:
        if max_bytes <= limit:
            break
    return min(ctas, MAX_CTAS), 16


# Programmatic dependent launch (ironlink.runtime.pdl, ironlink.language.pdl) for the latency-bound kernels: all_reduce_rmsnorm
# and the all_reduce op. The default of their `pdl=None`; it takes effect only on compute
# capability 9.0 and later (griddepcontrol). The all_reduce op in a graph of 20 back to back on 2
# H200s (git 93d22eb, bench/results/experiments/allreduce-public-op-2xH200-93d22eb.json), us with /
# without: 5.03 / 4.94 at 1 KiB, 4.51 / 4.64 at 4 KiB, 6.95 / 7.40 at 16 KiB, 5.64 / 5.85 at 64 KiB;
# all_reduce_rmsnorm: bench/fused.py's [rows] and [rows,pdl] rows (docs/fused.md).
DECODE_PDL = True


# --- fused ops (ironlink.fused) ------------------------------------------------------------------

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
# the world size (runtime/decode_table.py: a user's tuning file from `python -m ironlink.tune`,
# else the committed runtime/tables/decode-w{world}.json, else one derived from the nearest world).
# The committed tables are the tuner's runs on H200s (their files hold every timing). Before the
# tuner, world 2's choices were made by hand from these measurements (docs/record.md has the rest):
# - all_reduce_rmsnorm "split" up to 256 KiB: below, after RMSNORM_SPLIT_MAX_PARTS.
# - "lamport" up to 8 MiB: below, after RMSNORM_SPLIT_LAMPORT.
# - "push" (rows stored into the peers' slots, a tile signal per CTA: the bytes cross NVLink once
#   where LL packets double them) up to 32 MiB. 2 H200s, hidden 8192 bf16, push + PDL against rows
#   + PDL (git 7bc5bf5, bench/results/fused-2xNVIDIA-H200-20261126-074602.json): 1 token 13.5 /
#   10.6 us, 8 9.4 / 9.9, 32 10.2 / 13.0, 128 13.4 / 19.3, 512 39.2 / 41.3, 2048 162.5 / 153.7. With
#   a CTA's rows pipelined in chunks (git 85d32ab, 2 H100s, bench/ab.sh, two runs each): 2048 tokens
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

# ironlink.all_reduce through lamport slots (language/slots.py: each CTA's elements stored into every
# peer, read as they land, no signal, barrier or fence), where the decode table takes it on one
# node, runs a CTA per ALL_REDUCE_LAMPORT_CTA_BYTES of ALL_REDUCE_LAMPORT_WARPS warps (one 16-byte
# unit a thread). Why world 2 takes it up to 256 KiB: 2 H100s, bf16, graph us, lamport / the
# device library's one-shot LL (the op's default before), in turns (git 55e318e, its loads still
# 2 bytes wide, bench/results/experiments/allreduce-lamport-2xH100-55e318e.json): 1 KiB 4.09 /
# 4.80, 4 KiB 4.21 / 4.51, 16 KiB 4.51 / 4.67, 64 KiB 4.56 / 5.03, 256 KiB 5.80 / 6.33. With
# 16-byte units (git 0ed3781, allreduce-lamport-on-2xH100-0ed3781.json): 4.09 / 4.99, 3.99 / 4.84,
# 4.66 / 5.43, 4.09 / 5.07, 4.59 / 6.17 (NCCL 9.7-11.4).
ALL_REDUCE_LAMPORT_CTA_BYTES = 2 << 10
ALL_REDUCE_LAMPORT_WARPS = 4


def all_reduce_takes_lamport(nbytes: int, world: int) -> bool:
    """Whether ironlink.all_reduce of `nbytes` over `world` ranks of one node runs through lamport
    slots (the decode table's all_reduce path, `decode_table.table_for`)."""
    return nbytes > 0 and decode_table.table_for(world).all_reduce_path(nbytes) == "lamport"


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


def rmsnorm_rows_at_once(tokens: int, ctas: int, push_world: int = 0) -> int:
    """Rows a CTA of all_reduce_rmsnorm's "rows" and "push" modes normalizes at a time:
    RMSNORM_ROWS_AT_ONCE where it has that many, else 1. "push" over more than 2 ranks
    (`push_world`) takes one: its sum keeps every rank's row in flight, and two rows of hidden 8192
    from 4 ranks spill on sm_90 (16 warps: 128 registers a thread)."""
    if push_world > 2 or rmsnorm_rows_per_cta(tokens, ctas) < RMSNORM_ROWS_AT_ONCE:
        return 1
    return RMSNORM_ROWS_AT_ONCE


def rmsnorm_mode_runs(mode: str, tokens: int, row_bytes: int, world: int, sms: int = MAX_CTAS) -> bool:
    """Whether all_reduce_rmsnorm's `mode` runs for `tokens` rows of `row_bytes` over `world`
    ranks of one node with `sms` SMs for its grid: "split" where it cuts rows into two slices or
    more (`rmsnorm_split_parts`); every other mode at any shape."""
    return mode != "split" or rmsnorm_split_parts(tokens, row_bytes, world, sms) > 1


def rmsnorm_mode(tokens: int, row_bytes: int, world: int, sms: int = MAX_CTAS) -> str:
    """How `all_reduce_rmsnorm` runs for `tokens` rows of `row_bytes` over `world` ranks with
    `sms` SMs per rank for its grid (one node; several nodes run "whole" unless asked): the decode
    table's mode for the bytes of x, or where that one cannot run for the shape
    (`rmsnorm_mode_runs`) the next entry's that can; "rows", which runs at any shape, where none
    can."""
    modes = decode_table.table_for(world).rmsnorm_modes(tokens * row_bytes)
    return next((mode for mode in modes if rmsnorm_mode_runs(mode, tokens, row_bytes, world, sms)), "rows")


# all_gather_matmul / matmul_reduce_scatter (ironlink.fused): how they run, by M (rows of the
# whole product). "collective": one ironlink collective and one cuBLAS GEMM; "overlap": the GEMM
# split by rank block, overlapped with copy-engine transfers; "kernel": the one-kernel Triton
# version (fused/all_gather_matmul.py, fused/matmul_reduce_scatter.py). (largest M, method) in
# increasing M; past the last, the last. Measured on 4 H200s, K = N = 8192, bf16
# (bench/results/fused-4xNVIDIA-H200-20261122-183637.json): all_gather_matmul collective 96 /
# overlap 109 us at M = 1024, 350 / 290 at 4096; matmul_reduce_scatter collective 28 / overlap 52
# at M = 128, 102 / 89 at 1024. The kernel method was slowest at every M.
SP_METHODS: dict[str, tuple[tuple[int, str], ...]] = {
    "all_gather_matmul": ((2048, "collective"), (1 << 62, "overlap")),
    "matmul_reduce_scatter": ((512, "collective"), (1 << 62, "overlap")),
}
# Where a world size has its own table. World 2, on 2 H200s, us: all_gather_matmul collective
# 39.7 / 41.8 against overlap 64.5 / 63.5 at M = 128, overlap 116.2 / 113.9 against collective
# 130.3 / 127.0 at 1024 (git 784be2d, 7b34909: bench/results/fused-2xNVIDIA-H200-20261125-234653.json,
# -20261126-021817.json); matmul_reduce_scatter collective 37.0 / 35.5 against kernel 53.8 / 53.6
# at M = 128, and its kernel (two-shot by slices, TMA pushes) fastest from 1024 up, with the
# contenders timed in turns (9bbf473, -20261126-050609.json): 125.0 / 444.8 / 1857.8 at 1024 /
# 4096 / 16384 against overlap 130.0 / 453.9 / 2054.5 (timed one after another, as before, the
# overlap method ran first and looked level at 16384).
SP_METHODS_BY_WORLD: dict[int, dict[str, tuple[tuple[int, str], ...]]] = {
    2: {"all_gather_matmul": ((512, "collective"), (1 << 62, "overlap")),
        "matmul_reduce_scatter": ((512, "collective"), (1 << 62, "kernel"))},
}
SP_METHOD_NAMES = ("kernel", "collective", "overlap")
# all_gather_matmul's kernel: the pieces each own-row tile's K loop is cut into, one piece of the
# push of the shard before each (fused/all_gather_matmul_kernels.py).
ALL_GATHER_MATMUL_PUSH_SEGMENTS = 4
# all_gather_matmul's kernel on one node with a contiguous shard: the copy engine moves the shard
# to every peer (announced through heap flags) and the kernel's CTAs only compute; False: the
# kernel's CTAs push the shard themselves (above).
ALL_GATHER_MATMUL_COPY_ENGINE = True
# matmul_reduce_scatter's kernel on one node: from a rank's block of this many rows on
# (M // world), its partials are stored locally and moved by the copy engine
# (`matmul_reducescatter_copy_engine_kernel`); below it, and with None, the kernel's CTAs push
# them (`matmul_reducescatter_kernel`); 0: the copy engine at every M. Graph us, copy engine /
# CTAs' pushes / torch_symm_fused, 2 H200s:
# - M = 1024 (512 rows a block): 160.3 / 123.6 / 125.6 (session 39, bench/results/experiments/
#   fused-rs-copy-engine-every-m-2xNVIDIA-H200-16ab847.json; why is not probed);
# - M = 2048 / 4096 / 8192 / 16384: 211.0 / 231.5 / 234.9, 415.1 / 461.3 / 484.9, 875.0 / 907.9 /
#   956.7, 1789.5 / 1797.5 / 2025.8 (session 38, bench/results/experiments/
#   fused-copy-engine-2xNVIDIA-H200-20261127.json).
MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS: int | None = 1024


def matmul_reduce_scatter_takes_copy_engine(block_rows: int) -> bool:
    """Whether matmul_reduce_scatter's kernel on one node, with blocks of `block_rows` rows a
    rank, has the copy engine move its partials (MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS)."""
    least = MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS
    return least is not None and block_rows >= least


# The copy-engine kernels, by op: a block of a rank's rows is cut into at least this many chunks
# (the GEMM's GROUP_M halved until it is, down to 1). matmul_reduce_scatter's own tiles wait for
# the peers' copies of the same rows, which start only when a whole chunk is computed: with one
# chunk a block (GROUP_M 8, 1024 rows, M = 2048) its copy-engine kernel took 265.9 us, with 2
# chunks 211.0, with 4 215.3; at M = 4096, 8192, 16384 2 / 1 / 4 chunks at least: 415.1 / 416.1 /
# 426.8, 875.0 / 879.1 / 879.4, 1789.5 / 1790.5 / 1795.0. all_gather_matmul's kernel reads the
# peers' rows only after its own: GROUP_M as planned / 4 chunks at least 201.4 / 211.6 (M = 2048),
# 393.3 / 385.0 (M = 4096). 2 H200s, session 38
# (bench/results/experiments/fused-copy-engine-2xNVIDIA-H200-20261127.json).
COPY_ENGINE_MIN_CHUNKS = {"all_gather_matmul": 1, "matmul_reduce_scatter": 2}


def sp_method(op: str, m: int, world: int = 0) -> str:
    """How the sequence-parallel op `op` runs for an M-row product at `world` ranks (see
    SP_METHODS and SP_METHODS_BY_WORLD; world 0: the general table)."""
    table = SP_METHODS_BY_WORLD.get(world, {}).get(op, SP_METHODS[op])
    return next((method for limit, method in table if m <= limit), table[-1][1])


def check_sp_method(method: str) -> str:
    """`method` if it names a sequence-parallel method, else ValueError."""
    if method not in SP_METHOD_NAMES:
        raise ValueError(f"method must be one of {SP_METHOD_NAMES}, got {method!r}")
    return method


class MatmulConfig(NamedTuple):
    """A Triton GEMM tile configuration (of `matmul_all_reduce`)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    warps: int
    stages: int

    def tiles(self, m: int, n: int) -> int:
        """Tiles of this shape in an [m, n] output (partial tiles at the edges count)."""
        return -(-m // self.block_m) * -(-n // self.block_n)


# (largest M, config) in increasing M; past the last, the last. Small M is bound by reading B:
# narrow tiles give every SM a share of it. Large M: 128 x 256 tiles measured fastest of three on
# 4 H200s (bench/results/experiments/fused-matmul-configs-4xNVIDIA-H200-20261122-125605.json: 161 / 621 us at M = 1024 /
# 4096, against 186 / 719 for 128 x 128 and 254 / 998 for 128 x 64).
MATMUL_CONFIGS: tuple[tuple[int, MatmulConfig], ...] = (
    (16, MatmulConfig(16, 64, 128, 8, 4, 4)),
    (32, MatmulConfig(32, 64, 128, 8, 4, 4)),
    (64, MatmulConfig(64, 64, 64, 8, 4, 4)),
    (256, MatmulConfig(64, 128, 64, 8, 4, 4)),
    (1 << 62, MatmulConfig(128, 256, 64, 8, 8, 3)),
)


# matmul_all_reduce "push": the CTAs push their previous tile at STAGGER different points of the
# current tile's K loop (CTA c at (c % STAGGER) / STAGGER of it), so partials leave over the whole
# tile time instead of in one burst that queues every CTA behind a full NVLink.
MATMUL_PUSH_STAGGER = 8
# matmul_all_reduce "push", two-shot: a CTA signals its last tile's pushes after this share of
# its next tile's K loop (the pushes drain behind the GEMM; the signal waits for them). Measured on
# 2 H100s at M = 4096 / 1024 (graph us): 0.0 497.5 / 142.5, 0.5 465.3 / 139.0, 1.0 477.3 / 141.7
# (bench/results/experiments/fused-timeline-two-shot-2xNVIDIA-H100-20261125-2036.json).
MATMUL_SIGNAL_AT = 0.5
# matmul_all_reduce "push", two-shot: one K loop per tile in a flattened tile loop (Triton pipelines
# loads across tiles), the signal after it and the epilogue in halves; MATMUL_SIGNAL_AT then
# unused. The GEMM alone that way: 369.9 us at M = 4096 against 391.2 nested and cuBLAS's 366.5
# (bench/results/experiments/gemm-probe-2xNVIDIA-H100-20261125.json).
MATMUL_FLAT = True


def matmul_flat(cc_major: int) -> bool:
    """Whether matmul_all_reduce's two-shot kernel runs its flattened loop on a GPU of compute
    capability `cc_major`.x: Hopper only, where it was measured and fits shared memory (on sm_100
    Triton 3.5 pipelines it into 245,808 bytes, over the 232,448 a CTA may have)."""
    return MATMUL_FLAT and cc_major == 9


# matmul_all_reduce "push" at world 2: one-shot while the tiles take at most this many waves of
# the CTAs. At M = 1024 (256 tiles of 128 x 256 on 132 CTAs: two waves) one-shot beat two-shot in
# four of five runs (graph us, one-shot / two-shot): 2 H200s 132.7 / 138.6 (git 784be2d) and
# 131.9 / 139.5 (7b34909); 2 H100s 139.0 / 142.4 (6759c28) and 136.3 / 141.6 (99b169a); level
# in the fifth (138.6 / 138.9, 2 H200s, f2ca070); at M = 4096 (eight waves) two-shot won each
# time (462.8 / 490.0 on 2 H200s at 7b34909).
MATMUL_ONE_SHOT_MAX_WAVES = 2
# At world 2, matmul_all_reduce's two-shot kernel (flattened loop) and matmul_reduce_scatter's
# kernel signal their pushes every this many tiles with one release (`symm_tile_signal_batch`).
# With all 132 CTAs signalling, one signal costs a CTA 1.9 us with nothing written before it and
# 4.6 us after a TMA push (2 H200s, bench/probes/signal_probe.py). matmul_all_reduce at M = 4096, graph
# us, batches of 1 / 2 / 4 / 8 (2 H200s, git 5a2a6ff, one run of bench/fused.py): 485.3 / 470.1 /
# 462.4 / 465.0 (bench/results/experiments/fused-signal-batch-ab-2xH200-5a2a6ff.json).
MATMUL_SIGNAL_EVERY = 4
# matmul_all_reduce "push", one-shot: after the tile loop, the last tile's push in chunks with the
# reduce of the tile before between them (`push_while_reducing`), rather than the push first.
MATMUL_TAIL_INTERLEAVED = True


def matmul_one_shot(tiles: int, ctas: int, world: int) -> bool:
    """matmul_all_reduce "push": one-shot (every rank sums every tile, one NVLink hop) at world 2
    while the tiles take at most MATMUL_ONE_SHOT_MAX_WAVES waves, where latency rules; else
    two-shot by slices (each rank sums its slice: less extra memory traffic, a shorter tail)."""
    return world == 2 and tiles <= MATMUL_ONE_SHOT_MAX_WAVES * ctas


def matmul_method(tiles: int, ctas: int, world: int) -> str:
    """matmul_all_reduce's method on one node for `tiles` output tiles on a grid of `ctas`:
    "lamport" at world 2 while every tile is in the first wave (each CTA's tile goes out from
    registers as it is done and is read as it lands; a CTA with more tiles would wait on each),
    else "push" (producer / consumer: no CTA waits for a peer before its next tile). 2 H200s, N =
    8192, K = 4096, graph us, lamport / push / torch.matmul + ironlink.all_reduce, one run (git
    21a219a, bench/results/fused-2xNVIDIA-H200-20261126-222454.json): M = 16 (128 tiles of 16 x 64)
    21.4 / 25.9 / 25.0; 128 (128 of 64 x 128) 33.6 / 37.1 / 37.7; 1024 (256 of 128 x 256, two
    waves) 154.2 / 140.2 / 161.9."""
    return "lamport" if world == 2 and tiles <= ctas else "push"


def matmul_config(m: int, n: int, k: int, world: int) -> MatmulConfig:
    """The tile configuration for an [m, k] x [k, n] matmul + all-reduce: from `MATMUL_CONFIGS`,
    widened until the output has at most MAX_TILES tiles (each tile has its own slot)."""
    del k, world
    cfg = next((c for limit, c in MATMUL_CONFIGS if m <= limit), MATMUL_CONFIGS[-1][1])
    while cfg.tiles(m, n) > MAX_TILES and cfg.block_n < 256:
        cfg = cfg._replace(block_n=cfg.block_n * 2)
    while cfg.tiles(m, n) > MAX_TILES and cfg.block_m < 256:
        cfg = cfg._replace(block_m=cfg.block_m * 2)
    return cfg



@contextlib.contextmanager
def overridden(**values: Any) -> Iterator[None]:
    """Sets the tuning names given (names of this module: a typo raises AttributeError) to these
    values for the block, then restores them: for benchmarks and tests that time or check a choice
    the tables do not make. The ops read the tables when they plan a call, so a CUDA graph keeps
    what its capture chose."""
    module = sys.modules[__name__]
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


__all__ = ["ALGORITHM_LIMITS", "ALL_GATHER_MATMUL_COPY_ENGINE", "ALL_GATHER_MATMUL_PUSH_SEGMENTS", "ALL_TO_ALL_V_CTAS", "COPY_ENGINE_MIN_CHUNKS", "all_to_all_v_launch", "FORCED_LIMITS", "MATMUL_CONFIGS", "MATMUL_ONE_SHOT_MAX_WAVES", "MATMUL_SIGNAL_EVERY", "MATMUL_TAIL_INTERLEAVED", "MATMUL_FLAT", "MATMUL_PUSH_STAGGER", "MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS", "MATMUL_SIGNAL_AT", "MAX_CTAS", "MatmulConfig",
           "ALL_REDUCE_LAMPORT_CTA_BYTES", "ALL_REDUCE_LAMPORT_WARPS", "RMSNORM_SPLIT_LAMPORT", "RMSNORM_ROWS_AT_ONCE", "SP_METHODS", "SP_METHODS_BY_WORLD", "SP_METHOD_NAMES", "TABLES", "algorithm_limits", "all_reduce_takes_lamport", "check_sp_method", "choose", "matmul_config", "matmul_flat", "matmul_method", "matmul_one_shot", "matmul_reduce_scatter_takes_copy_engine", "overridden", "rmsnorm_mode", "rmsnorm_mode_runs", "rmsnorm_rows_at_once", "rmsnorm_rows_per_cta", "rmsnorm_split_warps", "rmsnorm_warps", "sp_method",
           "tile_all_reduce_takes_ll"]
