"""Matmul + all-reduce in one kernel: the row-parallel linear of tensor parallelism.

    out = ironlink.matmul_all_reduce(a, b)      # a [M, K/world], b [K/world, N] -> out [M, N]

`out` (a heap tensor) gets sum_over_ranks(a_r @ b_r). Each rank's product is rounded to the output
dtype tile by tile, and the tiles are summed in fp32 in rank order: results are bitwise identical
on every rank.

Two methods, both one persistent kernel whose CTAs walk the output tiles (tile t on CTA t % grid,
the same on every rank):

- "push" (the default on one node): producer / consumer. No CTA waits for another rank before its
  next GEMM tile. After computing tile t a CTA stores its partial straight into the workspace of
  each rank that will reduce it (the tile's *owners*) and signals them (`symm_tile_signal`, a
  posted add); it then reduces the tile it computed one step earlier, if it owns it: by then the
  peers, which computed that tile at the same time, have long pushed their partials, so the wait
  (`symm_tile_wait_others`) rarely waits. With world 2 every rank owns every tile (one-shot: one
  hop, the same bytes as two-shot at world 2); with more ranks one rank owns each tile (two-shot:
  the owner pushes the sum back into every peer's `out` and signals it, and a CTA waits for the
  sums of its tiles only at the end). The workspace lives in the heap (`heap.workspace`):
  (world - 1) slots of [M, N], twice over for one-shot (alternate launches use alternate halves,
  so a fast rank never overwrites partials a slow peer has not summed yet).
- "tile": each tile is all-reduced by the CTA that computed it, with `symm_tile_all_reduce`
  (a rendezvous with the peers' CTAs of the same tile, two cross-rank barriers): simple, but
  every CTA stops at its tile's barriers while nothing else runs on its SM.

The operands are read through TMA descriptors where the GPU and their layout allow
(`gemm.operand_layout`), else through pointers with their strides. Tiles per launch are at most
`MAX_TILES`; the tile shape (`tuning.matmul_config`) grows for larger outputs to stay within it.

On a heap of several nodes the kernel computes every tile, passes a grid barrier and all-reduces
the whole output with `symm_all_reduce_hierarchical` (one launch, linked with the NVSHMEM bitcode;
communication no longer overlaps the GEMM). The tile all-reduce across nodes
(`symm_tile_all_reduce_hierarchical`) would keep the overlap; it has not been measured against
this yet (docs/backends.md).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import triton
import triton.language as tl

from .. import _abi
from .. import language as il
from .. import tuning
from .. import typed as ilt
from ..distributed import sm_share
from ..jit import jit
from ..ops import TensorSpec, heap_for, in_heap, launch_with_status
from .gemm import (check_operands, check_output, gemm_range, layout_for, operand_descriptors, product_tile, store_tile,
                   tile_coords)
from .trace import stamp


METHODS = ("push", "tile")


class Plan(NamedTuple):
    m: int
    n: int
    k: int
    config: tuning.MatmulConfig
    ctas: int
    method: str
    one_shot: bool  # push: every rank reduces every tile (world 2)
    workspace_bytes: int  # push: the partials' slots


def plan(a: TensorSpec, b: TensorSpec, out: TensorSpec, device: str, world: int, sms: int,
         config: Optional[tuning.MatmulConfig] = None, method: Optional[str] = None) -> Plan:
    """Checks the operands (pure: testable without a GPU) and chooses the launch."""
    m, k, n, code = check_operands(a, b, device, "matmul_all_reduce")
    check_output(out, (m, n), code, device, "matmul_all_reduce")
    cfg = config or tuning.matmul_config(m, n, k, world)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    if tiles > _abi.MAX_TILES:
        raise ValueError(f"{tiles} output tiles of {cfg.block_m}x{cfg.block_n}: at most {_abi.MAX_TILES} "
                         "(a larger tile shape, or split the matmul)")
    method = method or tuning.matmul_method(m, n, world)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    one_shot = world == 2
    slots = (world - 1) * (2 if one_shot else 1)
    ws = slots * m * n * out.itemsize if method == "push" else 0
    return Plan(m, n, k, cfg, max(1, min(tiles, sms)), method, one_shot, ws)


@triton.jit
def tile_owner(t, grid, world):
    """The rank that reduces tile `t` in two-shot: rotates over a CTA's successive tiles (t % grid
    is the CTA, t // grid its step) and over the CTAs of one step, so every step sends partials
    in every direction. The same on every rank (the grid is)."""
    return (t % grid + t // grid) % world


@triton.jit
def reduces(owner, rank, ONE_SHOT: tl.constexpr):
    """Whether `rank` sums a tile owned by `owner`: every rank in one-shot, the owner in two-shot."""
    if ONE_SHOT:
        return owner >= 0
    else:
        return owner == rank


@triton.jit
def push_partial(ctx, out, slots, peer_slots, parity, t, m0, n0, M, N, rank, world, grid, ONE_SHOT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, TMA_PUSH: tl.constexpr):
    """Copies this rank's partial of tile `t`, staged in `out`, into its slot (rank - dest - 1) mod
    world in the workspace of each other rank `dest` that reduces the tile. TMA_PUSH (one-shot,
    world 2): through `peer_slots`, a TMA descriptor of the one peer's slots [2, M, N] (blocks
    [1, ROWS, BLOCK_N]), so the copy engine of the SM sends while the warps go on."""
    owner = tile_owner(t, grid, world)
    rn = n0 + tl.arange(0, BLOCK_N)
    # Unrolled: the chunks' loads can be in flight together (this runs inside the GEMM's K loop).
    for r0 in tl.static_range(0, BLOCK_M, ROWS):
        rm = m0 + r0 + tl.arange(0, ROWS)
        offs = rm[:, None].to(tl.int64) * N + rn[None, :]
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        v = tl.load(out + offs, mask=mask)
        if TMA_PUSH:
            peer_slots.store([parity, m0 + r0, n0], v.reshape(1, ROWS, BLOCK_N))
        else:
            for k in range(1, world):
                dest = (rank + k) % world
                if reduces(owner, dest, ONE_SHOT):
                    slot = tl.cast((rank - dest - 1 + world) % world, tl.int64) * M * N
                    tl.store(ilt.peer_pointer(ctx, slots, dest) + slot + offs, v, mask=mask)


@triton.jit
def signal_partial(ctx, t, grid, rank, world, ONE_SHOT: tl.constexpr):
    """Tells the ranks that reduce tile `t` that this rank's partial is in their workspace."""
    if ONE_SHOT:
        s = il.symm_tile_signal_others(ctx, t)
    else:
        owner = tile_owner(t, grid, world)
        s = owner * 0
        if owner != rank:
            s = il.symm_tile_signal(ctx, t, owner)
    return s


@triton.jit
def reduce_tile(ctx, out, slots, t, M, N, rank, WORLD: tl.constexpr, grid, ONE_SHOT: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, REDUCE_ROWS: tl.constexpr):
    """If this rank reduces tile `t`: waits for every peer's partial, sums the tile over the ranks
    in rank order in fp32 (this rank's partial in `out`, peer q's in slot (q - rank - 1) mod world
    of `slots`) into `out`, and in two-shot also into every peer's `out`, then signals them, in
    chunks of REDUCE_ROWS rows. Returns the status (nothing is read or written after a failed
    wait)."""
    s = t * 0
    if reduces(tile_owner(t, grid, WORLD), rank, ONE_SHOT):
        s = il.symm_tile_wait_others(ctx, t)
        if s == 0:
            tm, tn = tile_coords(t, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
            rn = tn * BLOCK_N + tl.arange(0, BLOCK_N)
            slot = tl.cast(M, tl.int64) * N
            for r0 in range(0, BLOCK_M, REDUCE_ROWS):
                rm = tm * BLOCK_M + r0 + tl.arange(0, REDUCE_ROWS)
                offs = rm[:, None].to(tl.int64) * N + rn[None, :]
                mask = (rm[:, None] < M) & (rn[None, :] < N)
                total = tl.zeros((REDUCE_ROWS, BLOCK_N), dtype=tl.float32)
                # Unrolled over the ranks: every rank's load is in flight at once.
                for q in tl.static_range(WORLD):
                    src = tl.where(q == rank, out, slots + ((q - rank - 1 + WORLD) % WORLD) * slot)
                    total += tl.load(src + offs, mask=mask).to(tl.float32)
                result = total.to(out.dtype.element_ty)
                tl.store(out + offs, result, mask=mask)
                if not ONE_SHOT:
                    for k in tl.static_range(1, WORLD):
                        tl.store(ilt.peer_pointer(ctx, out, (rank + k) % WORLD) + offs, result, mask=mask)
            if not ONE_SHOT:
                s = il.symm_tile_signal_others(ctx, t)
    return s


@jit(do_not_specialize=["ctx"])
def matmul_allreduce_push_kernel(ctx, a, b, out, ws, peer_slots, epochs, M, N, K, stride_am, stride_ak, stride_bk,
                                 stride_bn, status, trace, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, ONE_SHOT: tl.constexpr,
                                 TMA: tl.constexpr, B_ROW_MAJOR: tl.constexpr, WORLD: tl.constexpr,
                                 PUSH_ROWS: tl.constexpr, REDUCE_ROWS: tl.constexpr, STAGGER: tl.constexpr,
                                 TMA_PUSH: tl.constexpr,
                                 COMMUNICATE: tl.constexpr = True, TRACE: tl.constexpr = False):
    """Method "push" (see the module docs). out [M, N] (heap, contiguous) = all-reduce of a @ b.
    ws: the partials' slots (heap, this op's workspace): (world - 1) x [M, N], twice in ONE_SHOT
    (by the CTA's launch parity). epochs: one int32 per CTA (MAX_CTAS), its launches so far
    (a workspace zeroed at creation: equal on every rank).

    Per tile t, a CTA: runs the first part of t's K loop; pushes the partial of its previous tile
    (staged in `out`) to the reducing ranks; runs the rest of the K loop; signals the previous
    tile's partial; stages t's partial in `out`; reduces the tile of two steps ago (its peers'
    partials have been in for a whole tile). The split point differs between CTAs (STAGGER
    groups): pushes spread over the tile's time instead of all CTAs sending at once, which would
    queue every CTA behind a full NVLink for the whole burst.
    TMA_PUSH (one-shot, Hopper): partials are pushed through `peer_slots`, a TMA descriptor
    (`push_partial`); else by stores from registers (`peer_slots` unused). The signal after a
    push waits for the TMA stores' completion (`symm_tile_signal_others`). The staging in `out`
    stays a plain store: the push and the reduce read it back with plain loads.
    COMMUNICATE=False: the GEMM alone (the benchmark's reference). TRACE: six stamps per tile
    (first GEMM part, push, rest of the GEMM, signal, stage, reduce), one at the end."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    stamp(trace, 0, TRACE)
    rank = il.symm_rank(ctx)
    epoch = tl.load(epochs + pid)
    parity = epoch % 2
    slots = ws
    if ONE_SHOT:
        slots += parity.to(tl.int64) * (WORLD - 1) * M * N
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
                push_partial(ctx, out, slots, peer_slots, parity, p1, p1_m0, p1_n0, M, N, rank, WORLD, grid, ONE_SHOT,
                             BLOCK_M, BLOCK_N, PUSH_ROWS, TMA_PUSH)
        stamp(trace, 2 + 6 * step, TRACE)
        acc = gemm_range(acc, a, b, m0, M, n0, N, split, K, K, stride_am, stride_ak, stride_bk, stride_bn, TMA,
                         B_ROW_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K)
        stamp(trace, 3 + 6 * step, TRACE)
        # The signal before the stage: its release then waits only for the push, long drained,
        # not for the stage's stores.
        if COMMUNICATE:
            if p1 >= 0:
                worst = ilt.failure_or(signal_partial(ctx, p1, grid, rank, WORLD, ONE_SHOT), worst)
        stamp(trace, 4 + 6 * step, TRACE)
        store_tile(out, acc, m0, n0, M, N, BLOCK_M, BLOCK_N)
        stamp(trace, 5 + 6 * step, TRACE)
        if COMMUNICATE:
            if (p2 >= 0) & (worst == 0):
                worst = reduce_tile(ctx, out, slots, p2, M, N, rank, WORLD, grid, ONE_SHOT, BLOCK_M, BLOCK_N, GROUP_M,
                                    REDUCE_ROWS)
        stamp(trace, 6 + 6 * step, TRACE)
        p2 = p1
        p1, p1_m0, p1_n0 = t, m0, n0
        step += 1
    if COMMUNICATE:
        # The last tile's partial goes out now (nothing left to overlap it with); then the last two
        # tiles are reduced.
        if p1 >= 0:
            push_partial(ctx, out, slots, peer_slots, parity, p1, p1_m0, p1_n0, M, N, rank, WORLD, grid, ONE_SHOT,
                         BLOCK_M, BLOCK_N, PUSH_ROWS, TMA_PUSH)
            worst = ilt.failure_or(signal_partial(ctx, p1, grid, rank, WORLD, ONE_SHOT), worst)
        if (p2 >= 0) & (worst == 0):
            worst = reduce_tile(ctx, out, slots, p2, M, N, rank, WORLD, grid, ONE_SHOT, BLOCK_M, BLOCK_N, GROUP_M,
                                REDUCE_ROWS)
        if (p1 >= 0) & (worst == 0):
            worst = reduce_tile(ctx, out, slots, p1, M, N, rank, WORLD, grid, ONE_SHOT, BLOCK_M, BLOCK_N, GROUP_M,
                                REDUCE_ROWS)
        # Two-shot: the sums of this CTA's other tiles, pushed by their owners.
        if not ONE_SHOT:
            for t in range(pid, tiles_m * tiles_n, grid):
                owner = tile_owner(t, grid, WORLD)
                if (owner != rank) & (worst == 0):
                    worst = il.symm_tile_wait(ctx, t, owner)
        stamp(trace, 1 + 6 * step, TRACE)
        tl.store(epochs + pid, epoch + 1)
    tl.store(status + pid, worst)


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
            s = ilt.tile_all_reduce(ctx, out + m0.to(tl.int64) * N + n0, tl.minimum(BLOCK_M, M - m0),
                                    tl.minimum(BLOCK_N, N - n0), N, t)
            worst = ilt.failure_or(s, worst)
        stamp(trace, 2 + 2 * step, TRACE)
        step += 1
    tl.store(status + pid, worst)


# A heap of several nodes: every tile first, a grid barrier, then the hierarchical all-reduce of the
# whole output (see the module docs); linked with the NVSHMEM bitcode.
@jit(do_not_specialize=["ctx"], nvshmem=True)
def matmul_allreduce_hierarchical_kernel(ctx, a, b, out, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, status,
                                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                         GROUP_M: tl.constexpr):
    pid, grid = tl.program_id(0), tl.num_programs(0)
    for t in range(pid, tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), grid):
        product_tile(a, b, out, t, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K,
                      GROUP_M)
    # Every CTA's tiles visible to every CTA: each all-reduces a slice of the whole output.
    s = il.symm_grid_barrier(ctx)
    r = ilt.all_reduce_hierarchical(ctx, out, M * N)
    tl.store(status + pid, ilt.failure_or(s, r))


def matmul_all_reduce(a: Any, b: Any, out: Any = None, heap: Any = None,
                      config: Optional[tuning.MatmulConfig] = None, method: Optional[str] = None,
                      check: bool = False) -> Any:
    """`out` [M, N] = sum over ranks of `a` [M, K] @ `b` [K, N] (bf16/fp16). `out` must be a heap
    tensor; when None, one is allocated from `heap` (the caller frees it with heap.free).
    `method`: "push" or "tile" (module docs; default `tuning.matmul_method`), on one node. "push"
    keeps a workspace in the heap: (world - 1) x M x N elements, twice at world 2.
    Collective; CUDA-graph capturable when `out` is given and the call ran once before with
    these shapes (the push method's workspace is made then)."""
    if heap is None and out is None:
        raise ValueError("matmul_all_reduce needs heap= (or out=, a tensor of the symmetric heap)")
    h = heap_for(out if out is not None else a, "out", heap, "matmul_all_reduce")
    if out is None:
        out = h.empty((a.shape[0], b.shape[-1]), a.dtype)
    if h.multi_node and method is not None:
        raise ValueError("matmul_all_reduce: method= chooses between one-node kernels; this heap spans several "
                         "nodes (one hierarchical kernel)")
    specs = TensorSpec.from_tensor(a, "a"), TensorSpec.from_tensor(b, "b"), TensorSpec.from_tensor(out, "out")
    sms = sm_share(h.device)  # the kernels wait for peers' CTAs: every CTA of every rank resident
    p = plan(*specs, str(h.device), h.world_size, sms, config, method)
    if p.m == 0 or p.n == 0:
        return out
    in_heap(h, "matmul_all_reduce", (out, "out"))
    if h.multi_node:
        kernel, function = matmul_allreduce_hierarchical_kernel, "symm_grid_barrier/symm_all_reduce_hierarchical"
        c = p.config
        launch_with_status(
            "matmul_all_reduce", h, p.ctas,
            lambda status: kernel[(p.ctas,)](h.ctx, a, b, out, p.m, p.n, p.k, a.stride(0), a.stride(1), b.stride(0),
                                             b.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
                                             BLOCK_K=c.block_k, GROUP_M=c.group_m, num_warps=c.warps,
                                             num_stages=c.stages),
            check, function=function)
        return out
    function = ("symm_tile_wait_others/symm_tile_signal/symm_tile_wait" if p.method == "push"
                else "symm_tile_all_reduce")
    launch_with_status("matmul_all_reduce", h, p.ctas, lambda status: launch(h, p, a, b, out, status), check,
                       function=function)
    return out


def launch(heap: Any, p: Plan, a: Any, b: Any, out: Any, status: Any, communicate: bool = True,
           trace: Any = None, stagger: Optional[int] = None, tma_push: Optional[bool] = None) -> None:
    """Launches plan `p`'s one-node kernel (no checks: `matmul_all_reduce` made them). The
    benchmark calls it directly: `communicate=False` times the GEMM alone, `trace` (int64
    [ctas, TRACE_SLOTS], zeroed) records where each CTA's time goes (fused/trace.py), `stagger`
    replaces tuning.MATMUL_PUSH_STAGGER, `tma_push=False` pushes by stores from registers where
    TMA could take them."""
    c = p.config
    strides = a.stride(0), a.stride(1), b.stride(0), b.stride(1)
    stamps = trace if trace is not None else status
    meta = dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m, COMMUNICATE=communicate,
                TRACE=trace is not None, num_warps=c.warps, num_stages=c.stages)
    if p.method == "tile":
        matmul_allreduce_kernel[(p.ctas,)](heap.ctx, a, b, out, p.m, p.n, p.k, *strides, status, stamps, **meta)
        return
    import torch  # not at module load: the planning above runs without torch

    layout = layout_for(a, b)
    a_arg, b_arg = operand_descriptors(a, b, layout, c.block_m, c.block_n, c.block_k)
    ws = heap.workspace("matmul_all_reduce", p.workspace_bytes).view(out.dtype)
    epochs = heap.workspace("matmul_all_reduce/epochs", 4 * _abi.MAX_CTAS, zeroed_prefix=4 * _abi.MAX_CTAS)
    push_rows = max(1, min(c.block_m, 8192 // c.block_n))
    tma_gemm = a_arg is not a
    tma = tma_gemm and p.one_shot and (tma_push is None or tma_push) and (p.n * out.element_size()) % 16 == 0
    peer_slots = peer_slots_descriptor(heap, ws, p, push_rows) if tma else ws  # unused unless TMA_PUSH
    matmul_allreduce_push_kernel[(p.ctas,)](
        heap.ctx, a_arg, b_arg, out, ws, peer_slots, epochs.view(torch.int32), p.m, p.n, p.k, *strides,
        status, stamps, ONE_SHOT=p.one_shot, TMA=tma_gemm, B_ROW_MAJOR=layout.b_row_major,
        WORLD=heap.world_size, PUSH_ROWS=push_rows, REDUCE_ROWS=max(1, min(c.block_m, 16384 // c.block_n)),
        STAGGER=stagger or tuning.MATMUL_PUSH_STAGGER, TMA_PUSH=tma, **meta)


def peer_slots_descriptor(heap: Any, ws: Any, p: Plan, push_rows: int) -> Any:
    """A TMA descriptor of the one peer's partial slots [2, M, N] in PUSH_ROWS-row pieces, for the
    one-shot push at world 2 (the workspace is a heap tensor: 16-byte aligned)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, n = p.m, p.n
    peer = heap.peer_tensor(ws[:2 * m * n].view(2, m, n), 1 - heap.rank)
    return TensorDescriptor(peer, [2, m, n], [m * n, n, 1], [1, push_rows, p.config.block_n])


__all__ = ["METHODS", "launch", "matmul_all_reduce", "matmul_allreduce_hierarchical_kernel", "matmul_allreduce_kernel",
           "matmul_allreduce_push_kernel", "plan"]
