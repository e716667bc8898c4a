"""Shapes and pure helpers of MoeExchange (moe/exchange.py): a send row's layout, the heap
tensors each path allocates (and so `MoeExchange.heap_bytes`), the layout a dispatch leaves for
its combine (`Layout`, every path's), a counting sort's launch shape, and the fp8 dispatch's
reference quantization in torch ops."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ..language._abi import MAX_CTAS
from . import kernels, sort
from ..runtime.tuning.moe import MoeConfig
from .low_latency_copies import COPIES


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _pow2(n: int) -> int:
    """The smallest power of two >= n (Triton block shapes)."""
    return 1 << max(0, n - 1).bit_length()


class Layout(NamedTuple):
    """What a path's dispatch gives (and its combine takes back, as the Handle's fields)."""

    counts: Any  # [local experts] int64
    offsets: Any  # [local experts] int64
    slot: Any  # [world * max_tokens, topk] int64: recv_x row of each source token's choice, -1: not here
    weight: Any  # [world * max_tokens, topk] fp32
    received: Any  # [1] int64: source tokens (rows of meta, or of the relay path's receive buffer)
    # Relay path: [T, world] int64, each token's row in the send (and combine's receive) buffer,
    # -1: not sent; the one-node paths: None.
    send_row: Any = None


class _RowLayout(NamedTuple):
    """A send row, in 2-byte words, each part starting on 16 bytes: the token (`dtype`, or its
    fp8 bytes: hidden / 2 words), its ids (int32) and weights (fp32) from meta_col, and for an fp8
    dispatch its `groups` fp32 scales from scale_col."""

    groups: int
    meta_col: int
    meta_cols: int
    scale_col: int
    row: int

    @staticmethod
    def of(hidden: int, topk: int, fp8: bool) -> "_RowLayout":
        groups = hidden // kernels.FP8_GROUP if fp8 else 0
        meta_col = hidden // 2 if fp8 else _round_up(hidden, 8)
        meta_cols = _round_up(4 * topk, 8)
        scale_col = meta_col + meta_cols
        return _RowLayout(groups, meta_col, meta_cols, scale_col, scale_col + _round_up(2 * groups, 8))


def _heap_shapes(world: int, max_tokens: int, hidden: int, row: int,
                 path: str) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The heap tensors of a MoeExchange on `path`, in allocation order: (shapes of its buffers of
    2-byte words, shapes of its int64 vectors).
    Direct path (one node): the stage (one row per token: peers pull from it) and `back` (a row
    per (rank, token): the peers' partial sums land there), then the staged token count and where
    the token rows are (the stage, or x where it lies in the heap).
    Low-latency path (one node): three copies (used by calls in turn) each of `landing` (a row
    per (rank, token): the peers push there) and `back`, then dispatch's and combine's count words
    (a word per (copy, rank, CTA)).
    Relay path (several nodes): send, receive, combine's send and receive (`world * max_tokens`
    rows each, as a token reaches a rank at most once), then five count vectors."""
    if path == "direct":
        return [(max_tokens, row), (world * max_tokens, hidden)], [(3,)]
    if path == "low_latency":
        c = COPIES.value
        return [(c, world, max_tokens, row), (c, world, max_tokens, hidden)], [(c, world, MAX_CTAS)] * 2
    rows = world * max_tokens
    return [(rows, row), (rows, row), (rows, hidden), (rows, hidden)], [(world,)] * 5


def _heap_bytes(world: int, max_tokens: int, hidden: int, topk: int, fp8: bool, align: int,
                path: str = "direct") -> int:
    """MoeExchange.heap_bytes with the heap allocator's alignment given."""
    words, counts = _heap_shapes(world, max_tokens, hidden, _RowLayout.of(hidden, topk, fp8).row, path)
    sizes = [2 * math.prod(shape) for shape in words] + [8 * math.prod(shape) for shape in counts]
    return sum(_round_up(n, align) for n in sizes)


class _Sort(NamedTuple):
    """One counting sort's launch shape and scratch (moe.sort): BB buckets' block, BR rows per block,
    PB programs per step of the scan, and the [programs, BB] histogram and base buffers."""

    bb: int
    br: int
    pb: int
    hist: Any
    base: Any

    @staticmethod
    def make(programs: int, buckets: int, choices_block: int, device: Any, config: MoeConfig) -> "_Sort":
        import torch

        bb = _pow2(buckets)
        pb = sort.scan_programs(_pow2(programs), bb, config.scan_tile)
        hist = torch.zeros(programs, bb, dtype=torch.int32, device=device)
        return _Sort(bb, sort.block_rows(choices_block, bb, config.one_hot), pb, hist, torch.zeros_like(hist))


def take_count(counts: Any) -> int:
    """The sum of `counts` (a device tensor: waits for the GPU), which is then zeroed: a count a
    path's kernels leave for `MoeExchange.check` (its out-of-range expert ids)."""
    n = int(counts.sum())
    if n:
        counts.zero_()
    return n


def fp8_quantize_reference(x: Any) -> tuple[Any, Any]:
    """(float8_e4m3fn [T, H], fp32 scales [T, H / 128]): the quantization an fp8 dispatch applies
    to rows `x` [T, H], in torch ops; the dispatched bytes and scales equal these bit for bit.
    Per 128 channels: amax = max(|x|, 1e-4), scale = amax / 448, fp8 = x * (448 / amax) rounded to
    nearest even."""
    import torch

    t, h = x.shape
    g = x.float().reshape(t, h // kernels.FP8_GROUP, kernels.FP8_GROUP)
    amax = g.abs().amax(2).clamp(min=kernels.FP8_MIN_AMAX)
    qmax = torch.full_like(amax, kernels.FP8_MAX)
    # Tensor / tensor: IEEE division as the kernel's div_rn (a Python number / tensor would be
    # computed as reciprocal times the number: two roundings).
    q = (g * (qmax / amax)[..., None]).to(torch.float8_e4m3fn)
    return q.reshape(t, h), amax / qmax


def fp8_dequantize(q: Any, scales: Any, dtype: Any = None) -> Any:
    """[T, H] in `dtype` (default fp32): fp8 rows times their per-128-channel scales."""
    import torch

    t, h = q.shape
    deq = q.float().reshape(t, h // kernels.FP8_GROUP, kernels.FP8_GROUP) * scales[..., None]
    return deq.reshape(t, h).to(dtype or torch.float32)


__all__ = ["Layout", "fp8_dequantize", "fp8_quantize_reference"]
