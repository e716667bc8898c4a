"""The Triton kernels of MoeExchange's relay path (moe/relay.py): the local copies and reductions
around its two all_to_all_v exchanges. None of them talks to a peer.

Rows are `hidden` elements of a 2-byte dtype (an fp8 row counts as hidden / 2 words, copied
unchanged), walked in BLOCK-element chunks (MoeConfig.row_block). The row count of each kernel is only known on the
device (it came from the peers), so each runs a fixed grid that strides over the rows up to a
count read from device memory: a CUDA graph replays them correctly when the routing changes.
The weighted sum of combine is `kernels.weighted_chunk`, the one every path calls, so the paths'
bits agree.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels import weighted_chunk


@triton.jit
def gather_rows(src, src_stride, index, count, limit, out, hidden, side_col, side_out, side_cols,
                BLOCK: tl.constexpr, SIDE_BLOCK: tl.constexpr):
    """out[i, :hidden] = src[index[i], :hidden] for i < min(count[0], limit), grid-strided; with
    SIDE_BLOCK > 0 also side_out[i, :side_cols] = src[index[i], side_col : side_col + side_cols]
    (an fp8 dispatch's scales, copied with their row)."""
    n = tl.minimum(tl.load(count).to(tl.int64), limit)
    offs = tl.arange(0, BLOCK)
    for i in range(tl.program_id(0).to(tl.int64), n, tl.num_programs(0)):
        s = tl.load(index + i)
        for c in range(0, hidden, BLOCK):
            m = c + offs < hidden
            tl.store(out + i * hidden + c + offs, tl.load(src + s * src_stride + c + offs, mask=m), mask=m)
        if SIDE_BLOCK > 0:
            so = tl.arange(0, SIDE_BLOCK)
            sm = so < side_cols
            tl.store(side_out + i * side_cols + so, tl.load(src + s * src_stride + side_col + so, mask=sm), mask=sm)


@triton.jit
def weighted_partial_sums(y, slot, weight, count, out, hidden, K: tl.constexpr, BLOCK: tl.constexpr):
    """out[r] = `weighted_chunk` of row r, for r < count[0], grid-strided: each received token's
    outputs of this rank's experts, reduced before they travel back."""
    n = tl.load(count).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    for r in range(tl.program_id(0).to(tl.int64), n, tl.num_programs(0)):
        for c in range(0, hidden, BLOCK):
            acc = weighted_chunk(y, slot, weight, r, c, hidden, K, BLOCK)
            tl.store(out + r * hidden + c + offs, acc.to(out.dtype.element_ty), mask=c + offs < hidden)


@triton.jit
def sum_rank_rows(rows, send_row, out, hidden, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """out[t] = sum over ranks p (in order) of rows[send_row[t, p]] in fp32, skipping
    send_row < 0. One program per token."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    for c in range(0, hidden, BLOCK):
        m = c + offs < hidden
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for p in tl.static_range(WORLD):
            r = tl.load(send_row + t * WORLD + p)
            acc += tl.load(rows + r * hidden + c + offs, mask=m & (r >= 0), other=0.0).to(tl.float32)
        tl.store(out + t * hidden + c + offs, acc.to(out.dtype.element_ty), mask=m)


__all__ = ["gather_rows", "sum_rank_rows", "weighted_partial_sums"]
