"""Triton kernels that fuse ironlink calls into producers (a helper, no tests of its own): run by
fusion_worker.py (and ops_worker.py's meet_on_tiles) on GPUs and compiled for sm_80/90/100
without a GPU by tests/compile/test_fusion_compile.py."""

from __future__ import annotations

import triton
import triton.language as tl

import ironlink
import ironlink.language as il
import ironlink.typed as ilt
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
    # A failed barrier (a grid larger than the GPU) skips the all-reduce, as a kernel should: its
    # CTAs need not all be resident, so a collective launched on them could wait for CTAs that
    # never run (ranks sharing a GPU) and time out.
    if s == 0:
        s = il.symm_all_reduce(ctx, x, 0, n, SUM, dt)
    tl.store(status + pid, s)


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
            worst = ilt.failure_or(s, worst)
    tl.store(status + pid, worst)


@ironlink.jit
@triton.jit
def tiles_then_all_gather(ctx, x, rows, cols, stride, rank, world, seed, out_dt: tl.constexpr, status,
                          TR: tl.constexpr, TC: tl.constexpr):
    # x holds `world` stacked blocks of rows x cols (rows `stride` apart); rank r writes tile t of
    # its block r, then gathers tile t of every block.
    pid, grid = tl.program_id(0), tl.num_programs(0)
    tiles_c = tl.cdiv(cols, TC)
    n_tiles = tl.cdiv(rows, TR) * tiles_c
    worst = pid * 0
    for t in range(0, n_tiles):
        if (t + rank) % grid == pid:
            i0, j0 = (t // tiles_c) * TR, (t % tiles_c) * TC
            i = i0 + tl.arange(0, TR)[:, None]
            j = j0 + tl.arange(0, TC)[None, :]
            v = ((i * 5 + j * 3 + seed) % 11 + 16 * rank).to(tl.float32)
            tl.store(x + (rank * rows + i) * stride + j, v.to(out_dt), mask=(i < rows) & (j < cols))
            s = ilt.tile_all_gather(ctx, x + i0 * stride + j0, tl.minimum(TR, rows - i0), tl.minimum(TC, cols - j0),
                                    stride, rows * stride, t)
            worst = ilt.failure_or(s, worst)
    tl.store(status + pid, worst)


@ironlink.jit
@triton.jit
def tiles_then_reduce_scatter(ctx, x, out, rows, cols, stride, rank, world, seed, out_dt: tl.constexpr, status,
                              TR: tl.constexpr, TC: tl.constexpr):
    # x holds `world` stacked blocks; rank r writes tile t of every block (values depend on the
    # rank and the block), then out (rows x cols, rows `stride` apart) gets block r summed.
    pid, grid = tl.program_id(0), tl.num_programs(0)
    tiles_c = tl.cdiv(cols, TC)
    n_tiles = tl.cdiv(rows, TR) * tiles_c
    worst = pid * 0
    for t in range(0, n_tiles):
        if (t + rank) % grid == pid:
            i0, j0 = (t // tiles_c) * TR, (t % tiles_c) * TC
            i = i0 + tl.arange(0, TR)[:, None]
            j = j0 + tl.arange(0, TC)[None, :]
            for blk in range(0, world):
                v = ((i * 5 + j * 3 + seed + blk) % 11).to(tl.float32) * (rank + 1)
                tl.store(x + (blk * rows + i) * stride + j, v.to(out_dt), mask=(i < rows) & (j < cols))
            s = ilt.tile_reduce_scatter(ctx, x + i0 * stride + j0, out + i0 * stride + j0, tl.minimum(TR, rows - i0),
                                        tl.minimum(TC, cols - j0), stride, rows * stride, t)
            worst = ilt.failure_or(s, worst)
    tl.store(status + pid, worst)


@ironlink.jit
@triton.jit
def ring_push(ctx, outbox, inbox, got, n_tiles, rank, world, seed, status, TE: tl.constexpr):
    # Push-as-produced around a ring: tile t (TE elements) goes to rank+1's inbox, through
    # symm_tile_put (even t) or stores through a peer pointer + symm_tile_signal (odd t); the
    # consumer waits for tile t from rank-1, copies it to `got` and acknowledges on tile
    # n_tiles + t, for which the producer waits before the launch ends.
    pid, grid = tl.program_id(0), tl.num_programs(0)
    nxt, prv = (rank + 1) % world, (rank + world - 1) % world
    worst = pid * 0
    e = tl.arange(0, TE)
    for t in range(pid, n_tiles, grid):
        v = (e * 7 + t * 3 + seed + 100 * rank).to(tl.float32)
        if t % 2 == 0:
            tl.store(outbox + t * TE + e, v)
            s = ilt.tile_put(ctx, inbox + t * TE, outbox + t * TE, 1, TE, TE, t, nxt)
        else:
            peer = il.symm_peer_ptr(ctx, inbox + t * TE, nxt).to(tl.pointer_type(tl.float32))
            tl.store(peer + e, v)
            s = il.symm_tile_signal(ctx, t, nxt)
        worst = ilt.failure_or(s, worst)
        s = il.symm_tile_wait(ctx, t, prv)
        worst = ilt.failure_or(s, worst)
        tl.store(got + t * TE + e, tl.load(inbox + t * TE + e))
        s = il.symm_tile_signal(ctx, n_tiles + t, prv)
        worst = ilt.failure_or(s, worst)
        s = il.symm_tile_wait(ctx, n_tiles + t, nxt)
        worst = ilt.failure_or(s, worst)
    tl.store(status + pid, worst)


@ironlink.jit
@triton.jit
def exchange_with_all(ctx, board, got, n_tiles, rank, world, seed, status, TE: tl.constexpr):
    # Tile t: every rank stores its row into row [t][rank] of every rank's board (through peer
    # pointers), symm_tile_signal_others, symm_tile_wait_others, copies its board's tile t (every
    # rank's row) to `got`, then the same pair on tile n_tiles + t so the next launch's stores
    # wait until every rank has read. Rank r runs tile t on CTA (t + r) % grid.
    pid, grid = tl.program_id(0), tl.num_programs(0)
    worst = pid * 0
    e = tl.arange(0, TE)
    for t in range((pid + grid - rank % grid) % grid, n_tiles, grid):  # Triton's % keeps the sign
        v = (e * 7 + t * 3 + seed + 100 * rank).to(tl.float32)
        for p in range(0, world):
            peer = il.symm_peer_ptr(ctx, board + (t * world + rank) * TE, p).to(tl.pointer_type(tl.float32))
            tl.store(peer + e, v)
        s = il.symm_tile_signal_others(ctx, t)
        s = ilt.failure_or(s, il.symm_tile_wait_others(ctx, t))
        worst = ilt.failure_or(s, worst)
        for p in range(0, world):
            tl.store(got + (t * world + p) * TE + e, tl.load(board + (t * world + p) * TE + e))
        s = il.symm_tile_signal_others(ctx, n_tiles + t)
        s = ilt.failure_or(s, il.symm_tile_wait_others(ctx, n_tiles + t))
        worst = ilt.failure_or(s, worst)
    tl.store(status + pid, worst)


@ironlink.jit
@triton.jit
def meet_on_tiles(ctx, tile0, status):
    # CTA c: symm_tile_signal_others, then symm_tile_wait_others, on tile tile0 + c: a user kernel
    # that communicates, run between a low-latency dispatch's send and its deferred receive
    # (tests/gpu/workers/ops_worker.py).
    t = tile0 + tl.program_id(0)
    s = il.symm_tile_signal_others(ctx, t)
    s = ilt.failure_or(s, il.symm_tile_wait_others(ctx, t))
    tl.store(status + tl.program_id(0), s)
