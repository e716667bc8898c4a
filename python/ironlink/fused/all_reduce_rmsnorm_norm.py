"""The norm of all_reduce_rmsnorm's rows once their sum is known: residual add, RMS norm times
the weight in fp32, rounded to the tensors' dtype where stored, and with an FP8 out quantized per
token (scale = max|y| / 448). Every mode ends here, so every mode's rows are normalized by the same
code."""

from __future__ import annotations

import triton
import triton.language as tl

from .. import language as il
from ..language import typed as ilt
from ..language.fp8 import FP8_MAX


@triton.jit
def norm_row(x, residual, residual_out, weight, out, scale, row, H, eps, BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """Row `row`: residual_out = x + residual (rounded), out = its RMS norm times weight; with FP8
    quantized by the row's own scale, stored into scale[row]."""
    rows = row.to(tl.int64) + tl.arange(0, 1)
    cols = tl.arange(0, BLOCK_H)
    m = cols < H
    res = tl.load(residual + rows[:, None] * H + cols[None, :], mask=m[None, :], other=0.0)
    norm_values(x, res, tl.load(weight + cols, mask=m, other=0.0), residual_out, out, scale, rows, rows == rows, H,
                 eps, BLOCK_H, FP8)


@triton.jit
def norm_values(x, res, w, residual_out, out, scale, rows, valid, H, eps, BLOCK_H: tl.constexpr,
                 FP8: tl.constexpr):
    """`norm_row` for the rows `rows` ([R] int64, those where `valid`) at once, their residual
    rows `res` ([R, BLOCK_H]) and the weight `w` already loaded: R rows' loads in flight and their
    reductions side by side, where one row at a time waits for each in turn."""
    cols = tl.arange(0, BLOCK_H)
    m = valid[:, None] & (cols < H)[None, :]
    norm_sums(tl.load(x + rows[:, None] * H + cols[None, :], mask=m, other=0.0), res, w, residual_out, out, scale,
               rows, valid, H, eps, BLOCK_H, FP8)


@triton.jit
def norm_sums(sums, res, w, residual_out, out, scale, rows, valid, H, eps, BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """`norm_values` with the rows' all-reduced sums `sums` ([R, BLOCK_H], x's dtype) in
    registers: a CTA that has just stored them into x must not load them back (another thread of
    the CTA may have stored an element, and nothing orders a thread's load after another's store:
    push's FP8-out cases read stale sums that way on 2 H100s)."""
    cols = tl.arange(0, BLOCK_H)
    m = valid[:, None] & (cols < H)[None, :]
    at = rows[:, None] * H + cols[None, :]
    v = sums.to(tl.float32) + res.to(tl.float32)
    r = v.to(residual_out.dtype.element_ty)
    tl.store(residual_out + at, r, mask=m)
    rf = r.to(tl.float32)
    wf = w.to(tl.float32)[None, :]
    if FP8:
        # max |y| = inv * max |r * w| (inv > 0), as split mode takes it: both row reductions in one
        # pass over the CTA, not the peak's after the norm's.
        sumsq, peak = tl.reduce((rf * rf, tl.abs(rf * wf)), 1, sum_and_max)
        inv = tl.rsqrt(sumsq / H + eps)
        s = tl.maximum(peak * inv, 1e-12) / FP8_MAX
        tl.store(scale + rows, s, mask=valid)
        y = rf * inv[:, None] * wf / s[:, None]
    else:
        inv = tl.rsqrt(tl.sum(rf * rf, axis=1) / H + eps)
        y = rf * inv[:, None] * wf
    if FP8:
        # 8 FP8 bytes a thread, the bf16 stores' layout: stored 16 a thread (16 bytes, what Triton
        # picks for a byte type), the row took that layout and the bf16 stores of x and
        # residual_out went back to 8 a thread through shared memory, two bar.sync each.
        at = tl.max_contiguous(at, [1, 8])
    tl.store(out + at, y.to(out.dtype.element_ty), mask=m)


@triton.jit
def sum_and_max(sum_a, max_a, sum_b, max_b):
    """The combine of a (sum, max) pair reduction."""
    return sum_a + sum_b, tl.maximum(max_a, max_b)


@triton.jit
def norm_after_grid_barrier(s, ctx, x, residual, residual_out, weight, out, scale, T, H, eps,
                             BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """"whole" after its all-reduce (status `s`): every CTA's part of the sum visible to every CTA,
    then rows normalized grid-stride. Returns the first bad status."""
    b = il.symm_grid_barrier(ctx)
    s = ilt.failure_or(s, b)
    for row in range(tl.program_id(0), T, tl.num_programs(0)):
        norm_row(x, residual, residual_out, weight, out, scale, row, H, eps, BLOCK_H, FP8)
    return s


__all__ = ["norm_after_grid_barrier", "norm_row", "norm_sums", "norm_values", "sum_and_max"]
