"""The row-moving Triton kernels of MoeExchange (triton/ironlink/moe.py): local copies and
reductions around its two all_to_all_v exchanges. None of them talks to a peer.

Rows are `hidden` elements of a 2-byte dtype; every kernel walks a row in BLOCK-element chunks
(16-byte vectors per thread). Kernels whose row count is only known on the device (it came from
the peers) run a fixed grid that strides over the rows up to a count read from device memory, so
a CUDA graph replays them correctly when the routing changes.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Measured on one H200 at the benchmark's largest shapes (bench/moe_kernels_sweep.py,
# bench/results/experiments/moe-kernels-sweep-1xH200-20261123.log): 2048-element chunks, 4 warps and
# 8 programs per SM copy 32768 expert rows in 240 us (3.9 TB/s of HBM traffic) and reduce them in
# 219 us, against 323 and 272 us with 1024, 4 warps and 4 per SM.
BLOCK = 2048  # elements per chunk: 128 threads x 16 bf16 = two 16-byte vectors each
WARPS = 4
PROGRAMS_PER_SM = 8  # the grid of the kernels that stride over rows counted on the device


@triton.jit
def pack_rows(x, meta, send_row, out, hidden, meta_col, meta_cols, out_stride,
              WORLD: tl.constexpr, BLOCK: tl.constexpr, META_BLOCK: tl.constexpr):
    """Token t's row of `x` (at column 0) and of `meta` (at column meta_col) into row
    send_row[t, p] of `out`, for every rank p the token goes to (send_row < 0: not to p). One
    program per token: its row is loaded once and stored up to WORLD times."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    for c in range(0, hidden, BLOCK):
        m = c + offs < hidden
        v = tl.load(x + t * hidden + c + offs, mask=m)
        for p in tl.static_range(WORLD):
            r = tl.load(send_row + t * WORLD + p)
            tl.store(out + r * out_stride + c + offs, v, mask=m & (r >= 0))
    mo = tl.arange(0, META_BLOCK)
    mm = mo < meta_cols
    v = tl.load(meta + t * meta_cols + mo, mask=mm)
    for p in tl.static_range(WORLD):
        r = tl.load(send_row + t * WORLD + p)
        tl.store(out + r * out_stride + meta_col + mo, v, mask=mm & (r >= 0))


@triton.jit
def gather_rows(src, src_stride, index, count, limit, out, hidden, BLOCK: tl.constexpr):
    """out[i, :hidden] = src[index[i], :hidden] for i < min(count[0], limit), grid-strided."""
    n = tl.minimum(tl.load(count).to(tl.int64), limit)
    offs = tl.arange(0, BLOCK)
    for i in range(tl.program_id(0).to(tl.int64), n, tl.num_programs(0)):
        s = tl.load(index + i)
        for c in range(0, hidden, BLOCK):
            m = c + offs < hidden
            tl.store(out + i * hidden + c + offs, tl.load(src + s * src_stride + c + offs, mask=m), mask=m)


@triton.jit
def weighted_partial_sums(y, slot, weight, count, out, hidden, K: tl.constexpr, BLOCK: tl.constexpr):
    """out[r] = sum over j < K (in order) of weight[r, j] * y[slot[r, j]] in fp32, skipping
    slot < 0, for r < count[0], grid-strided: each received token's outputs of this rank's experts,
    reduced before they travel back."""
    n = tl.load(count).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    for r in range(tl.program_id(0).to(tl.int64), n, tl.num_programs(0)):
        for c in range(0, hidden, BLOCK):
            m = c + offs < hidden
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for j in tl.static_range(K):
                s = tl.load(slot + r * K + j)
                w = tl.load(weight + r * K + j)
                v = tl.load(y + s * hidden + c + offs, mask=m & (s >= 0), other=0.0)
                acc += tl.where(s >= 0, w, 0.0) * v.to(tl.float32)
            tl.store(out + r * hidden + c + offs, acc.to(out.dtype.element_ty), mask=m)


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


__all__ = ["BLOCK", "PROGRAMS_PER_SM", "WARPS", "gather_rows", "pack_rows", "sum_rank_rows", "weighted_partial_sums"]
