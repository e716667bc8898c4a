"""`make demo` on a machine with GPUs: one Triton kernel computes a tensor and all-reduces it.

    torchrun --standalone --nproc_per_node=4 examples/all_reduce.py

Every rank fills a bf16 tensor in symmetric memory with its rank + 1; a Triton kernel doubles
it with all its CTAs, meets at ironlink's grid barrier, and then calls ironlink's all-reduce
inline, in the same kernel. Rank 0 says what it computes
and which algorithm the library picks; every rank checks its result and that all ranks hold the
same bits.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import ironlink
import ironlink.language as il
import ironlink.typed as ilt
from ironlink.constants import DTYPE_BFLOAT16, REDUCE_OP_SUM

N = 1 << 20  # elements: 2 MiB of bf16
CTAS, WARPS = 8, 8


@ironlink.jit
@triton.jit
def scale_then_all_reduce(ctx, x_ptr, n, scale, status_ptr, BLOCK: tl.constexpr):
    # Each CTA scales its share of x. The all-reduce splits x among the CTAs its own way, so every
    # CTA must see what all the others wrote first: the grid barrier (this rank's CTAs only; the
    # all-reduce synchronizes the ranks).
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(x_ptr + offs, (x.to(tl.float32) * scale).to(tl.bfloat16), mask=offs < n)
    s = il.symm_grid_barrier(ctx)
    s = ilt.failure_or(s, il.symm_all_reduce(ctx, x_ptr, 0, n, REDUCE_OP_SUM, DTYPE_BFLOAT16))
    tl.store(status_ptr + tl.program_id(0), s)


def main() -> None:
    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    with ironlink.SymmetricHeap(64 << 20) as heap:
        x = heap.empty((N,), torch.bfloat16)
        x.fill_(rank + 1)
        want = float(sum(2 * (r + 1) for r in range(world)))
        if rank == 0:
            algorithm = heap.all_reduce_algorithm(N * 2, CTAS)
            print(f"ironlink demo: {world} GPUs, one process each, a symmetric heap of 64 MiB per GPU.\n"
                  f"  input:     rank r fills x ({N:,} bf16 elements, {N * 2 >> 20} MiB) with r + 1\n"
                  f"  kernel:    doubles x, grid barrier, then il.symm_all_reduce(SUM) inline ({CTAS} CTAs x {WARPS} warps)\n"
                  f"  expected:  every element of x on every rank = 2 x (1 + ... + {world}) = {want:g}\n"
                  f"  algorithm: {algorithm} (chosen on the device from the message size, the grid and "
                  f"the heap's limits {heap.algorithm_limits[:2]})", flush=True)
        status = torch.zeros(CTAS, dtype=torch.int32, device="cuda")
        scale_then_all_reduce[(CTAS,)](heap.ctx, x, N, 2.0, status, BLOCK=1024, num_warps=WARPS)
        torch.cuda.synchronize()
        heap.check()
        # The same bits on every rank: compare a checksum of the raw bf16 words.
        checksum = x.view(torch.int16).to(torch.int64).sum().reshape(1)
        sums = [torch.zeros_like(checksum) for _ in range(world)]
        dist.all_gather(sums, checksum)
        ok = bool((status == 0).all()) and bool((x.float() == want).all())
        same = all(bool((s == sums[0]).all()) for s in sums)
        print(f"rank {rank}: status {status.tolist()}, x[0] = {x[0].item():g}, x[-1] = {x[-1].item():g}: "
              f"{'OK' if ok else 'MISMATCH'}", flush=True)
        heap.barrier()
        if rank == 0:
            print(f"result: {'OK' if ok and same else 'FAILED'}: "
                  f"{'every rank holds the same bits' if same else 'ranks differ'}", flush=True)
    dist.destroy_process_group()
    if not (ok and same):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
