"""matmul_all_reduce's kernels for the methods "tile" and "lamport" and for a heap of several
nodes (method "push": `matmul_all_reduce_one_shot_kernels`, `matmul_all_reduce_two_shot_kernels`).
The module docs of `fused.matmul_all_reduce`, which plans and launches them, describe every
method: they are the "module docs" the kernels' docstrings refer to.

- `matmul_allreduce_kernel`, "tile": each tile all-reduced by the CTA that computed it
  (`symm_tile_all_reduce`).
- `matmul_allreduce_lamport_kernel`, "lamport": each tile's partial goes from registers into its
  slot at every peer as data that is its own flag (`ironlink.language.slots`: lamport slots, -0.0
  is "empty"), and the CTA polls its own slots for the peers' partials of the same tile, sums in
  rank order and stores the sum. No staging in `out`, no fence, no tile signal: after the GEMM a
  tile costs one NVLink crossing and the poll. Chosen where the output is small
  (`tuning.matmul_method`); with several tiles a CTA each tile waits for its peers right after
  its GEMM (nothing else overlaps the wait).
- `matmul_allreduce_hierarchical_kernel`, several nodes: every tile, a grid barrier, then the
  hierarchical all-reduce of the whole output (linked with the NVSHMEM bitcode).
"""

from __future__ import annotations

import triton.language as tl

from .. import language as il
from ..language import typed as ilt
from ..language.jit import jit
from ..language.pdl import allow_next_kernel, wait_for_previous_kernel
from ..language.slots import advance_epochs, lamport_reduce_values, lamport_store, launch_slots, peer_distances
from ..language.trace import stamp
from .gemm_tiles import gemm_range, product_tile, store_tile, tile_coords, tile_offsets


@jit(do_not_specialize=["ctx"])
def matmul_allreduce_kernel(ctx, a, b, out, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, status, trace,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, COMMUNICATE: tl.constexpr = True, TRACE: tl.constexpr = False):
    """Method "tile": out [M, N] (heap, contiguous) = all-reduce of a @ b, tile by tile (see the
    module docs). COMMUNICATE=False leaves out the all-reduce: the GEMM alone. TRACE: stamps per
    tile (GEMM done, tile all-reduced)."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    stamp(trace, 0, TRACE)
    worst = pid * 0
    step = 0
    for t in range(pid, tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), grid):
        m0, n0 = product_tile(a, b, out, t, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        stamp(trace, 1 + 2 * step, TRACE)
        if COMMUNICATE:
            if worst == 0:  # after a timeout, no more waits: one timeout a CTA, not one a tile
                worst = ilt.tile_all_reduce(ctx, out + m0.to(tl.int64) * N + n0, tl.minimum(BLOCK_M, M - m0),
                                            tl.minimum(BLOCK_N, N - n0), N, t)
        stamp(trace, 2 + 2 * step, TRACE)
        step += 1
    tl.store(status + pid, worst)


# A heap of several nodes: every tile first, a grid barrier, then the hierarchical all-reduce of the
# whole output (see the module docs); linked with the NVSHMEM bitcode.
@jit(do_not_specialize=["ctx"], nvshmem=True, several_nodes=True)
def matmul_allreduce_hierarchical_kernel(ctx, a, b, out, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, status,
                                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                         GROUP_M: tl.constexpr):
    pid, grid = tl.program_id(0), tl.num_programs(0)
    for t in range(pid, tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), grid):
        product_tile(a, b, out, t, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K,
                      GROUP_M)
    # Every CTA's tiles visible to every CTA: each all-reduces a slice of the whole output.
    s = il.symm_grid_barrier(ctx)
    r = ilt.all_reduce(ctx, out, M * N)
    tl.store(status + pid, ilt.failure_or(s, r))


@jit(do_not_specialize=["ctx"])
def matmul_allreduce_lamport_kernel(ctx, a, b, out, inbox, epochs, half, M, N, K, stride_am, stride_ak, stride_bk,
                                    stride_bn, status, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, TMA: tl.constexpr,
                                    B_ROW_MAJOR: tl.constexpr, WORLD: tl.constexpr, COMMUNICATE: tl.constexpr = True,
                                    PDL: tl.constexpr = False):
    """Method "lamport": out [M, N] (heap, contiguous) = all-reduce of a @ b, each rank's partial
    rounded to out's dtype before the fp32 sum in rank order (as "push" sums: the same bits).
    inbox: lamport slots (heap, `lamport_workspace`), 2 x (world - 1) x [M, N] at least, the half
    (`half` elements, `launch_slots`) by the launch parity; epochs: the op's per-CTA launch
    counters. After a failed wait the CTA sends no more tiles (its peers time out too) and the
    status says TIMEOUT. With PDL the rank and the peers' addresses are read before the wait for the
    previous kernel (`ironlink.language.pdl`).
    COMMUNICATE=False stores each partial into out: the GEMM alone (the benchmark's reference)."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    rank = il.symm_rank(ctx)
    dists = peer_distances(ctx, inbox, rank, WORLD)
    wait_for_previous_kernel(PDL)
    allow_next_kernel(PDL)
    epoch, _, slots = launch_slots(inbox, epochs, half)
    slot = tl.cast(M, tl.int64) * N
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    worst = pid * 0
    for t in range(pid, tiles_m * tiles_n, grid):
        if worst == 0:
            tm, tn = tile_coords(t, tiles_m, tiles_n, GROUP_M)
            m0, n0 = tm * BLOCK_M, tn * BLOCK_N
            acc = gemm_range(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), a, b, m0, M, n0, N, 0, K, K, stride_am,
                             stride_ak, stride_bk, stride_bn, TMA, B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K)
            if COMMUNICATE:
                at, mask = tile_offsets(m0, n0, M, N, BLOCK_M, BLOCK_N)
                partial = acc.to(out.dtype.element_ty)
                lamport_store(partial, slots, slot, at, mask, rank, dists, WORLD)
                total, s = lamport_reduce_values(ctx, partial, slots, slot, at, mask, rank, WORLD)
                worst = ilt.failure_or(s, worst)
                if s == 0:
                    tl.store(out + at, total.to(out.dtype.element_ty), mask=mask)
            else:
                store_tile(out, acc, m0, n0, M, N, BLOCK_M, BLOCK_N)
    if COMMUNICATE:
        advance_epochs(epochs, epoch + 1)
    tl.store(status + pid, worst)


__all__ = ["matmul_allreduce_hierarchical_kernel", "matmul_allreduce_kernel", "matmul_allreduce_lamport_kernel"]
