"""All-gather + matmul in one kernel: the column-parallel linear of sequence parallelism.

    a_full, out = ironlink.all_gather_matmul(a_shard, b)   # a_shard [M / world, K], b [K, N]
                                                           # -> a_full [M, K], out [M, N]

a_full is every rank's shard stacked in rank order, out = a_full @ b: PyTorch's
`fused_all_gather_matmul(a_shard, [b], gather_dim=0)`. One persistent launch:
- Push: each CTA that copies a row block first meets the same CTA of every other rank (a signal
  and a wait each way: a rank may write a_full until its launch starts), then copies row blocks of
  this rank's shard into every rank's `a_full` (stores to a peer are posted) and signals the other
  ranks once per CTA that will read the block there.
- GEMM: each CTA computes output tiles, this rank's own rows first (read from `a_shard`, nothing
  to wait for), then rank + 1's, and so on, each row block's column tiles one after another.
  Before a CTA's first tile of another rank's row block it waits for that block's signal; after
  its last, it acknowledges to the source.
- Before the launch ends, each CTA waits until every reader of the blocks it pushed has
  acknowledged, so the next launch cannot overwrite rows still being read.
So the GEMM of the first ranks' rows overlaps the copies of the later ones. Every rank signals and
waits equally often per launch: back-to-back launches and CUDA-graph replays need no reset. The
launch is persistent (at most one CTA per SM): its waits need every CTA resident.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import triton
import triton.language as tl

from .. import _abi
from .. import language as il
from .. import tuning
from .. import typed as ilt
from ..jit import jit
from ..ops import TensorSpec, heap_for, in_heap, launch_with_status
from .gemm import check_operands, check_output, gemm_tile

COPY_K = 64  # columns of a row block copied per step of the push


class Plan(NamedTuple):
    rows: int  # per rank
    n: int
    k: int
    config: tuning.MatmulConfig
    ctas: int


def plan(a_shard: TensorSpec, b: TensorSpec, a_full: TensorSpec, out: TensorSpec, device: str, world: int,
         sms: int, config: Optional[tuning.MatmulConfig] = None) -> Plan:
    """Checks the operands (pure: testable without a GPU) and chooses the launch."""
    op = "all_gather_matmul"
    rows, k, n, code = check_operands(a_shard, b, device, op)
    check_output(a_full, (world * rows, k), code, device, op)
    check_output(out, (world * rows, n), code, device, op)
    cfg = config or tuning.matmul_config(world * rows, n, k, world)
    blocks = triton.cdiv(rows, cfg.block_m)
    if 3 * blocks > _abi.MAX_TILES:  # tile indices: pushes, acknowledgements, arrivals
        raise ValueError(f"{op}: {blocks} row blocks of {cfg.block_m} per rank: at most {_abi.MAX_TILES // 3}")
    tiles = world * blocks * triton.cdiv(n, cfg.block_n)
    return Plan(rows, n, k, cfg, max(1, min(tiles, sms)))


@jit(do_not_specialize=["ctx"])
def allgather_matmul_kernel(ctx, a_shard, a_full, b, out, ROWS, N, K, stride_sm, stride_sk, stride_bk, stride_bn,
                            status, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            COPY_K: tl.constexpr, WORLD: tl.constexpr):
    """a_full [WORLD * ROWS, K] (heap, contiguous) <- every rank's a_shard [ROWS, K]; out = a_full @ b
    (see the module docs)."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    rank = il.symm_rank(ctx)
    blocks, tiles_n = tl.cdiv(ROWS, BLOCK_M), tl.cdiv(N, BLOCK_N)
    readers = tl.minimum(tiles_n, grid)  # CTAs reading a block: its tiles are consecutive in the walk
    ri, rk = tl.arange(0, BLOCK_M), tl.arange(0, COPY_K)
    worst = pid * 0
    mine = a_full + tl.cast(rank, tl.int64) * ROWS * K
    if pid < blocks:  # meet the other ranks' pushing CTA pid before writing into their a_full
        s = il.symm_tile_signal_others(ctx, 2 * blocks + pid)
        worst = tl.where(s != 0, s, il.symm_tile_wait_others(ctx, 2 * blocks + pid))
    for j in range(pid, blocks, grid):
        rm = j * BLOCK_M + ri
        for k0 in range(0, K, COPY_K):
            ka = k0 + rk
            mask = (rm[:, None] < ROWS) & (ka[None, :] < K)
            x = tl.load(a_shard + rm[:, None].to(tl.int64) * stride_sm + ka[None, :] * stride_sk, mask=mask)
            for p in tl.static_range(WORLD):
                tl.store(ilt.peer_pointer(ctx, mine, p) + rm[:, None].to(tl.int64) * K + ka[None, :], x, mask=mask)
        for _ in range(readers):
            s = il.symm_tile_signal_others(ctx, j)
            worst = tl.where(s != 0, s, worst)
    per_rank = blocks * tiles_n
    held = -1  # the other rank's row block (index in this CTA's walk) this CTA has waited for
    held_src, held_j = rank, 0
    for o in range(pid, WORLD * per_rank, grid):
        src = (rank + o // per_rank) % WORLD
        j = o % per_rank // tiles_n
        tn = o % tiles_n
        if o // tiles_n != held:
            if held_src != rank:
                s = il.symm_tile_signal(ctx, blocks + held_j, held_src)  # done reading that block
                worst = tl.where(s != 0, s, worst)
            if (src != rank) & (worst == 0):
                s = il.symm_tile_wait(ctx, j, src)
                worst = tl.where(s != 0, s, worst)
            held, held_src, held_j = o // tiles_n, src, j
        if src == rank:
            acc = gemm_tile(a_shard, b, j * BLOCK_M, ROWS, tn * BLOCK_N, N, K, stride_sm, stride_sk, stride_bk,
                            stride_bn, BLOCK_M, BLOCK_N, BLOCK_K)
        else:
            acc = gemm_tile(a_full, b, src * ROWS + j * BLOCK_M, (src + 1) * ROWS, tn * BLOCK_N, N, K, K, 1,
                            stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K)
        rm = src * ROWS + j * BLOCK_M + ri
        rn = tn * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(out + rm[:, None].to(tl.int64) * N + rn[None, :], acc.to(out.dtype.element_ty),
                 mask=(rm[:, None] < (src + 1) * ROWS) & (rn[None, :] < N))
    if held_src != rank:
        s = il.symm_tile_signal(ctx, blocks + held_j, held_src)
        worst = tl.where(s != 0, s, worst)
    for j in range(pid, blocks, grid):
        for _ in range(readers):
            if worst == 0:
                s = il.symm_tile_wait_others(ctx, blocks + j)
                worst = tl.where(s != 0, s, worst)
    tl.store(status + pid, worst)


def all_gather_matmul(a_shard: Any, b: Any, heap: Any, a_full: Any = None, out: Any = None,
                      config: Optional[tuning.MatmulConfig] = None, check: bool = False) -> tuple[Any, Any]:
    """(a_full, out): `a_full` [M, K] = every rank's `a_shard` [M / world, K] in rank order, `out`
    [M, N] = a_full @ `b` [K, N] (bf16 or fp16; a_shard and b with any strides). `a_full` must be
    a heap tensor (default: allocated from `heap`, the caller frees it with heap.free); `out` any
    CUDA tensor (default: a new one). Collective; CUDA-graph capturable when a_full is given."""
    import torch

    if heap is None and a_full is None:
        raise ValueError("all_gather_matmul needs heap= (or a_full=, a tensor of the symmetric heap)")
    h = heap_for(a_full if a_full is not None else a_shard, "a_full", heap, "all_gather_matmul")
    rows, n = a_shard.shape[0], b.shape[-1]
    if a_full is None:
        a_full = h.empty((h.world_size * rows, a_shard.shape[-1]), a_shard.dtype)
    if out is None:
        out = torch.empty((h.world_size * rows, n), device=a_shard.device, dtype=a_shard.dtype)
    spec = TensorSpec.from_tensor
    sms = torch.cuda.get_device_properties(h.device).multi_processor_count
    p = plan(spec(a_shard, "a_shard"), spec(b, "b"), spec(a_full, "a_full"), spec(out, "out"), str(h.device),
             h.world_size, sms, config)
    if p.rows == 0 or p.n == 0:
        return a_full, out
    in_heap(h, "all_gather_matmul", (a_full, "a_full"))
    c = p.config
    kernel = allgather_matmul_kernel[(p.ctas,)]
    launch_with_status(
        "all_gather_matmul", h, p.ctas,
        lambda status: kernel(h.ctx, a_shard, a_full, b, out, p.rows, p.n, p.k, a_shard.stride(0), a_shard.stride(1),
                              b.stride(0), b.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
                              BLOCK_K=c.block_k, COPY_K=COPY_K, WORLD=h.world_size, num_warps=c.warps,
                              num_stages=c.stages),
        check, function="symm_tile_wait")
    return a_full, out


__all__ = ["COPY_K", "all_gather_matmul", "allgather_matmul_kernel", "plan"]
