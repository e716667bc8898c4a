"""`make demo` on a machine with GPUs: a Triton kernel all-reduces a bf16 tensor in symmetric memory.

    torchrun --standalone --nproc_per_node=8 examples/all_reduce.py
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import ironlink
import ironlink.language as il
from ironlink.constants import DTYPE_BFLOAT16, REDUCE_OP_SUM


@ironlink.jit
@triton.jit
def scale_then_all_reduce(ctx, x_ptr, n, scale, status_ptr, BLOCK: tl.constexpr):
    # The data a CTA hands to a collective must be complete as seen by the CTA that reduces each
    # slice; ironlink has no grid-wide barrier yet, so a fused producer runs in one CTA here (or
    # produce in an earlier kernel and launch the collective with a wide grid).
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(x_ptr + offs, (x.to(tl.float32) * scale).to(tl.bfloat16), mask=offs < n)
    tl.store(status_ptr + tl.program_id(0), il.symm_all_reduce(ctx, x_ptr, 0, n, REDUCE_OP_SUM, DTYPE_BFLOAT16))


def main() -> None:
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    n = 1 << 20
    with ironlink.SymmetricHeap(64 << 20) as heap:
        x = heap.empty((n,), torch.bfloat16)
        x.fill_(rank + 1)
        status = torch.zeros(8, dtype=torch.int32, device="cuda")
        scale_then_all_reduce[(1,)](heap.ctx, x, n, 2.0, status, BLOCK=1024, num_warps=8)
        torch.cuda.synchronize()
        heap.check()
        want = float(world * (world + 1))  # sum over ranks of 2 * (rank + 1)
        ok = bool((status[:1] == 0).all()) and bool((x.float() == want).all())
        print(f"rank {rank}/{world}: x[0] = {x[0].item()}, want {want}: {'OK' if ok else 'MISMATCH'}", flush=True)
        heap.barrier()
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
