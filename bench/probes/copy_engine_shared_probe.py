"""How long does matmul_reduce_scatter with the copy engine asked for take where ranks share one
GPU (CUDA MPS)? There its side stream's flag waits stalled at full shares (docs/gpu-testing.md); a stalled
call must end in a TIMEOUT the host raises, within about one wait timeout a launch, not one a
chunk. Every rank prints per shape: ok or the error, and the seconds it took.

    IRONLINK_SHARED_GPU=1 torchrun --nproc_per_node=2 bench/probes/copy_engine_shared_probe.py
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import ironlink
from ironlink.runtime import tuning


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="2048x2050x512,16400x2050x512", help="M x N x K, comma-separated")
    ap.add_argument("--launches", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=20.0,
                    help="the heap's wait timeout (the ranks compile each shape's kernel seconds apart)")
    args = ap.parse_args()
    ironlink.init_distributed()
    rank = dist.get_rank()
    heap = ironlink.SymmetricHeap(1 << 30, timeout_s=args.timeout_s)
    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        dist.barrier()
        t = time.perf_counter()
        try:
            for _ in range(args.launches):
                ironlink.matmul_reduce_scatter(a, b, heap=heap, method="kernel",
                                               exchange=tuning.ScatterExchange(copy_engine_min_rows=0))
            torch.cuda.synchronize()
            heap.check()
            verdict = "ok"
        except Exception as e:  # a timeout the kernel recorded: named, the next shape goes on
            verdict = f"{type(e).__name__}: {str(e)[:200]}"
        print(f"[rank {rank}] {shape} x{args.launches}: {verdict} ({time.perf_counter() - t:.1f} s)", flush=True)
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
