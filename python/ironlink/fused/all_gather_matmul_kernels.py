"""all_gather_matmul's kernels; the module docs of `fused.all_gather_matmul`, which checks, plans
and launches them, describe them (the "module docs" of their docstrings):

- `allgather_matmul_kernel`: one node, the shard pushed by the CTAs ("SM push");
- `allgather_matmul_copy_engine_kernel`: one node, the shard carried by the copy engine (the side
  stream's transfers: `all_gather_matmul.launch_copy_engine`);
- `allgather_matmul_hierarchical_kernel`: a heap of several nodes (linked with the NVSHMEM
  bitcode);
and the steps they share: a tile of one rank's rows, a CTA's share of those tiles and of the
other ranks', a CTA's share of the push.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import language as il
from ..language import typed as ilt
from ..language.jit import jit
from . import copy_engine
from .gemm_tiles import copy_rows, gemm_range, tile_coords


@triton.jit
def _store_out_tile(out, acc, src, tm, tn, ROWS, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Output tile (tm, tn) of rank `src`'s rows: out [WORLD * ROWS, N] is contiguous.
    rm = tm * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out + (src * ROWS + rm[:, None]).to(tl.int64) * N + rn[None, :], acc.to(out.dtype.element_ty),
             mask=(rm[:, None] < ROWS) & (rn[None, :] < N))


@triton.jit
def _gemm_tile_of(a, stride_am, stride_ak, a_row0, src, t, b, out, ROWS, N, K, stride_bk, stride_bn, tiles_n,
                  TMA: tl.constexpr, B_ROW_MAJOR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Output tile t of rank `src`'s rows, read from `a` at rows a_row0.. (a pointer at the block's
    # first row and a_row0 = 0, or a TMA descriptor and the block's first row in it: `gemm_range`).
    tm, tn = tile_coords(t, tl.cdiv(ROWS, BLOCK_M), tiles_n, GROUP_M)  # grouped: b's columns shared in L2
    acc = gemm_range(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), a, b, a_row0 + tm * BLOCK_M, a_row0 + ROWS,
                     tn * BLOCK_N, N, 0, K, K, stride_am, stride_ak, stride_bk, stride_bn, TMA, B_ROW_MAJOR, BLOCK_M,
                     BLOCK_N, BLOCK_K)
    _store_out_tile(out, acc, src, tm, tn, ROWS, N, BLOCK_M, BLOCK_N)


@triton.jit
def _gemm_rows_of(a, stride_am, stride_ak, a_row0, src, first, b, out, ROWS, N, K, stride_bk, stride_bn, tiles_n,
                  TMA: tl.constexpr, B_ROW_MAJOR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, FLAT: tl.constexpr = False):
    # This CTA's share of the output tiles of rank `src`'s rows, from this CTA's index `first` on.
    # FLAT: the tile loop flattened with the K loop (Triton pipelines the loads across tiles).
    grid = tl.num_programs(0)
    for t in tl.range(first, tl.cdiv(ROWS, BLOCK_M) * tiles_n, grid, flatten=FLAT):
        _gemm_tile_of(a, stride_am, stride_ak, a_row0, src, t, b, out, ROWS, N, K, stride_bk, stride_bn, tiles_n,
                      TMA, B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


@triton.jit
def _copy_units(ctx, a_shard, stride_sm, stride_sk, mine, peer_full, rank, ROWS, K, i_begin, i_end,
                WORLD: tl.constexpr, COPY_ROWS: tl.constexpr, COPY_COLS: tl.constexpr, TMA_PUSH: tl.constexpr):
    # Units i_begin..i_end of this CTA's share of the push of this rank's shard into every rank's
    # a_full (at `mine`, this rank's block): unit u = pid + i * grid is COPY_ROWS rows by COPY_COLS
    # columns. TMA_PUSH (world 2): into the peer through `peer_full`, a TMA descriptor of its
    # a_full as [WORLD, ROWS, K]: the SM's copy engine drains the unit from shared memory while
    # the warps compute (stores from registers stall them once NVLink is full); else stores to
    # each rank, posted.
    pid, grid = tl.program_id(0), tl.num_programs(0)
    pieces = tl.cdiv(K, COPY_COLS)
    rr, cc = tl.arange(0, COPY_ROWS), tl.arange(0, COPY_COLS)
    for i in range(i_begin, i_end):
        u = pid + i * grid
        r0, c0 = (u // pieces) * COPY_ROWS, (u % pieces) * COPY_COLS
        r, c = r0 + rr, c0 + cc
        mask = (r[:, None] < ROWS) & (c[None, :] < K)
        x = tl.load(a_shard + r[:, None].to(tl.int64) * stride_sm + c[None, :] * stride_sk, mask=mask)
        offs = r[:, None].to(tl.int64) * K + c[None, :]
        if TMA_PUSH:
            peer_full.store([rank, r0, c0], x.reshape(1, COPY_ROWS, COPY_COLS))  # clipped at ROWS and K
            tl.store(mine + offs, x, mask=mask)
        else:
            for p in tl.static_range(WORLD):
                tl.store(ilt.peer_pointer(ctx, mine, p) + offs, x, mask=mask)


@triton.jit
def _gemm_other_ranks(a_full, rank, b, out, ROWS, N, K, stride_bk, stride_bn, tiles_n, TMA: tl.constexpr,
                      B_ROW_MAJOR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WORLD: tl.constexpr,
                      FLAT: tl.constexpr = False):
    # The tiles of the other ranks' rows, read from a_full (a pointer, or a TMA descriptor of it);
    # they continue this CTA's walk where its own-row tiles stopped (balance).
    pid, grid = tl.program_id(0), tl.num_programs(0)
    own = tl.cdiv(ROWS, BLOCK_M) * tiles_n
    for i in tl.static_range(1, WORLD):
        src = (rank + i) % WORLD
        first = (pid + grid - (i * own) % grid) % grid
        if TMA:
            _gemm_rows_of(a_full, K, 1, src * ROWS, src, first, b, out, ROWS, N, K, stride_bk, stride_bn, tiles_n,
                          TMA, B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FLAT)
        else:
            _gemm_rows_of(a_full + tl.cast(src, tl.int64) * ROWS * K, K, 1, 0, src, first, b, out, ROWS, N, K,
                          stride_bk, stride_bn, tiles_n, TMA, B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FLAT)


@jit(do_not_specialize=["ctx"])
def allgather_matmul_kernel(ctx, a_shard, a_full, a_own, a_all, peer_full, b, out, ROWS, N, K, stride_sm, stride_sk,
                            stride_bk, stride_bn, status, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, COPY_ROWS: tl.constexpr, COPY_COLS: tl.constexpr, WORLD: tl.constexpr,
                            TMA: tl.constexpr, B_ROW_MAJOR: tl.constexpr, FLAT: tl.constexpr = False,
                            TMA_PUSH: tl.constexpr = False, SEGMENTS: tl.constexpr = 1,
                            COMMUNICATE: tl.constexpr = True):
    """a_full [WORLD * ROWS, K] (heap, contiguous) <- every rank's a_shard [ROWS, K]; out = a_full @ b
    (see the module docs). The GEMM reads a_own (this rank's rows), a_all (a_full) and b: with TMA
    (Hopper), TMA descriptors of a_shard, a_full and b (`gemm_operands.operand_descriptors`), else a_shard,
    a_full and b themselves; the copies read a_shard and write a_full through pointers. FLAT: the
    other ranks' tiles in a tile loop flattened with the K loop (`tuning.matmul_flat`). TMA_PUSH
    (world 2): the push to the peer through `peer_full` (`_copy_units`), else unused. SEGMENTS:
    the pieces of the push per own-row tile, each before a SEGMENTS-th of its K loop.
    COMMUNICATE=False (a probe): no push, no waits on peers; the GEMM and the grid barrier alone."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    rank = il.symm_rank(ctx)
    tiles_n = tl.cdiv(N, BLOCK_N)
    worst = pid * 0
    if COMMUNICATE:
        s = il.symm_tile_signal_others(ctx, pid)
        worst = ilt.failure_or(s, il.symm_tile_wait_others(ctx, pid))
    # The push of this CTA's share of the shard, spread over its own-row tiles' K loops.
    mine = a_full + tl.cast(rank, tl.int64) * ROWS * K
    units = tl.cdiv(ROWS, COPY_ROWS) * tl.cdiv(K, COPY_COLS)
    my_units = tl.cdiv(units - pid, grid)
    own_tiles = tl.cdiv(ROWS, BLOCK_M) * tiles_n
    steps = tl.maximum(tl.cdiv(own_tiles - pid, grid), 1)
    per_step = tl.cdiv(my_units, steps)
    for step in range(0, steps):
        u0 = step * per_step
        u1 = tl.minimum(u0 + per_step, my_units)
        t = pid + step * grid
        if t < own_tiles:
            # The step's units in SEGMENTS pieces, one before each SEGMENTS-th of the tile's K loop:
            # a CTA pushes at the pace NVLink drains every CTA's pushes, not in a burst that
            # stalls it behind the queue.
            tm, tn = tile_coords(t, tl.cdiv(ROWS, BLOCK_M), tiles_n, GROUP_M)
            per_seg = tl.cdiv(u1 - u0, SEGMENTS)
            k_seg = tl.cdiv(tl.cdiv(K, BLOCK_K), SEGMENTS) * BLOCK_K
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for seg in tl.static_range(SEGMENTS):
                if COMMUNICATE:
                    if worst == 0:
                        _copy_units(ctx, a_shard, stride_sm, stride_sk, mine, peer_full, rank, ROWS, K,
                                    u0 + seg * per_seg, tl.minimum(u0 + (seg + 1) * per_seg, u1), WORLD, COPY_ROWS,
                                    COPY_COLS, TMA_PUSH)
                acc = gemm_range(acc, a_own, b, tm * BLOCK_M, ROWS, tn * BLOCK_N, N, tl.minimum(seg * k_seg, K),
                                 tl.minimum((seg + 1) * k_seg, K), K, stride_sm, stride_sk, stride_bk, stride_bn, TMA,
                                 B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K)
            _store_out_tile(out, acc, rank, tm, tn, ROWS, N, BLOCK_M, BLOCK_N)
        elif COMMUNICATE:
            if worst == 0:
                _copy_units(ctx, a_shard, stride_sm, stride_sk, mine, peer_full, rank, ROWS, K, u0, u1, WORLD,
                            COPY_ROWS, COPY_COLS, TMA_PUSH)
    if COMMUNICATE:
        s = il.symm_tile_signal_others(ctx, grid + pid)
        worst = ilt.failure_or(worst, ilt.failure_or(s, il.symm_tile_wait_others(ctx, grid + pid)))
    worst = ilt.failure_or(worst, il.symm_grid_barrier(ctx))
    if worst == 0:
        _gemm_other_ranks(a_all, rank, b, out, ROWS, N, K, stride_bk, stride_bn, tiles_n, TMA, B_ROW_MAJOR, BLOCK_M,
                          BLOCK_N, BLOCK_K, GROUP_M, WORLD, FLAT)
    tl.store(status + pid, worst)


# The copy-engine kernel's own flag words (`copy_engine.flag_data` on): rank src's stream -> this
# rank's kernel, chunk j of src's shard is in this a_full, at src * chunks + j. A chunk is a
# group of GROUP_M tile rows (the order the tile walk takes them: `gemm_tiles.tile_coords`).


@jit(do_not_specialize=["ctx"])
def allgather_matmul_copy_engine_kernel(ctx, flags, a_own, a_all, b, out, ROWS, N, K, stride_sm, stride_sk,
                                        stride_bk, stride_bn, status, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WORLD: tl.constexpr,
                                        TMA: tl.constexpr, B_ROW_MAJOR: tl.constexpr, FLAT: tl.constexpr = False):
    """out = a_full @ b while a copy engine fills a_full (the module docs: "copy engine"): the
    own rows' tiles from a_own (a_shard), then each other rank's, every chunk once its flag says
    it has arrived. a_own, a_all, b as in `allgather_matmul_kernel`; `flags` this rank's flag
    words."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    rank = il.symm_rank(ctx)
    tiles_m, tiles_n = tl.cdiv(ROWS, BLOCK_M), tl.cdiv(N, BLOCK_N)
    chunks = tl.cdiv(tiles_m, GROUP_M)
    ready = copy_engine.data_words(flags, WORLD)
    worst = copy_engine.open_launch(ctx, flags, rank, WORLD)
    _gemm_rows_of(a_own, stride_sm, stride_sk, 0, rank, pid, b, out, ROWS, N, K, stride_bk, stride_bn, tiles_n, TMA,
                  B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FLAT)
    own = tiles_m * tiles_n
    for i in tl.static_range(1, WORLD):
        src = (rank + i) % WORLD
        a_src = a_all if TMA else a_all + tl.cast(src, tl.int64) * ROWS * K
        row0 = src * ROWS if TMA else 0
        waited = -1  # the last chunk of src this CTA has waited for
        for t in tl.range((pid + grid - (i * own) % grid) % grid, own, grid, flatten=FLAT):  # continue the walk
            tm, tn = tile_coords(t, tiles_m, tiles_n, GROUP_M)
            if tm // GROUP_M != waited:
                waited = tm // GROUP_M
                if worst == 0:  # after a timeout, no more waits: one per CTA, not one per chunk
                    arrived = il.symm_signal_wait_at(ctx, ready + src * chunks + waited, copy_engine.EQ, 1)
                    worst = ilt.failure_or(worst, arrived)
            acc = gemm_range(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), a_src, b, row0 + tm * BLOCK_M,
                             row0 + ROWS, tn * BLOCK_N, N, 0, K, K, K, 1, stride_bk, stride_bn, TMA, B_ROW_MAJOR,
                             BLOCK_M, BLOCK_N, BLOCK_K)
            _store_out_tile(out, acc, src, tm, tn, ROWS, N, BLOCK_M, BLOCK_N)
    copy_engine.close_launch(flags, ready, WORLD * chunks, WORLD)
    tl.store(status + pid, worst)


# A heap of several nodes (see the module docs); linked with the NVSHMEM bitcode.
@jit(do_not_specialize=["ctx"], nvshmem=True, several_nodes=True)
def allgather_matmul_hierarchical_kernel(ctx, a_shard, a_full, b, out, ROWS, N, K, stride_sm, stride_sk, stride_bk,
                                         stride_bn, status, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, COPY_COLS: tl.constexpr,
                                         WORLD: tl.constexpr):
    pid = tl.program_id(0)
    rank = il.symm_rank(ctx)
    tiles_n = tl.cdiv(N, BLOCK_N)
    mine = a_full + tl.cast(rank, tl.int64) * ROWS * K
    copy_rows(a_shard, stride_sm, stride_sk, mine, K, 1, ROWS, K, COPY_COLS)
    _gemm_rows_of(a_shard, stride_sm, stride_sk, 0, rank, pid, b, out, ROWS, N, K, stride_bk, stride_bn, tiles_n,
                  False, False, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    # The own block complete before any CTA sends its slice of it; every block in place before
    # any CTA reads one.
    worst = il.symm_grid_barrier(ctx)
    worst = ilt.failure_or(worst, ilt.all_gather(ctx, mine, a_full, ROWS * K))
    worst = ilt.failure_or(worst, il.symm_grid_barrier(ctx))
    if worst == 0:
        _gemm_other_ranks(a_full, rank, b, out, ROWS, N, K, stride_bk, stride_bn, tiles_n, False, False, BLOCK_M,
                          BLOCK_N, BLOCK_K, GROUP_M, WORLD)
    tl.store(status + pid, worst)


__all__ = ["allgather_matmul_copy_engine_kernel", "allgather_matmul_hierarchical_kernel", "allgather_matmul_kernel"]
