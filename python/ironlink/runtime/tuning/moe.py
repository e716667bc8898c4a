"""MoeExchange's launch choices in one frozen object (`MoeConfig`; `DEFAULT_MOE_CONFIG`, the measured ones):
the block sizes, warps and grid sizes of its kernels and the token limit of its low-latency path.
`MoeExchange(..., config=)` takes one (as DeepEP's `Buffer` takes a `Config`) and hands it to its
path's object, which reads every launch choice from it: an experiment (bench/moe.py's flags) makes
a config of its own, nothing sets a module global. What a kernel's code fixes (its layout
constants: SOURCE_WORDS, NO_ROOM, COPIES, MAX_CTAS, the fp8 group) stays in its module.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# Fields that size a Triton block or a launch's warps: powers of two.
# (ctas_per_sm too: it divides pull_rows, push_block and push_warps.)
_POWERS_OF_TWO = ("row_block", "row_warps", "one_hot", "scan_tile", "scan_warps", "pull_block", "pull_rows",
                  "push_block", "push_warps", "ctas_per_sm", "direct_warps", "meta_block_rows", "low_latency_block",
                  "low_latency_warps")


@dataclass(frozen=True)
class MoeConfig:
    """How MoeExchange launches its kernels (every field has the measured default; give the ones to
    change: `MoeConfig(pull_rows=2)`, or `dataclasses.replace(DEFAULT_MOE_CONFIG, ...)`). The same on every
    rank: the exchanges pair the ranks' same-index CTAs."""

    # The row kernels that stride over rows counted on the device (moe/kernels.py, relay_kernels.py;
    # the direct path's pack and sum_partials). Measured on one H200 at the benchmark's largest
    # shapes (bench/probes/moe_kernels_sweep.py,
    # bench/results/experiments/moe-kernels-sweep-1xH200-20261123.log): 2048-element chunks, 4
    # warps and 8 programs per SM copy 32768 expert rows in 240 us (3.9 TB/s of HBM traffic) and
    # reduce them in 219 us, against 323 and 272 us with 1024, 4 warps and 4 per SM.
    row_block: int = 2048  # elements per chunk: 128 threads x 16 bf16 = two 16-byte vectors each
    row_warps: int = 4
    programs_per_sm: int = 8  # per SM of the budget

    # The counting sorts (moe/sort.py). Programs of the histogram and place kernels on a GPU (a few
    # rows each at the largest shapes).
    sort_programs: int = 128
    # Elements of the one-hot [items, buckets] block a program ranks at once: 1024 gave dispatch 41
    # us at 128 tokens on one H200 against 49 with 256 or 4096, the same at 4096 and 8192 tokens
    # (bench/results/experiments/moe-sort-sweep-1xH200-20261125.log; 8192 made rank_place spill).
    one_hot: int = 1024
    # Elements of the [programs, buckets] histogram tile bucket_scan reads at once: 8192 takes the
    # 128 programs' histograms of up to 64 buckets in one step (with 1024, 5.3 us per scan at 64
    # local experts on one H200, the largest sort kernel at 128 tokens).
    scan_tile: int = 8192
    # bucket_scan's warps: with 4, its 8192-element tile (and the scan over it) spilled 172 bytes
    # on sm_90 once the pointers were specialized as at a launch (Triton 3.6); with 8 none.
    scan_warps: int = 8

    # The direct path (moe/direct_kernels.py). pull_rows loads a whole row per step where it can
    # (16 KiB per row with 8 warps), pull_rows rows at once per SM: a peer load waits a NVLink
    # round trip. On 2 H200s (dispatch us, 4096 / 128 tokens per rank, uniform; git aec1f0e,
    # bench/moe.py --pull-rows): on 16 SMs 1146.6 / 56.9 with one row, 890.9 / 50.9 with two,
    # 794.1 / 48.9 with four; on all 132 SMs 343.5 / 34.8, 352.8 / 35.7, 340.5 / 34.8 (on all
    # SMs more rows in flight change nothing measurable).
    pull_block: int = 8192
    pull_rows: int = 4
    # reduce_push keeps K rows' chunks live at once (K loads issued together): push_block elements
    # per SM over push_warps warps, 512 per warp, the per-thread share of weighted_partial_sums
    # (2048 over 4 warps), which compiles without spills at K = 8 (94-105 registers on sm_90). A
    # whole row of hidden 7168 per step over 16 warps keeps twice the loads in flight per SM:
    # combine on 2 H200s (us, 4096 / 128 tokens per rank, uniform; git 324ac61, bench/moe.py
    # --push-block --push-warps): 4096 over 8 warps 361.7 / 21.0 on 132 SMs, 2062.9 / 54.4 on 16;
    # 4096 over 16 341.7 / -, 1573.0 / -; 8192 over 16 325.3 / 22.3, 1456.6 / 48.1.
    push_block: int = 8192
    push_warps: int = 16
    # With every SM in the budget, pull_rows' and reduce_push's per-SM shares above are split over
    # ctas_per_sm CTAs per SM (grids capped at MAX_CTAS): a CTA has one token's loads in flight at
    # a time (its meta, then the rows they point at; no CTA barrier in the loop, the PTX shows), so
    # two CTAs keep two tokens' loads going per SM (loading the next token's meta early did not
    # help on top of that: docs/record.md, Session 30). On 2 H100s (4096 tokens per rank, us
    # uniform / skewed, git bf890ea+, bench/moe.py --ctas-per-sm): reduce_push 251-255 / 267 ->
    # 232 / 242-246, dispatch + combine 589-592 / 624 -> 562 / 587. With a smaller budget one CTA
    # per SM: the hardware would spread twice the CTAs over twice the SMs.
    ctas_per_sm: int = 2
    direct_warps: int = 8  # gather_meta's, and pull_rows' at 2048 elements a step and up
    meta_block_rows: int = 32  # rows of ids and weights gather_meta copies per step

    # The low-latency path (moe/low_latency_kernels.py): elements of a row moved per step (a whole
    # row of hidden 7168) and its kernels' warps.
    low_latency_block: int = 8192
    low_latency_warps: int = 8
    # MoeExchange takes its low-latency path (one kernel each for dispatch and combine, recv_x by
    # expert block: moe/low_latency.py) for up to this many tokens per rank on one node (any
    # dispatch dtype, no recv_capacity; fp8 dispatch + combine at 128 tokens 33.4 us low-latency /
    # 55.4 direct, git 01cf02b). Dispatch + combine on 2 H200s, hidden 7168, top-8 of 64, us,
    # low-latency / direct (git dc488a3, bench/moe.py): 1 token 25.2 / 41.1, 32 27.1 / 44.5, 128
    # 35.1 / 55.1, 512 101.4 / 121.8 (uniform; skewed alike). Its recv_x takes num_experts *
    # max_tokens rows (an expert block holds every token of every rank) where the direct path's
    # takes world * max_tokens * topk: 4x at top-8 of 64 on 2 ranks. The limit keeps that to a
    # decode batch's size; 0: never by default.
    low_latency_max_tokens: int = 256

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"MoeConfig.{f.name} must be an int, got {v!r}")
            least = 0 if f.name == "low_latency_max_tokens" else 1
            if v < least:
                raise ValueError(f"MoeConfig.{f.name} must be at least {least}, got {v}")
            if f.name in _POWERS_OF_TWO and v & (v - 1):
                raise ValueError(f"MoeConfig.{f.name} sizes a Triton block or warps: a power of two, got {v}")


DEFAULT_MOE_CONFIG = MoeConfig()


__all__ = ["DEFAULT_MOE_CONFIG", "MoeConfig"]
