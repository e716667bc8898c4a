"""Matmul + all-reduce in one kernel: the row-parallel linear of tensor parallelism.

    out = ironlink.matmul_all_reduce(a, b)      # a [M, K/world], b [K/world, N] -> out [M, N]

`out` (a heap tensor) gets sum_over_ranks(a_r @ b_r). A persistent kernel: each CTA computes output
tiles one after another, stores each into `out` and all-reduces it at once with
`symm_tile_all_reduce` (tile index = the output tile's index), so one tile's communication runs
while the other CTAs still compute theirs. Each tile is rounded to the output dtype before the
all-reduce, which sums in fp32 in rank order: results are bitwise identical on every rank.

Tiles per launch are at most `MAX_TILES`; the tile shape (`tuning.matmul_config`) grows for
larger outputs to stay within it.

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
from .gemm import check_operands, check_output, product_tile


class Plan(NamedTuple):
    m: int
    n: int
    k: int
    config: tuning.MatmulConfig
    ctas: int


def plan(a: TensorSpec, b: TensorSpec, out: TensorSpec, device: str, world: int, sms: int,
         config: Optional[tuning.MatmulConfig] = None) -> Plan:
    """Checks the operands (pure: testable without a GPU) and chooses the launch."""
    m, k, n, code = check_operands(a, b, device, "matmul_all_reduce")
    check_output(out, (m, n), code, device, "matmul_all_reduce")
    cfg = config or tuning.matmul_config(m, n, k, world)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    if tiles > _abi.MAX_TILES:
        raise ValueError(f"{tiles} output tiles of {cfg.block_m}x{cfg.block_n}: at most {_abi.MAX_TILES} "
                         "(a larger tile shape, or split the matmul)")
    return Plan(m, n, k, cfg, max(1, min(tiles, sms)))


@jit(do_not_specialize=["ctx"])
def matmul_allreduce_kernel(ctx, a, b, out, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, status,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, COMMUNICATE: tl.constexpr = True):
    """out [M, N] (heap, contiguous) = all-reduce of a @ b, tile by tile (see the module docs).
    COMMUNICATE=False leaves out the all-reduce: the GEMM alone, for the benchmark."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    worst = pid * 0
    for t in range(pid, tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), grid):
        m0, n0 = product_tile(a, b, out, t, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        if COMMUNICATE:
            s = ilt.tile_all_reduce(ctx, out + m0.to(tl.int64) * N + n0, tl.minimum(BLOCK_M, M - m0),
                                    tl.minimum(BLOCK_N, N - n0), N, t)
            worst = ilt.failure_or(s, worst)
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
                      config: Optional[tuning.MatmulConfig] = None, check: bool = False) -> Any:
    """`out` [M, N] = sum over ranks of `a` [M, K] @ `b` [K, N] (bf16/fp16). `out` must be a heap
    tensor; when None, one is allocated from `heap` (the caller frees it with heap.free).
    Collective; CUDA-graph capturable when `out` is given."""
    if heap is None and out is None:
        raise ValueError("matmul_all_reduce needs heap= (or out=, a tensor of the symmetric heap)")
    h = heap_for(out if out is not None else a, "out", heap, "matmul_all_reduce")
    if out is None:
        out = h.empty((a.shape[0], b.shape[-1]), a.dtype)
    specs = TensorSpec.from_tensor(a, "a"), TensorSpec.from_tensor(b, "b"), TensorSpec.from_tensor(out, "out")
    sms = sm_share(h.device)  # the grid barrier needs every CTA of every rank resident
    p = plan(*specs, str(h.device), h.world_size, sms, config)
    if p.m == 0 or p.n == 0:
        return out
    in_heap(h, "matmul_all_reduce", (out, "out"))
    c = p.config
    kernel, function = ((matmul_allreduce_hierarchical_kernel, "symm_grid_barrier/symm_all_reduce_hierarchical")
                        if h.multi_node else (matmul_allreduce_kernel, "symm_tile_all_reduce"))
    launch_with_status(
        "matmul_all_reduce", h, p.ctas,
        lambda status: kernel[(p.ctas,)](h.ctx, a, b, out, p.m, p.n, p.k, a.stride(0), a.stride(1), b.stride(0),
                                         b.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
                                         BLOCK_K=c.block_k, GROUP_M=c.group_m, num_warps=c.warps,
                                         num_stages=c.stages),
        check, function=function)
    return out


__all__ = ["matmul_all_reduce", "matmul_allreduce_hierarchical_kernel", "matmul_allreduce_kernel", "plan"]
