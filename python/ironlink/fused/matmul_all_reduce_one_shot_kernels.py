"""matmul_all_reduce's method "push", one-shot: every rank sums every tile (world 2, the tiles
in few waves: `tuning.matmul_one_shot`). `matmul_allreduce_push_kernel` and its tile steps; the
module docs of `fused.matmul_all_reduce` (the "module docs" of the docstrings here) describe the
method, and that module plans and launches it. Alternate launches use alternate halves of the
op's workspace (`launch_slots`, `advance_epochs`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import language as il
from ..language import typed as ilt
from ..language.jit import jit
from ..language.slots import add_in_rank_order, advance_epochs, launch_slots, store_to_peer_slots
from ..language.trace import stamp
from .gemm_tiles import gemm_range, store_tile, tile_coords


@triton.jit
def push_rows(ctx, out, slots, peer_slots, parity, m0, n0, M, N, rank, WORLD: tl.constexpr, ROWS: tl.constexpr,
              BLOCK_N: tl.constexpr, TMA_PUSH: tl.constexpr):
    """One-shot: rows m0..m0 + ROWS, columns n0.. of this rank's partial, staged in `out`, into
    its slot (rank - dest - 1) mod world of every other rank `dest`'s workspace. TMA_PUSH (world
    2): through `peer_slots`, a TMA descriptor of the one peer's slots [2, M, N] (blocks [1,
    ROWS, BLOCK_N]), so the copy engine of the SM sends while the warps go on."""
    rm = m0 + tl.arange(0, ROWS)
    rn = n0 + tl.arange(0, BLOCK_N)
    offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    v = tl.load(out + offs, mask=mask)
    if TMA_PUSH:
        peer_slots.store([parity, m0, n0], v.reshape(1, ROWS, BLOCK_N))
    else:
        store_to_peer_slots(ctx, slots, tl.cast(M, tl.int64) * N, offs, v, mask, rank, WORLD)


@triton.jit
def push_partial(ctx, out, slots, peer_slots, parity, m0, n0, M, N, rank, WORLD: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, TMA_PUSH: tl.constexpr):
    """One-shot: `push_rows` of the whole tile at rows m0.., columns n0.., in chunks of ROWS."""
    # The partial was staged by this CTA in store_tile's layout, which need not be this one's, and
    # the K loop between may be empty (split 0, or after the last tile): every thread's stores
    # before these loads.
    tl.debug_barrier()
    # Unrolled: the chunks' loads can be in flight together (this runs inside the GEMM's K loop).
    for r0 in tl.static_range(0, BLOCK_M, ROWS):
        push_rows(ctx, out, slots, peer_slots, parity, m0 + r0, n0, M, N, rank, WORLD, ROWS, BLOCK_N, TMA_PUSH)


@triton.jit
def reduce_rows(out, slots, m0, n0, M, N, rank, WORLD: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """One-shot: rows m0..m0 + ROWS, columns n0.. summed over the ranks in rank order in fp32
    (this rank's partial in `out`, peer q's in slot (q - rank - 1) mod world of `slots`) into
    `out`. The caller waited for the peers' partials."""
    rm = m0 + tl.arange(0, ROWS)
    rn = n0 + tl.arange(0, BLOCK_N)
    offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    total = add_in_rank_order(tl.zeros((ROWS, BLOCK_N), dtype=tl.float32), out, slots, tl.cast(M, tl.int64) * N,
                              offs, mask, rank, WORLD)
    tl.store(out + offs, total.to(out.dtype.element_ty), mask=mask)


@triton.jit
def reduce_tile(ctx, out, slots, t, M, N, rank, WORLD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                GROUP_M: tl.constexpr, REDUCE_ROWS: tl.constexpr):
    """One-shot: waits for every peer's partial of tile `t`, then `reduce_rows` of the whole tile in
    chunks of REDUCE_ROWS rows. Returns the status (nothing is read or written after a failed
    wait)."""
    s = il.symm_tile_wait_others(ctx, t)
    if s == 0:
        tm, tn = tile_coords(t, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
        for r0 in range(0, BLOCK_M, REDUCE_ROWS):
            reduce_rows(out, slots, tm * BLOCK_M + r0, tn * BLOCK_N, M, N, rank, WORLD, REDUCE_ROWS, BLOCK_N)
    return s


@triton.jit
def push_while_reducing(ctx, out, slots, peer_slots, parity, m0, n0, t, worst, M, N, rank, WORLD: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, ROWS: tl.constexpr,
                        TMA_PUSH: tl.constexpr):
    """One-shot, after the loop: `push_partial` of the last tile (rows m0.., columns n0.., staged
    in `out`) in chunks of ROWS rows, and between them the reduce of tile `t` (the tile before
    it; none when t < 0) in chunks as large: its peers' partials (waited for after the first
    chunk, unless `worst` already failed) are summed while the pushed chunks drain. Returns the
    status."""
    tl.debug_barrier()  # the staged partial: every thread's stores before these loads (push_partial)
    tm, tn = tile_coords(tl.maximum(t, 0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    for r0 in tl.static_range(0, BLOCK_M, ROWS):
        push_rows(ctx, out, slots, peer_slots, parity, m0 + r0, n0, M, N, rank, WORLD, ROWS, BLOCK_N, TMA_PUSH)
        if r0 == 0:
            if (t >= 0) & (worst == 0):
                worst = il.symm_tile_wait_others(ctx, t)
        if (t >= 0) & (worst == 0):
            reduce_rows(out, slots, tm * BLOCK_M + r0, tn * BLOCK_N, M, N, rank, WORLD, ROWS, BLOCK_N)
    return worst


@jit(do_not_specialize=["ctx"])
def matmul_allreduce_push_kernel(ctx, a, b, out, ws, peer_slots, epochs, half, M, N, K, stride_am, stride_ak, stride_bk,
                                 stride_bn, status, trace, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, TMA: tl.constexpr,
                                 B_ROW_MAJOR: tl.constexpr, WORLD: tl.constexpr, PUSH_ROWS: tl.constexpr,
                                 REDUCE_ROWS: tl.constexpr, STAGGER: tl.constexpr, TMA_PUSH: tl.constexpr,
                                 TAIL_INTERLEAVED: tl.constexpr = False, COMMUNICATE: tl.constexpr = True,
                                 TRACE: tl.constexpr = False):
    """Method "push", one-shot (see the module docs). out [M, N] (heap, contiguous) = all-reduce
    of a @ b. ws: the partials' slots (heap, this op's workspace): 2 x (world - 1) x [M, N] at least,
    the half (`half` elements, `launch_slots`) by the launch parity. epochs: one int32 per CTA
    (MAX_CTAS), the launches so far (a workspace zeroed at creation: equal on every rank).

    Per tile t, a CTA: runs the first part of t's K loop; pushes the partial of its previous tile
    (staged in `out`) to every peer; runs the rest of the K loop; signals the previous tile's
    partial; stages t's partial in `out`; reduces the tile of two steps ago (its peers' partials
    have been in for a whole tile). The split point differs between CTAs (STAGGER groups):
    pushes spread over the tile's time instead of all CTAs sending at once, which would queue
    every CTA behind a full NVLink for the whole burst.
    TMA_PUSH (Hopper, world 2): partials are pushed through `peer_slots`, a TMA descriptor
    (`push_partial`); else by stores from registers (`peer_slots` unused). The signal after a
    push waits for the TMA stores' completion (`symm_tile_signal_others`). The staging in `out`
    stays a plain store: the push and the reduce read it back with plain loads.
    TAIL_INTERLEAVED: after the loop, the last tile's push goes out in chunks with the reduce of
    the tile before it between them (`push_while_reducing`), not the whole push first: each
    chunk's TMA store waits for its reads, which on a full NVLink take the transfer's time.
    COMMUNICATE=False: the GEMM alone (the benchmark's reference). TRACE: six stamps per tile
    (first GEMM part, push, rest of the GEMM, signal, stage, reduce), one at the end."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    stamp(trace, 0, TRACE)
    rank = il.symm_rank(ctx)
    epoch, parity, slots = launch_slots(ws, epochs, half)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    split = ((pid % STAGGER) * tl.cdiv(K, BLOCK_K) // STAGGER) * BLOCK_K
    worst = pid * 0
    p1, p1_m0, p1_n0 = pid * 0 - 1, pid * 0, pid * 0  # the previous tile: pushed during this one
    p2 = pid * 0 - 1  # the tile before it: reduced after this one
    step = 0
    for t in range(pid, tiles_m * tiles_n, grid):
        tm, tn = tile_coords(t, tiles_m, tiles_n, GROUP_M)
        m0, n0 = tm * BLOCK_M, tn * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = gemm_range(acc, a, b, m0, M, n0, N, 0, split, K, stride_am, stride_ak, stride_bk, stride_bn, TMA,
                         B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K)
        stamp(trace, 1 + 6 * step, TRACE)
        if COMMUNICATE:
            if p1 >= 0:
                push_partial(ctx, out, slots, peer_slots, parity, p1_m0, p1_n0, M, N, rank, WORLD, BLOCK_M, BLOCK_N,
                             PUSH_ROWS, TMA_PUSH)
        stamp(trace, 2 + 6 * step, TRACE)
        acc = gemm_range(acc, a, b, m0, M, n0, N, split, K, K, stride_am, stride_ak, stride_bk, stride_bn, TMA,
                         B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K)
        stamp(trace, 3 + 6 * step, TRACE)
        # The signal before the stage: its release then waits only for the push, long drained,
        # not for the stage's stores.
        if COMMUNICATE:
            if p1 >= 0:
                worst = ilt.failure_or(il.symm_tile_signal_others(ctx, p1), worst)
        stamp(trace, 4 + 6 * step, TRACE)
        store_tile(out, acc, m0, n0, M, N, BLOCK_M, BLOCK_N)
        stamp(trace, 5 + 6 * step, TRACE)
        if COMMUNICATE:
            if (p2 >= 0) & (worst == 0):
                worst = reduce_tile(ctx, out, slots, p2, M, N, rank, WORLD, BLOCK_M, BLOCK_N, GROUP_M, REDUCE_ROWS)
        stamp(trace, 6 + 6 * step, TRACE)
        p2 = p1
        p1, p1_m0, p1_n0 = t, m0, n0
        step += 1
    if COMMUNICATE:
        # The last tile's partial goes out now (nothing left to overlap it with), and the last two
        # tiles are reduced.
        if TAIL_INTERLEAVED:
            if p1 >= 0:
                worst = push_while_reducing(ctx, out, slots, peer_slots, parity, p1_m0, p1_n0, p2, worst, M, N,
                                            rank, WORLD, BLOCK_M, BLOCK_N, GROUP_M, PUSH_ROWS, TMA_PUSH)
        else:
            if p1 >= 0:
                push_partial(ctx, out, slots, peer_slots, parity, p1_m0, p1_n0, M, N, rank, WORLD, BLOCK_M,
                             BLOCK_N, PUSH_ROWS, TMA_PUSH)
            # The tile before it is reduced while the push's last TMA store drains (the signal
            # waits for it): its peers' partials came in long ago.
            if (p2 >= 0) & (worst == 0):
                worst = reduce_tile(ctx, out, slots, p2, M, N, rank, WORLD, BLOCK_M, BLOCK_N, GROUP_M, REDUCE_ROWS)
        if p1 >= 0:
            worst = ilt.failure_or(il.symm_tile_signal_others(ctx, p1), worst)
        if (p1 >= 0) & (worst == 0):
            worst = reduce_tile(ctx, out, slots, p1, M, N, rank, WORLD, BLOCK_M, BLOCK_N, GROUP_M, REDUCE_ROWS)
        stamp(trace, 1 + 6 * step, TRACE)
        advance_epochs(epochs, epoch + 1)
    tl.store(status + pid, worst)


__all__ = ["matmul_allreduce_push_kernel", "push_partial", "push_rows", "push_while_reducing", "reduce_rows",
           "reduce_tile"]
