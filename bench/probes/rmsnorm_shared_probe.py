"""Does all_reduce_rmsnorm finish where ranks share one GPU (CUDA MPS), alone and between torch
kernels? A probe for the e2e stall of 2026-11-29 (world 4, 32 tokens, hidden 1024, one H200:
symm_tile_wait TIMEOUT): each mode runs `--calls` times, then between a torch matmul and an SDPA
call as the model's layer does, with the heap's wait timeout at `--timeout-s`; every rank prints
per mode whether every call finished (heap.check) and how long the calls took.

    IRONLINK_SHARED_GPU=1 torchrun --nproc_per_node=4 bench/probes/rmsnorm_shared_probe.py
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ironlink
from ironlink.fused.all_reduce_rmsnorm import MODES, plan
from ironlink.runtime import tuning
from ironlink.runtime.distributed import sm_share
from ironlink.runtime.tensor_spec import TensorSpec


def run_mode(heap: ironlink.SymmetricHeap, mode: str, tokens: int, hidden: int, calls: int, between: bool) -> str:
    x = heap.empty((tokens, hidden), torch.bfloat16)
    res = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    w = torch.ones(hidden, dtype=torch.bfloat16, device="cuda")
    a = torch.randn(tokens, 2048, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(2048, hidden, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(tokens, 8, 128, 128, dtype=torch.bfloat16, device="cuda")
    spec = TensorSpec.from_tensor
    p = plan(spec(x, "x"), spec(res, "residual"), spec(w, "weight"), spec(x, "out"), str(x.device), heap.world_size,
             sm_share(x.device), mode, False, None, None, None)
    dist.barrier()
    t = time.perf_counter()
    try:
        for _ in range(calls):
            if between:
                x.copy_(a @ b)
                F.scaled_dot_product_attention(q, q, q)
            else:
                x.normal_()
            ironlink.all_reduce_rmsnorm(x, res, w, 1e-5, heap=heap, mode=mode)
        torch.cuda.synchronize()
        heap.check()
        verdict = "ok"
    except Exception as e:  # a timeout the kernels recorded: named, the next mode goes on
        verdict = f"{type(e).__name__}: {str(e)[:160]}"
    dt = time.perf_counter() - t
    heap.free(x)
    return f"{mode:9s} {'between torch ' if between else 'back to back  '} ctas {p.ctas:3d} warps {p.warps:2d}: " \
           f"{verdict} ({dt:.1f} s for {calls} calls)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=10.0)
    ap.add_argument("--modes", default=",".join(MODES))
    a = ap.parse_args()
    ironlink.init_distributed()
    heap = ironlink.SymmetricHeap(64 << 20, timeout_s=60.0)
    rank = dist.get_rank()
    if rank == 0:
        chosen = tuning.rmsnorm_mode(a.tokens, 2 * a.hidden, heap.world_size, sm_share(heap.device))
        print(f"world {heap.world_size}, {a.tokens} x {a.hidden} bf16, sm_share {sm_share(heap.device)}: "
              f"ironlink chooses {chosen}", flush=True)
    for mode in a.modes.split(","):
        for between in (False, True):
            heap.set_timeout(60.0)  # the first call compiles, the ranks seconds apart
            x0 = heap.zeros((a.tokens, a.hidden), torch.bfloat16)
            try:
                ironlink.all_reduce_rmsnorm(x0, torch.zeros(a.tokens, a.hidden, dtype=torch.bfloat16, device="cuda"),
                                            torch.ones(a.hidden, dtype=torch.bfloat16, device="cuda"), heap=heap,
                                            mode=mode)
            except ValueError as e:  # a mode that cannot run this shape: every rank says so alike
                print(f"[rank {rank}] {mode:9s} skipped: {e}", flush=True)
                break
            finally:
                torch.cuda.synchronize()
                heap.free(x0)
            heap.set_timeout(a.timeout_s)
            line = run_mode(heap, mode, a.tokens, a.hidden, a.calls, between)
            print(f"[rank {rank}] {line}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
