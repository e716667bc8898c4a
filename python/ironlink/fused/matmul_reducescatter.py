"""Matmul + reduce-scatter in one kernel: the row-parallel linear of sequence parallelism.

    out = ironlink.matmul_reduce_scatter(a, b)   # a [M, K], b [K, N] -> out [M / world, N]

Rank d's `out` gets rows d * M / world .. of sum_over_ranks(a_r @ b_r): PyTorch's
`fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0)`. One persistent launch, the two-shot
by slices of `fused.matmul_all_reduce_two_shot_kernels` with the destinations' row blocks as the slices:
- Rank r walks the output tiles block by block from block r + 1 on, its own block last. A tile
  of another block goes, rounded to the output dtype, from registers into its slot at the
  block's rank (a TMA store at world 2), announced to it (`symm_tile_signal`) once the CTA has
  run its next tile's K loop (the push drains behind the GEMM).
- A tile of its own block is summed, in rank order in fp32, with the partials its peers pushed
  (they computed this block first, long before: `symm_tile_wait_others` rarely waits) and
  stored into `out`. A wait never depends on another wait, so no cycle of waits can form.
- The slots alternate between two halves of the workspace by launch parity: a rank ends launch
  n only after every peer pushed into it in launch n, so after every peer ended launch n - 1;
  its launch n + 1 cannot overwrite a slot of launch n - 1 still being read.
No staging copy, no pass after the last GEMM. Every rank signals and waits equally often per
launch: back-to-back launches and CUDA-graph replays need no reset. The launch is persistent (at
most one CTA per SM): its waits need every CTA resident.

Copy engine (one node, from `tuning.MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS` rows a block on:
faster than the CTAs' pushes above there, slower below, measured; why is not probed):
`matmul_reducescatter_copy_engine_kernel` walks the tiles in the same order, but a tile of
another block is stored into a local workspace and counted; a side stream copies each chunk (a
group of GROUP_M tile rows) into its slot at the block's rank once the kernel's count says all
its tiles are there, and sets that rank's flag for it (`copy_engine`: the flag words, the go
after every peer's launch has started, the launch order). No CTA spends time on NVLink stores;
a tile of the own block waits for its chunk's flags, then sums the partials as above.

On a heap of several nodes a destination's workspace may have no address (another node), so the
kernel (`matmul_reducescatter_hierarchical_kernel`) computes every tile of a @ b into a workspace
[M, N], passes a grid barrier, reduce-scatters it in place with
`symm_reduce_scatter_hierarchical` (NVLink in the node, NVSHMEM puts across), passes a second
grid barrier and copies its block to `out`: the reduction no longer overlaps the GEMM. The
default method there is "collective" (one cuBLAS GEMM, then the same hierarchical
reduce-scatter); "overlap" copies between peers' memories with the copy engine and is refused.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import triton
import triton.language as tl

from ..language import _abi
from .. import language as il
from ..runtime import eager, streams, tuning
from ..language import typed as ilt
from ..runtime.distributed import sm_share
from ..language.jit import jit
from ..runtime.launch import launch_with_status
from ..runtime.tensor_spec import TensorSpec
from ..runtime.registry import heap_for
from . import copy_engine, cublas_methods
from .gemm_operands import check_operands, check_output, layout_for, operand_descriptors, peer_descriptor
from .gemm_tiles import copy_rows, gemm_range, product_tile, store_tile, tile_coords
from ..language.slots import advance_epochs, launch_slots
from ..runtime.workspaces import epoch_counters
from .matmul_all_reduce_two_shot_kernels import finish_piece, first_own_step, signal_points, sum_partials

COPY_COLS = 1024  # elements of a row of the result copied per piece to `out` (on a heap of several nodes)


class Plan(NamedTuple):
    m: int
    n: int
    k: int
    config: tuning.MatmulConfig
    tiles: int  # per destination rank
    ctas: int
    workspace_bytes: int


def check_shapes(a: TensorSpec, b: TensorSpec, out: TensorSpec, device: str, world: int) -> tuple[int, int, int]:
    """(M, K, N) after checking the operands and `out` (pure: testable without a GPU)."""
    op = "matmul_reduce_scatter"
    m, k, n, code = check_operands(a, b, device, op)
    if m % world:
        raise ValueError(f"{op}: M = {m} rows must split evenly over {world} ranks")
    check_output(out, (m // world, n), code, device, op)
    return m, k, n


def plan(a: TensorSpec, b: TensorSpec, out: TensorSpec, device: str, world: int, sms: int,
         config: Optional[tuning.MatmulConfig] = None) -> Plan:
    """Checks the operands (pure: testable without a GPU) and chooses the launch."""
    op = "matmul_reduce_scatter"
    m, k, n = check_shapes(a, b, out, device, world)
    cfg = config or tuning.matmul_config(m // world, n, k, world)
    tiles = cfg.tiles(m // world, n)
    if tiles > _abi.MAX_TILES:
        raise ValueError(f"{op}: {tiles} tiles of {cfg.block_m}x{cfg.block_n} per rank: at most "
                         f"{_abi.MAX_TILES} (a larger tile shape, or split the matmul)")
    ws = 2 * (world - 1) * (m // world) * n * a.itemsize  # the partials' slots, by launch parity
    return Plan(m, n, k, cfg, tiles, max(1, min(world * tiles, sms)), ws)


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
def matmul_reducescatter_kernel(ctx, a, b, out, ws, peer_slots, epochs, M, N, K, stride_am, stride_ak, stride_bk,
                                stride_bn, status, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WORLD: tl.constexpr,
                                TMA: tl.constexpr = False, B_ROW_MAJOR: tl.constexpr = False,
                                TMA_PUSH: tl.constexpr = False, SIGNAL_EVERY: tl.constexpr = 1,
                                COMMUNICATE: tl.constexpr = True):
    """out [M / WORLD, N] (contiguous) = this rank's rows of the reduce-scatter of a @ b (see the
    module docs): matmul_all_reduce's two-shot by slices with the slices the destinations' row
    blocks and no sums sent back. ws: the partials' slots (heap), 2 x (WORLD - 1) x [M / WORLD, N],
    the half by the launch parity (`epochs`: one int32 per possible CTA, zeroed at creation).
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
    epoch, parity, slots = launch_slots(ws, epochs, rows, N, WORLD)
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


@eager.register  # what the operator of its name runs (fused/torch_library.py finds it there)
def matmul_reduce_scatter(a: Any, b: Any, heap: Any, out: Any = None, config: Optional[tuning.MatmulConfig] = None,
                          check: bool = False, method: Optional[str] = None) -> Any:
    """`out` [M / world, N]: this rank's rows of sum over ranks of `a` [M, K] @ `b` [K, N] (bf16 or
    fp16, any strides). `out` may be any CUDA tensor (default: a new one, contiguous). Uses
    workspaces of about M x N elements from `heap`, kept between calls (`heap.workspace`).
    `method`: "kernel" (this module's one-kernel Triton version; `config` its tiles), "collective"
    or "overlap" (cuBLAS GEMMs and ironlink transfers, `fused.cublas_methods`); default
    `tuning.sp_method` ("collective" on a heap of several nodes, where "overlap" is refused).
    Collective; CUDA-graph capturable."""
    from ..runtime.handles import compiling

    if compiling():  # torch.compile: the registered operator (fused/torch_library.py)
        from .torch_library import matmul_reduce_scatter as traced
        return traced(a, b, heap, out, config, check, method)
    import torch

    if heap is None:
        raise ValueError("matmul_reduce_scatter needs heap= (its workspace lives in the symmetric heap)")
    h = heap_for(a, "a", heap, "matmul_reduce_scatter")
    if out is None:
        out = torch.empty((a.shape[0] // h.world_size, b.shape[-1]), device=a.device, dtype=a.dtype)
    specs = TensorSpec.from_tensor(a, "a"), TensorSpec.from_tensor(b, "b"), TensorSpec.from_tensor(out, "out")
    method = cublas_methods.method_for("matmul_reduce_scatter", a.shape[0], method, h.multi_node, h.world_size)
    if method != "kernel":
        m, _, n = check_shapes(*specs, str(h.device), h.world_size)
        if m and n:
            cublas_methods.multiply_then_scatter(a, b, h, out, method, check)
        return out
    sms = sm_share(h.device)  # the grid barrier needs every CTA of every rank resident
    p = plan(*specs, str(h.device), h.world_size, sms, config)
    if p.m == 0 or p.n == 0:
        return out
    c = p.config
    if h.multi_node:
        nbytes = p.m * p.n * a.element_size()
        partials = h.workspace("matmul_reduce_scatter/partials", nbytes)[:nbytes].view(a.dtype)
        launch_with_status(
            "matmul_reduce_scatter", h, p.ctas,
            lambda status: matmul_reducescatter_hierarchical_kernel[(p.ctas,)](
                h.ctx, a, b, out, partials, p.m, p.n, p.k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                out.stride(0), out.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                GROUP_M=c.group_m, WORLD=h.world_size, COPY_COLS=COPY_COLS, num_warps=c.warps,
                num_stages=c.stages),
            check, function="symm_grid_barrier/symm_reduce_scatter_hierarchical")
        return out
    dst = out if out.is_contiguous() else torch.empty(out.shape, device=out.device, dtype=out.dtype)
    rows = p.m // h.world_size  # a rank's block
    if tuning.matmul_reduce_scatter_takes_copy_engine(rows):  # 2 words a chunk and rank
        config, flags = copy_engine.prepare(h, "matmul_reduce_scatter", rows, p.config, 2, check)
        p = p._replace(config=config)
        launch_with_status("matmul_reduce_scatter", h, p.ctas,
                           lambda status: launch_copy_engine(h, p, a, b, dst, flags, status), check,
                           function="symm_signal_wait_at")
    else:
        launch_with_status("matmul_reduce_scatter", h, p.ctas, lambda status: launch(h, p, a, b, dst, status), check,
                           function="symm_tile_signal/symm_tile_wait_others")
    if dst is not out:
        out.copy_(dst)
    return out


def launch_copy_engine(heap: Any, p: Plan, a: Any, b: Any, out: Any, flags: Any, status: Any) -> None:
    """Launches plan `p` as `matmul_reducescatter_copy_engine_kernel` into the contiguous `out`
    with the partials' transfers on a side stream (no checks: `matmul_reduce_scatter` made them):
    after the kernel's go (`copy_engine.launch`), for each other block in the kernel's order and
    each chunk of it, the stream waits until the kernel has counted all the chunk's tiles,
    zeroes the count, copies the chunk from `sends` into its slot at the block's rank and sets
    that rank's ready flag of it."""
    c = p.config
    world, r, rows = heap.world_size, heap.rank, p.m // heap.world_size
    layout = layout_for(a, b)
    a_arg, b_arg = operand_descriptors(a, b, layout, c.block_m, c.block_n, c.block_k)
    nbytes = p.m * p.n * out.element_size()
    sends = heap.workspace("matmul_reduce_scatter/sends", nbytes)[:nbytes].view(out.dtype).view(p.m, p.n)
    slot_bytes = (world - 1) * rows * p.n * out.element_size()
    slots = heap.workspace("matmul_reduce_scatter/slots", slot_bytes)[:slot_bytes].view(out.dtype)
    slots = slots.view(world - 1, rows, p.n)
    chunks = copy_engine.chunks(rows, c)
    tiles_n = -(-p.n // c.block_n)
    counts = copy_engine.flag_data(world)
    ready = counts + world * len(chunks)

    def kernel() -> None:
        matmul_reducescatter_copy_engine_kernel[(p.ctas,)](
            heap.ctx, flags, a_arg, b_arg, out, sends, slots, p.m, p.n, p.k, a.stride(0), a.stride(1), b.stride(0),
            b.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
            WORLD=world, TMA=layout.tma, B_ROW_MAJOR=layout.b_row_major, num_warps=c.warps, num_stages=c.stages)

    def transfers(side: Any) -> None:
        for i in range(1, world):
            d = (r + i) % world  # the kernel's order of blocks
            theirs = heap.peer_tensor(slots, d)[(r - d - 1) % world]  # language.slots.slot_of(r, d)
            their_ready = heap.peer_tensor(flags, d)[ready + r * len(chunks):]
            for j, (lo, hi) in enumerate(chunks):
                count = flags[counts + d * len(chunks) + j]
                streams.wait_flag(side, count, -(-(hi - lo) // c.block_m) * tiles_n)  # the chunk's tiles
                streams.write_flag(side, count, 0)
                theirs[lo:hi].copy_(sends[d * rows + lo:d * rows + hi])
                streams.write_flag(side, their_ready[j], 1)

    copy_engine.launch(heap, flags, kernel, transfers)


def launch(heap: Any, p: Plan, a: Any, b: Any, out: Any, status: Any, communicate: bool = True) -> None:
    """Launches plan `p`'s one-node kernel into the contiguous `out` (no checks:
    `matmul_reduce_scatter` made them); `communicate=False` (the probes): the GEMM alone."""
    c = p.config
    world, rows = heap.world_size, p.m // heap.world_size
    layout = layout_for(a, b)
    a_arg, b_arg = operand_descriptors(a, b, layout, c.block_m, c.block_n, c.block_k)
    ws = heap.workspace("matmul_reduce_scatter", p.workspace_bytes).view(out.dtype)
    epochs = epoch_counters(heap, "matmul_reduce_scatter")
    # TMA pushes need one peer (a descriptor per destination) and 16-byte aligned rows.
    tma_push = layout.tma and world == 2 and (p.n * out.element_size()) % 16 == 0
    peer_slots = ws
    if tma_push:
        block = [1, c.block_m, c.block_n // 2]
        peer_slots = peer_descriptor(heap, ws[:2 * rows * p.n].view(2, rows, p.n), block)
    matmul_reducescatter_kernel[(p.ctas,)](
        heap.ctx, a_arg, b_arg, out, ws, peer_slots, epochs, p.m, p.n, p.k, a.stride(0),
        a.stride(1), b.stride(0), b.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
        GROUP_M=c.group_m, WORLD=world, TMA=layout.tma, B_ROW_MAJOR=layout.b_row_major, TMA_PUSH=tma_push,
        SIGNAL_EVERY=tuning.MATMUL_SIGNAL_EVERY if world == 2 else 1, COMMUNICATE=communicate, num_warps=c.warps,
        num_stages=c.stages)


__all__ = ["COPY_COLS", "check_shapes", "launch", "launch_copy_engine", "matmul_reduce_scatter",
           "matmul_reducescatter_copy_engine_kernel", "matmul_reducescatter_hierarchical_kernel",
           "matmul_reducescatter_kernel", "plan"]
