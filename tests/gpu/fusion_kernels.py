"""Triton kernels that fuse ironlink calls into producers: run by fusion_worker.py on GPUs and
compiled for sm_80/90/100 without a GPU by tests/test_fusion_compile.py."""

from __future__ import annotations

import triton
import triton.language as tl

import ironlink
import ironlink.language as il
from ironlink.constants import REDUCE_OP_SUM as SUM


@ironlink.jit
@triton.jit
def produce_then_all_reduce(ctx, x, n, rank, seed, dt: tl.constexpr, out_dt: tl.constexpr, status, BLOCK: tl.constexpr):
    # Each CTA writes a strided share of x (not the slice the all-reduce will give it), so the
    # all-reduce is only right if the grid barrier made every CTA's writes visible.
    pid, grid = tl.program_id(0), tl.num_programs(0)
    for start in range(pid * BLOCK, n, grid * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        v = ((offs * 7 + seed) % 13).to(tl.float32) * (rank + 1)
        tl.store(x + offs, v.to(out_dt), mask=offs < n)
    s = il.symm_grid_barrier(ctx)
    s2 = il.symm_all_reduce(ctx, x, 0, n, SUM, dt)
    tl.store(status + pid, tl.where(s != 0, s, s2))


@ironlink.jit
@triton.jit
def tiles_then_all_reduce(ctx, x, rows, cols, stride, rank, seed, dt: tl.constexpr, out_dt: tl.constexpr, status,
                          TR: tl.constexpr, TC: tl.constexpr):
    pid, grid = tl.program_id(0), tl.num_programs(0)
    tiles_c = tl.cdiv(cols, TC)
    n_tiles = tl.cdiv(rows, TR) * tiles_c
    worst = pid * 0
    for t in range(0, n_tiles):
        if (t + rank) % grid == pid:
            i0, j0 = (t // tiles_c) * TR, (t % tiles_c) * TC
            i = i0 + tl.arange(0, TR)[:, None]
            j = j0 + tl.arange(0, TC)[None, :]
            v = ((i * 5 + j * 3 + seed) % 11).to(tl.float32) * (rank + 1)
            tl.store(x + i * stride + j, v.to(out_dt), mask=(i < rows) & (j < cols))
            s = il.symm_tile_all_reduce(ctx, x + i0 * stride + j0, tl.minimum(TR, rows - i0), tl.minimum(TC, cols - j0),
                                        stride, t, SUM, dt)
            worst = tl.where(s != 0, s, worst)
    tl.store(status + pid, worst)
