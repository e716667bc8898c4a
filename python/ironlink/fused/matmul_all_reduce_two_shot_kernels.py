"""matmul_all_reduce's method "push", two-shot by slices: each rank sums the tiles of its slice
(`matmul_allreduce_owner_kernel`; the module docs of `fused.matmul_all_reduce`, the "module
docs" of the docstrings here, describe the method, and that module plans and launches it). Its
tile steps serve matmul_reduce_scatter's kernels too (`matmul_reduce_scatter_kernels`: the
destinations' row blocks as the slices). Alternate launches use alternate halves of the op's
workspace (`launch_slots`, `advance_epochs`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import language as il
from ..language import typed as ilt
from ..language.jit import jit
from ..language.slots import advance_epochs, launch_slots, slot_of
from ..language.trace import stamp
from .gemm_tiles import gemm_range, store_tile, tile_coords


@triton.jit
def slice_start(s, tiles, WORLD: tl.constexpr):
    """The first tile of rank `s`'s slice in two-shot: the ranks own equal runs of consecutive
    tiles (in tile_coords order: groups of whole tile rows)."""
    return (s * tiles + WORLD - 1) // WORLD


@triton.jit
def slice_owner(t, tiles, WORLD: tl.constexpr):
    """The rank whose slice holds tile `t`: slice_start(owner) <= t < slice_start(owner + 1)."""
    return (t * WORLD) // tiles


@triton.jit
def first_owned_j(rank, tiles, WORLD: tl.constexpr):
    """The number of tiles of the other slices: rank `rank` walks them first (j = 0 ..), its own
    slice after."""
    return tiles - (slice_start(rank + 1, tiles, WORLD) - slice_start(rank, tiles, WORLD))


@triton.jit
def first_own_step(pid, grid, own_j):
    """The first step of CTA `pid` of `grid` (walk index pid + step * grid) at a walk index >=
    own_j: its first tile of its rank's own slice."""
    return tl.maximum(tl.cdiv(own_j - pid, grid), 0)


@triton.jit
def signal_points(i, pid, grid, own_j, EVERY: tl.constexpr):
    """Batched signals (two-shot, reduce-scatter's kernel): a CTA (`pid` of `grid`) signals at
    its steps that are multiples of EVERY and at its first step whose tile is its rank's own
    (walk index >= own_j: before its first wait), each time the pushes of the steps since the
    last such point. Returns (that last point before step i: the first step not yet signalled,
    whether i is a point)."""
    i_own = first_own_step(pid, grid, own_j)
    since = tl.maximum((i - 1) // EVERY * EVERY, tl.where((i_own < i), i_own, 0))
    return since, (i > 0) & ((i % EVERY == 0) | (i == i_own))


@triton.jit
def push_tile(ctx, dst, peer_dst, index, value, m0, n0, M, N, peer, TMA_PUSH: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """Stores the tile `value` (rows m0.., columns n0..) into `peer`'s copy of the contiguous
    [M, N] matrix at `dst` (a heap address). TMA_PUSH (world 2): through `peer_dst` instead, a
    TMA descriptor of [*, M, N] matrices in the one peer (blocks [1, BLOCK_M, BLOCK_N]), matrix
    `index`: the SM's copy engine sends from shared memory while the warps go on
    (`symm_tile_signal*` waits for it)."""
    if TMA_PUSH:
        peer_dst.store([index, m0, n0], value.reshape(1, BLOCK_M, BLOCK_N))
    else:
        store_tile(ilt.peer_pointer(ctx, dst, peer), value, m0, n0, M, N, BLOCK_M, BLOCK_N)


@triton.jit
def sum_partials(own, slots, m0, n0, M, N, rank, WORLD: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """The fp32 sum over the ranks, in rank order, of one tile's partials: this rank's `own` (in
    registers) and peer q's from its slot (q - rank - 1) mod world of `slots` [world - 1, M, N]."""
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    offs = rm[:, None] * N + rn[None, :]  # within the tile: BLOCK_M rows of N fit in int32
    mask = (m0 + rm[:, None] < M) & (n0 + rn[None, :] < N)
    base = slots + m0.to(tl.int64) * N + n0
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for q in tl.static_range(WORLD):
        if q == rank:
            total += own.to(tl.float32)
        else:
            slot = tl.cast(slot_of(q, rank, WORLD), tl.int64) * M * N
            total += tl.load(base + slot + offs, mask=mask).to(tl.float32)
    return total


@triton.jit
def signal_pushed(ctx, t, owner, rank):
    """Announces the pushes of tile `t`: its partial to `owner`, or, by the owner, its sum to all."""
    if owner == rank:
        s = il.symm_tile_signal_others(ctx, t)
    else:
        s = il.symm_tile_signal(ctx, t, owner)
    return s


@triton.jit
def finish_piece(ctx, out, slots, peer_slots, peer_out, parity, value, m0, n0, M, N, rank, owner,
                 WORLD: tl.constexpr, TMA_PUSH: tl.constexpr, BLOCK_M: tl.constexpr, PIECE_N: tl.constexpr,
                 BROADCAST: tl.constexpr = True):
    """Two-shot, a [BLOCK_M, PIECE_N] piece `value` (out's dtype) of this rank's partial of a tile,
    at rows m0.., columns n0.. of an [M, N] matrix: into its slot at the owner, or, on the owner
    (whose wait for the peers' partials succeeded), summed with theirs into this rank's out and,
    with BROADCAST (all-reduce; not reduce-scatter), every other rank's."""
    if owner != rank:
        slot = (rank - owner - 1 + WORLD) % WORLD  # 0 at world 2 (the TMA path)
        push_tile(ctx, slots + tl.cast(slot, tl.int64) * M * N, peer_slots, parity, value, m0, n0, M, N, owner,
                  TMA_PUSH, BLOCK_M, PIECE_N)
    else:
        total = sum_partials(value, slots, m0, n0, M, N, rank, WORLD, BLOCK_M, PIECE_N).to(out.dtype.element_ty)
        store_tile(out, total, m0, n0, M, N, BLOCK_M, PIECE_N)
        if BROADCAST:
            for k in tl.static_range(1, WORLD):
                push_tile(ctx, out, peer_out, 0, total, m0, n0, M, N, (rank + k) % WORLD, TMA_PUSH, BLOCK_M,
                          PIECE_N)


@jit(do_not_specialize=["ctx"])
def matmul_allreduce_owner_kernel(ctx, a, b, out, ws, peer_slots, peer_out, epochs, half, M, N, K, stride_am, stride_ak,
                                  stride_bk, stride_bn, signal_k, status, trace, BLOCK_M: tl.constexpr,
                                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                                  TMA: tl.constexpr, B_ROW_MAJOR: tl.constexpr, WORLD: tl.constexpr,
                                  TMA_PUSH: tl.constexpr, FLAT: tl.constexpr = False, SIGNAL_EVERY: tl.constexpr = 1,
                                  COMMUNICATE: tl.constexpr = True, TRACE: tl.constexpr = False):
    """Method "push", two-shot by slices (see the module docs). out [M, N] (heap, contiguous) =
    all-reduce of a @ b. ws: the partials' slots (heap): 2 x (world - 1) x [M, N] at least, the
    half (`half` elements, `launch_slots`) by the launch parity (`epochs`, as the one-shot kernel).
    TMA_PUSH (world 2): `peer_slots` and `peer_out` are TMA descriptors of the peer's slots [2, M,
    N] (its halves `half` apart) and of its out [1, M, N]
    (`push_tile`; blocks [1, BLOCK_M, BLOCK_N], or half as wide with FLAT); else unused.

    Rank r walks the tiles from slice r + 1 on, its own slice last. A tile it does not own goes,
    rounded to out's dtype, from registers into its slot at the owner; a tile it owns is summed
    with the partials its peers pushed (they computed it in their first slices, long before) and
    the sum goes into every rank's out. A CTA signals a tile's pushes once it has run `signal_k`
    of its next tile's K loop (the pushes drain behind the GEMM; the signal waits for them), and
    at the end waits for the sums of the tiles it pushed. A wait for partials never depends on
    another wait (the peers pushed them from their first slices, which wait for nothing), so no
    cycle of waits can form.
    FLAT: one K loop per tile, the tile loop flattened with it (`tl.range(flatten=True)`: Triton
    pipelines the loads across tiles instead of draining at each), the signal after the K loop
    (signal_k unused) and the epilogue in two halves of BLOCK_N / 2 columns.
    SIGNAL_EVERY (FLAT, world 2): a CTA signals its pushes every SIGNAL_EVERY tiles, each batch
    with one release (`symm_tile_signal_batch`), and always at its first owned tile (before its
    first wait: a partial left unsignalled behind a wait could close a cycle of waits) and after
    the loop (`signal_points`): a signal costs its system-scope release, and a tile's reader waits
    for it only much later (an owner sums the peer's partials in its second half, a rank waits
    for the sums at its end).
    COMMUNICATE=False: the GEMM alone. TRACE: five stamps per tile (GEMM up to signal_k, signal,
    rest of the GEMM, wait for the partials, push or sum), one at the end."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    stamp(trace, 0, TRACE)
    rank = il.symm_rank(ctx)
    epoch, parity, slots = launch_slots(ws, epochs, half)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    tiles = tiles_m * tiles_n
    first = slice_start((rank + 1) % WORLD, tiles, WORLD)
    worst = pid * 0
    pending, pending_owner = pid * 0 - 1, pid * 0  # the tile pushed last: signalled during the next
    step = 0
    HALF_N: tl.constexpr = BLOCK_N // 2
    for j in tl.range(pid, tiles, grid, flatten=FLAT):
        t = (j + first) % tiles
        owner = slice_owner(t, tiles, WORLD)
        tm, tn = tile_coords(t, tiles_m, tiles_n, GROUP_M)
        m0, n0 = tm * BLOCK_M, tn * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if FLAT:
            acc = gemm_range(acc, a, b, m0, M, n0, N, 0, K, K, stride_am, stride_ak, stride_bk, stride_bn, TMA,
                             B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K)
            stamp(trace, 1 + 5 * step, TRACE)
            # The previous tile's pushes (made while no wait had failed; else nothing is pushed
            # or signalled any more). Computed, not carried: Triton 3.6's loop flattening
            # breaks on an `if` that assigns a loop-carried value here.
            if COMMUNICATE:
                if SIGNAL_EVERY == 1:
                    prev = (j - grid + first) % tiles
                    if (j >= pid + grid) & (worst == 0):
                        worst = signal_pushed(ctx, prev, slice_owner(prev, tiles, WORLD), rank)
                else:  # the pushes since the last signal point, at a signal point
                    i = (j - pid) // grid
                    since, due = signal_points(i, pid, grid, first_owned_j(rank, tiles, WORLD), SIGNAL_EVERY)
                    if due & (worst == 0):
                        worst = il.symm_tile_signal_batch(ctx, (pid + since * grid + first) % tiles, grid, i - since,
                                                          tiles, 1 - rank)
            stamp(trace, 2 + 5 * step, TRACE)
            stamp(trace, 3 + 5 * step, TRACE)
        else:
            acc = gemm_range(acc, a, b, m0, M, n0, N, 0, signal_k, K, stride_am, stride_ak, stride_bk, stride_bn,
                             TMA, B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K)
            stamp(trace, 1 + 5 * step, TRACE)
            if COMMUNICATE:
                if pending >= 0:
                    worst = ilt.failure_or(signal_pushed(ctx, pending, pending_owner, rank), worst)
                    pending = -1
            stamp(trace, 2 + 5 * step, TRACE)
            acc = gemm_range(acc, a, b, m0, M, n0, N, signal_k, K, K, stride_am, stride_ak, stride_bk, stride_bn,
                             TMA, B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K)
            stamp(trace, 3 + 5 * step, TRACE)
        own = acc.to(out.dtype.element_ty)
        if COMMUNICATE:
            if owner == rank:
                if worst == 0:
                    worst = il.symm_tile_wait_others(ctx, t)
            stamp(trace, 4 + 5 * step, TRACE)
            if worst == 0:
                if FLAT:
                    left, right = tl.split(own.reshape(BLOCK_M, 2, HALF_N).permute(0, 2, 1))
                    finish_piece(ctx, out, slots, peer_slots, peer_out, parity, left, m0, n0, M, N, rank, owner,
                                 WORLD, TMA_PUSH, BLOCK_M, HALF_N)
                    finish_piece(ctx, out, slots, peer_slots, peer_out, parity, right, m0, n0 + HALF_N, M, N, rank,
                                 owner, WORLD, TMA_PUSH, BLOCK_M, HALF_N)
                else:
                    finish_piece(ctx, out, slots, peer_slots, peer_out, parity, own, m0, n0, M, N, rank, owner,
                                 WORLD, TMA_PUSH, BLOCK_M, BLOCK_N)
                    pending, pending_owner = t, owner
        else:
            stamp(trace, 4 + 5 * step, TRACE)
            store_tile(out, own, m0, n0, M, N, BLOCK_M, BLOCK_N)
        stamp(trace, 5 + 5 * step, TRACE)
        step += 1
    if COMMUNICATE:
        if FLAT:  # the pushes not signalled in the loop (see there)
            if SIGNAL_EVERY == 1:
                last = (pid + (step - 1) * grid + first) % tiles
                if (step > 0) & (worst == 0):
                    worst = signal_pushed(ctx, last, slice_owner(last, tiles, WORLD), rank)
            else:
                since, _ = signal_points(step, pid, grid, first_owned_j(rank, tiles, WORLD), SIGNAL_EVERY)
                if (step > 0) & (worst == 0):
                    worst = il.symm_tile_signal_batch(ctx, (pid + since * grid + first) % tiles, grid, step - since,
                                                      tiles, 1 - rank)
        elif pending >= 0:
            worst = ilt.failure_or(signal_pushed(ctx, pending, pending_owner, rank), worst)
        # The sums of the tiles this CTA pushed, from their owners.
        for j in range(pid, tiles, grid):
            t = (j + first) % tiles
            owner = slice_owner(t, tiles, WORLD)
            if (owner != rank) & (worst == 0):
                worst = il.symm_tile_wait(ctx, t, owner)
        stamp(trace, 1 + 5 * step, TRACE)
        advance_epochs(epochs, epoch + 1)
    tl.store(status + pid, worst)


__all__ = ["finish_piece", "first_own_step", "first_owned_j", "matmul_allreduce_owner_kernel", "push_tile",
           "signal_points", "signal_pushed", "slice_owner", "slice_start", "sum_partials"]
