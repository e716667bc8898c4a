"""Matmul + reduce-scatter in one kernel: the row-parallel linear of sequence parallelism.

    out = ironlink.matmul_reduce_scatter(a, b)   # a [M, K], b [K, N] -> out [M / world, N]

Rank d's `out` gets rows d * M / world .. of sum_over_ranks(a_r @ b_r): PyTorch's
`fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0)`. One persistent launch:
- GEMM: each CTA computes output tiles, the destination ranks' row blocks in the order rank + 1,
  rank + 2, ..., its own last (every destination gets its copies early), and stores each tile,
  rounded to the output dtype, straight into its slot in the destination's workspace (stores to a
  peer are posted) and signals the destination (tile index = the tile's index in its block).
- Reduction: then every CTA takes its share of this rank's tiles: waits for every rank's copy,
  sums them (fp32, rank order) into `out`, and signals each source that the slot is free (tile
  index + tiles per block).
- Before the launch ends, each CTA waits until the destinations freed the slots it wrote, so the
  next launch cannot overwrite a slot still being read.
Every rank signals and waits equally often per launch: back-to-back launches and CUDA-graph
replays need no reset. The launch is persistent (at most one CTA per SM): its waits need every
CTA resident.

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
from ..runtime import tuning
from ..language import typed as ilt
from ..runtime.distributed import sm_share
from ..language.jit import jit
from ..ops import TensorSpec, launch_with_status
from ..runtime.registry import heap_for
from . import sp_streams
from .gemm import (check_operands, check_output, copy_rows, gemm_range, layout_for, operand_descriptors, product_tile,
                   tile_coords)

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
    tiles = triton.cdiv(m // world, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    if 2 * tiles > _abi.MAX_TILES:
        raise ValueError(f"{op}: {tiles} tiles of {cfg.block_m}x{cfg.block_n} per rank: at most "
                         f"{_abi.MAX_TILES // 2} (a larger tile shape, or split the matmul)")
    ws = tiles * world * cfg.block_m * cfg.block_n * a.itemsize
    return Plan(m, n, k, cfg, tiles, max(1, min(world * tiles, sms)), ws)


@jit(do_not_specialize=["ctx"])
def matmul_reducescatter_kernel(ctx, a, b, out, ws, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, status,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                GROUP_M: tl.constexpr, WORLD: tl.constexpr, SLOTS: tl.constexpr,
                                ROWS: tl.constexpr, TMA: tl.constexpr = False, B_ROW_MAJOR: tl.constexpr = False):
    """out [M / WORLD, N] = this rank's rows of the reduce-scatter of a @ b (see the module docs).
    ws: the workspace (heap), tiles per block x WORLD slots of BLOCK_M x BLOCK_N elements.
    SLOTS: WORLD rounded up to a power of two; ROWS: rows of a tile summed per step (`reduce_rows`).
    TMA (Hopper): a and b are TMA descriptors (`gemm.operand_descriptors`; a tile past its block's
    rows reads the next block's, which its slot carries but the sum leaves out)."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    rank = il.symm_rank(ctx)
    rows = M // WORLD
    tiles_m, tiles_n = tl.cdiv(rows, BLOCK_M), tl.cdiv(N, BLOCK_N)
    tiles = tiles_m * tiles_n
    SLOT: tl.constexpr = BLOCK_M * BLOCK_N
    ri, rc = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N)
    worst = pid * 0
    for o in range(pid, WORLD * tiles, grid):
        dest = (rank + 1 + o // tiles) % WORLD
        t = o % tiles
        tm, tn = tile_coords(t, tiles_m, tiles_n, GROUP_M)
        row0 = dest * rows + tm * BLOCK_M
        acc = gemm_range(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), a, b, row0, (dest + 1) * rows,
                         tn * BLOCK_N, N, 0, K, K, stride_am, stride_ak, stride_bk, stride_bn, TMA, B_ROW_MAJOR,
                         BLOCK_M, BLOCK_N, BLOCK_K)
        slot = ilt.peer_pointer(ctx, ws, dest) + (tl.cast(t, tl.int64) * WORLD + rank) * SLOT
        tl.store(slot + ri[:, None] * BLOCK_N + rc[None, :], acc.to(ws.dtype.element_ty))
        s = il.symm_tile_signal(ctx, t, dest)
        worst = ilt.failure_or(s, worst)
    ranks, rr = tl.arange(0, SLOTS), tl.arange(0, ROWS)
    for t in range(pid, tiles, grid):
        if worst == 0:
            s = il.symm_tile_wait(ctx, t, rank)
            s = ilt.failure_or(s, il.symm_tile_wait_others(ctx, t))
            worst = ilt.failure_or(s, worst)
        if worst == 0:
            tm, tn = tile_coords(t, tiles_m, tiles_n, GROUP_M)
            rn = tn * BLOCK_N + rc
            for r0 in range(0, BLOCK_M, ROWS):
                copies = ws + (tl.cast(t, tl.int64) * WORLD + ranks[:, None, None]) * SLOT \
                    + ((r0 + rr)[:, None] * BLOCK_N + rc[None, :])[None, :, :]
                total = tl.sum(tl.load(copies, mask=ranks[:, None, None] < WORLD, other=0.0).to(tl.float32), axis=0)
                rm = tm * BLOCK_M + r0 + rr
                tl.store(out + rm[:, None].to(tl.int64) * N + rn[None, :], total.to(out.dtype.element_ty),
                         mask=(rm[:, None] < rows) & (rn[None, :] < N))
            s = il.symm_tile_signal_others(ctx, tiles + t)
            worst = ilt.failure_or(s, worst)
    for o in range(pid, WORLD * tiles, grid):
        dest = (rank + 1 + o // tiles) % WORLD
        if (dest != rank) & (worst == 0):
            s = il.symm_tile_wait(ctx, tiles + o % tiles, dest)
            worst = ilt.failure_or(s, worst)
    tl.store(status + pid, worst)


# A heap of several nodes (see the module docs); linked with the NVSHMEM bitcode.
@jit(do_not_specialize=["ctx"], nvshmem=True)
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
    worst = ilt.failure_or(worst, ilt.reduce_scatter_hierarchical(ctx, ws, mine, rows * N))
    worst = ilt.failure_or(worst, il.symm_grid_barrier(ctx))
    if worst == 0:
        copy_rows(mine, N, 1, out, stride_om, stride_on, rows, N, COPY_COLS)
    tl.store(status + pid, worst)


def reduce_rows(config: tuning.MatmulConfig, world: int) -> int:
    """Rows of a tile the reduction sums per step: every rank's copy of them, 8192 elements in
    all, are in registers at once (a whole 128 x 256 tile from 4 ranks needed 256 KiB of shared
    memory for the sum)."""
    return max(1, min(config.block_m, 8192 // (triton.next_power_of_2(world) * config.block_n)))


def matmul_reduce_scatter(a: Any, b: Any, heap: Any, out: Any = None, config: Optional[tuning.MatmulConfig] = None,
                          check: bool = False, method: Optional[str] = None) -> Any:
    """`out` [M / world, N]: this rank's rows of sum over ranks of `a` [M, K] @ `b` [K, N] (bf16 or
    fp16, any strides). `out` may be any CUDA tensor (default: a new one, contiguous). Uses
    workspaces of about M x N elements from `heap`, kept between calls (`heap.workspace`).
    `method`: "kernel" (this module's one-kernel Triton version; `config` its tiles), "collective"
    or "overlap" (cuBLAS GEMMs and ironlink transfers, `fused.sp_streams`); default
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
    method = sp_streams.method_for("matmul_reduce_scatter", a.shape[0], method, h.multi_node)
    if method != "kernel":
        m, _, n = check_shapes(*specs, str(h.device), h.world_size)
        if m and n:
            sp_streams.matmul_reduce_scatter(a, b, h, out, method, check)
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
    ws = h.workspace("matmul_reduce_scatter", p.workspace_bytes).view(a.dtype)
    layout = layout_for(a, b)
    a_arg, b_arg = operand_descriptors(a, b, layout, c.block_m, c.block_n, c.block_k)
    kernel = matmul_reducescatter_kernel[(p.ctas,)]
    launch_with_status(
        "matmul_reduce_scatter", h, p.ctas,
        lambda status: kernel(h.ctx, a_arg, b_arg, out, ws, p.m, p.n, p.k, a.stride(0), a.stride(1), b.stride(0),
                              b.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                              GROUP_M=c.group_m, WORLD=h.world_size, SLOTS=triton.next_power_of_2(h.world_size),
                              ROWS=reduce_rows(c, h.world_size), TMA=layout.tma, B_ROW_MAJOR=layout.b_row_major,
                              num_warps=c.warps, num_stages=c.stages),
        check, function="symm_tile_wait")
    return out


__all__ = ["COPY_COLS", "check_shapes", "matmul_reduce_scatter", "matmul_reducescatter_hierarchical_kernel",
           "matmul_reducescatter_kernel", "plan", "reduce_rows"]
