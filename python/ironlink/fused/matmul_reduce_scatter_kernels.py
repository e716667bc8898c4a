"""matmul_reduce_scatter's kernels; the module docs of `fused.matmul_reduce_scatter`, which checks,
plans and launches them, describe them (the "module docs" of their docstrings):

- `matmul_reducescatter_kernel`: one node, each partial pushed by the CTA that computed it
  (matmul_all_reduce's two-shot tile steps, `matmul_all_reduce_two_shot_kernels`);
- `matmul_reducescatter_copy_engine_kernel`: one node, the partials carried by the copy engine
  (the side stream's transfers: `matmul_reduce_scatter.launch_copy_engine`);
- `matmul_reducescatter_hierarchical_kernel`: a heap of several nodes (linked with the NVSHMEM
  bitcode);
and the steps of the tile walk the first two share.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import language as il
from ..language import typed as ilt
from ..language.jit import jit
from ..language.slots import advance_epochs, launch_slots
from . import copy_engine
from .gemm_tiles import copy_rows, gemm_range, product_tile, store_tile, tile_coords
from .matmul_all_reduce_two_shot_kernels import finish_piece, first_own_step, signal_points, sum_partials


@triton.jit
def walk_step(a, b, j, first, total, tiles, rows, N, K, stride_am, stride_ak, stride_bk, stride_bn,
              TMA: tl.constexpr, B_ROW_MAJOR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Step j of the kernels' tile walk over the `total` tiles of all blocks, from tile `first`
    (the next rank's block first, this rank's own last): (its index o in block order, its
    destination block, tile row, first row and column in the block, the fp32 product)."""
    o = (j + first) % total
    dest = o // tiles
    tm, tn = tile_coords(o % tiles, tl.cdiv(rows, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    m0, n0 = tm * BLOCK_M, tn * BLOCK_N
    acc = gemm_range(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), a, b, dest * rows + m0, (dest + 1) * rows, n0,
                     N, 0, K, K, stride_am, stride_ak, stride_bk, stride_bn, TMA, B_ROW_MAJOR, BLOCK_M, BLOCK_N,
                     BLOCK_K)
    return o, dest, tm, m0, n0, acc


@triton.jit
def signal_partial(ctx, t, dest, rank):
    """Announces this rank's partial of tile `t` of block `dest` to `dest` (nothing for its own)."""
    if dest != rank:
        s = il.symm_tile_signal(ctx, t, dest)
    else:
        s = rank * 0
    return s


@jit(do_not_specialize=["ctx"])
def matmul_reducescatter_kernel(ctx, a, b, out, ws, peer_slots, epochs, half, M, N, K, stride_am, stride_ak, stride_bk,
                                stride_bn, status, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WORLD: tl.constexpr,
                                TMA: tl.constexpr = False, B_ROW_MAJOR: tl.constexpr = False,
                                TMA_PUSH: tl.constexpr = False, SIGNAL_EVERY: tl.constexpr = 1,
                                COMMUNICATE: tl.constexpr = True):
    """out [M / WORLD, N] (contiguous) = this rank's rows of the reduce-scatter of a @ b (see the
    module docs): matmul_all_reduce's two-shot by slices with the slices the destinations' row
    blocks and no sums sent back. ws: the partials' slots (heap), 2 x (WORLD - 1) x [M / WORLD, N]
    at least, the half (`half` elements, `launch_slots`) by the launch parity (`epochs`: one int32
    per possible CTA, zeroed at creation).
    TMA (Hopper): a and b are TMA descriptors (`gemm_operands.operand_descriptors`; a tile past its block's
    rows reads the next block's, which its slot and the sum leave out). TMA_PUSH (world 2):
    `peer_slots` is a TMA descriptor of the peer's slots [2, M / WORLD, N] (blocks [1, BLOCK_M,
    BLOCK_N / 2]: the epilogue goes in halves), else unused. SIGNAL_EVERY (world 2): a CTA
    signals its partials every SIGNAL_EVERY tiles with one release (`symm_tile_signal_batch`),
    and the rest at its first tile of its own block, before its first wait (or after the loop if
    it has none): a signal costs the CTA its system-scope release. COMMUNICATE=False (a probe): every
    tile stored into `out` at its block's position, nothing pushed or waited for."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    rank = il.symm_rank(ctx)
    rows = M // WORLD
    epoch, parity, slots = launch_slots(ws, epochs, half)
    tiles_m, tiles_n = tl.cdiv(rows, BLOCK_M), tl.cdiv(N, BLOCK_N)
    tiles = tiles_m * tiles_n  # per destination block
    total = WORLD * tiles
    first = ((rank + 1) % WORLD) * tiles  # the next rank's block first, this rank's own last
    worst = pid * 0
    HALF_N: tl.constexpr = BLOCK_N // 2
    # Nested tile and K loops: Triton 3.6 fails to flatten this loop (TritonGPUFuseNestedLoops:
    # "scf.if ... source has 2 operands, but target successor needs 3").
    for j in range(pid, total, grid):
        o, dest, tm, m0, n0, acc = walk_step(a, b, j, first, total, tiles, rows, N, K, stride_am, stride_ak, stride_bk,
                                             stride_bn, TMA, B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        if COMMUNICATE:
            # The previous tile's push, drained behind this K loop, announced to its destination.
            if SIGNAL_EVERY == 1:
                prev = (j - grid + first) % total
                if (j >= pid + grid) & (worst == 0):
                    worst = signal_partial(ctx, prev % tiles, prev // tiles, rank)
            else:  # world 2: the peer's block is j < tiles (tile j of it), this rank's own after
                i = (j - pid) // grid
                since, due = signal_points(i, pid, grid, tiles, SIGNAL_EVERY)
                # Its own block's tiles push nothing: no signal points after the first of them.
                if due & (i <= first_own_step(pid, grid, tiles)) & (worst == 0):
                    worst = il.symm_tile_signal_batch(ctx, pid + since * grid, grid, i - since, tiles, 1 - rank)
        own = acc.to(out.dtype.element_ty)
        if COMMUNICATE:
            if dest == rank:
                if worst == 0:
                    worst = il.symm_tile_wait_others(ctx, o % tiles)  # the peers' partials (their first blocks)
            if worst == 0:  # in halves: a peer's partial summed beside the tile fits the registers
                left, right = tl.split(own.reshape(BLOCK_M, 2, HALF_N).permute(0, 2, 1))
                finish_piece(ctx, out, slots, peer_slots, out, parity, left, m0, n0, rows, N, rank, dest, WORLD,
                             TMA_PUSH, BLOCK_M, HALF_N, False)
                finish_piece(ctx, out, slots, peer_slots, out, parity, right, m0, n0 + HALF_N, rows, N, rank, dest,
                             WORLD, TMA_PUSH, BLOCK_M, HALF_N, False)
        else:
            store_tile(out, own, m0, n0, rows, N, BLOCK_M, BLOCK_N)
    last = pid + (tl.cdiv(total - pid, grid) - 1) * grid
    last_o = (last + first) % total
    if COMMUNICATE:
        if SIGNAL_EVERY == 1:
            if (last >= pid) & (worst == 0):
                worst = signal_partial(ctx, last_o % tiles, last_o // tiles, rank)
        else:  # a CTA that never reached its own block: the partials since its last signal
            steps = tl.cdiv(total - pid, grid)
            since, _ = signal_points(steps, pid, grid, tiles, SIGNAL_EVERY)
            if (steps > 0) & (steps <= first_own_step(pid, grid, tiles)) & (worst == 0):
                worst = il.symm_tile_signal_batch(ctx, pid + since * grid, grid, steps - since, tiles, 1 - rank)
        advance_epochs(epochs, epoch + 1)
    tl.store(status + pid, worst)


# The copy-engine kernel's own flag words (`copy_engine.data_words` on), a chunk being a group of
# GROUP_M tile rows of a block (the order the tile walk takes them: `gemm_tiles.tile_coords`):
# d * chunks + j: this rank's kernel -> its stream, how many of its partials of chunk j of block d
#   are stored in `sends` (the stream waits for all of them, then zeroes the count);
# WORLD * chunks + q * chunks + j: rank q's stream -> this rank's kernel, q's partial of chunk j
#   of this rank's block is in its slot.


@jit(do_not_specialize=["ctx"])
def matmul_reducescatter_copy_engine_kernel(ctx, flags, a, b, out, sends, slots, M, N, K, stride_am, stride_ak,
                                            stride_bk, stride_bn, status, BLOCK_M: tl.constexpr,
                                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                                            WORLD: tl.constexpr, TMA: tl.constexpr = False,
                                            B_ROW_MAJOR: tl.constexpr = False):
    """out [M / WORLD, N] (contiguous) = this rank's rows of the reduce-scatter of a @ b, the
    partials carried by the copy engine (the module docs: "copy engine"). The tiles in the order
    of `matmul_reducescatter_kernel`; a tile of another block is stored into `sends` [M, N]
    (heap) and counted, each chunk's count added to its flag word with one release when the CTA
    moves on; a tile of its own block waits for its chunk's partials from every peer, then sums
    them from `slots` [WORLD - 1, M / WORLD, N] (heap, `slot_of`) in rank order (fp32). a, b as
    in `matmul_reducescatter_kernel`; `flags` this rank's flag words (`copy_engine`)."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    rank = il.symm_rank(ctx)
    rows = M // WORLD
    tiles_m, tiles_n = tl.cdiv(rows, BLOCK_M), tl.cdiv(N, BLOCK_N)
    tiles = tiles_m * tiles_n  # per destination block
    total = WORLD * tiles
    first = ((rank + 1) % WORLD) * tiles  # the next rank's block first, this rank's own last
    chunks = tl.cdiv(tiles_m, GROUP_M)
    counts = copy_engine.data_words(flags, WORLD)
    ready = counts + WORLD * chunks
    HALF_N: tl.constexpr = BLOCK_N // 2
    worst = copy_engine.open_launch(ctx, flags, rank, WORLD)
    counting = pid * 0 - 1  # the chunk (dest * chunks + j) of this CTA's partials not yet counted
    pending = pid * 0  # how many
    waited = pid * 0 - 1  # the chunk of its own block this CTA has waited for
    for j in range(pid, total, grid):
        o, dest, tm, m0, n0, acc = walk_step(a, b, j, first, total, tiles, rows, N, K, stride_am, stride_ak, stride_bk,
                                             stride_bn, TMA, B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        chunk = dest * chunks + tm // GROUP_M
        if (chunk != counting) & (pending > 0):  # the last chunk's partials, stored by now
            il.symm_signal_at(ctx, counts + counting, pending, copy_engine.ADD, rank)
            pending = pending * 0
        counting = chunk
        if dest != rank:
            store_tile(sends + tl.cast(dest, tl.int64) * rows * N, acc, m0, n0, rows, N, BLOCK_M, BLOCK_N)
            pending += 1
        else:
            if tm // GROUP_M != waited:
                waited = tm // GROUP_M
                for i in tl.static_range(1, WORLD):
                    if worst == 0:  # after a timeout, no more waits: one per CTA, not one per chunk
                        q = (rank + i) % WORLD
                        arrived = il.symm_signal_wait_at(ctx, ready + q * chunks + waited, copy_engine.EQ, 1)
                        worst = ilt.failure_or(worst, arrived)
            # In halves: a peer's partial summed beside the tile fits the registers.
            left, right = tl.split(acc.to(out.dtype.element_ty).reshape(BLOCK_M, 2, HALF_N).permute(0, 2, 1))
            store_tile(out, sum_partials(left, slots, m0, n0, rows, N, rank, WORLD, BLOCK_M, HALF_N), m0, n0, rows,
                       N, BLOCK_M, HALF_N)
            store_tile(out, sum_partials(right, slots, m0, n0 + HALF_N, rows, N, rank, WORLD, BLOCK_M, HALF_N), m0,
                       n0 + HALF_N, rows, N, BLOCK_M, HALF_N)
    if pending > 0:
        il.symm_signal_at(ctx, counts + counting, pending, copy_engine.ADD, rank)
    copy_engine.close_launch(flags, ready, WORLD * chunks, WORLD)
    tl.store(status + pid, worst)


# A heap of several nodes (see the module docs); linked with the NVSHMEM bitcode.
@jit(do_not_specialize=["ctx"], nvshmem=True, several_nodes=True)
def matmul_reducescatter_hierarchical_kernel(ctx, a, b, out, ws, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                             stride_om, stride_on, status, BLOCK_M: tl.constexpr,
                                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                                             WORLD: tl.constexpr, COPY_COLS: tl.constexpr):
    """ws: the workspace (heap, contiguous [M, N])."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    for t in range(pid, tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), grid):
        product_tile(a, b, ws, t, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K,
                     GROUP_M)
    rows = M // WORLD
    mine = ws + tl.cast(il.symm_rank(ctx), tl.int64) * rows * N
    # Every tile stored before any CTA reduces its slice; every slice reduced before any CTA copies.
    worst = il.symm_grid_barrier(ctx)
    worst = ilt.failure_or(worst, ilt.reduce_scatter(ctx, ws, mine, rows * N))
    worst = ilt.failure_or(worst, il.symm_grid_barrier(ctx))
    if worst == 0:
        copy_rows(mine, N, 1, out, stride_om, stride_on, rows, N, COPY_COLS)
    tl.store(status + pid, worst)


__all__ = ["matmul_reducescatter_copy_engine_kernel", "matmul_reducescatter_hierarchical_kernel",
           "matmul_reducescatter_kernel", "signal_partial", "walk_step"]
