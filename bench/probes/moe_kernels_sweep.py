"""Launch-config sweep of MoeExchange's local kernels (ironlink.moe.relay_kernels) on one GPU: the
expert-layout copy (gather_rows) and the weighted per-rank reduction (weighted_partial_sums) at the
benchmark's largest shapes, for chunk sizes, warps and grid sizes. Prints GB/s of HBM traffic per
config; the chosen one goes to the defaults of MoeConfig's row_block / row_warps / programs_per_sm
(runtime/tuning/moe.py) by hand, with the result recorded under bench/results/experiments/.

    torchrun --nproc_per_node=1 bench/probes/moe_kernels_sweep.py [--rows 32768] [--hidden 7168] [--topk 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ironlink.moe import relay_kernels as k

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness ironlink_bench, run from anywhere
from ironlink_bench import time_graph  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32768, help="expert rows (tokens x top-k at 4096 tokens, top-8)")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    args = ap.parse_args()
    dist.init_process_group("nccl")  # ironlink_bench's timers take the max over ranks
    torch.cuda.set_device(0)
    rows, h, topk = args.rows, args.hidden, args.topk
    tokens = rows // 2  # received tokens: about two local choices each
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    src = torch.randn(tokens, h + 32, device="cuda").to(torch.bfloat16)
    index = torch.randint(0, tokens, (rows,), device="cuda")
    out = torch.empty(rows, h, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(rows, h, device="cuda").to(torch.bfloat16)
    slot = torch.full((tokens, topk), -1, device="cuda", dtype=torch.int64)
    slot[:, :2] = torch.randperm(rows, device="cuda")[: 2 * tokens].view(tokens, 2)
    weight = torch.rand(tokens, topk, device="cuda")
    back = torch.empty(tokens, h, device="cuda", dtype=torch.bfloat16)
    count_rows = torch.tensor([rows], device="cuda")
    count_tokens = torch.tensor([tokens], device="cuda")
    gather_bytes = 2 * rows * h * 2
    partial_bytes = (rows + tokens) * h * 2
    print(f"GPU {torch.cuda.get_device_name()}, {rows} expert rows, {tokens} tokens, hidden {h}")
    for block in (1024, 2048, 4096):
        for warps in (4, 8, 16):
            if block // (32 * warps) < 8:  # fewer than 8 bf16 (16 bytes) per thread
                continue
            for per_sm in (2, 4, 8):
                grid = (per_sm * sms,)
                g = time_graph(lambda: k.gather_rows[grid](src, h + 32, index, count_rows, rows, out, h, 0, out, 0,
                                                           BLOCK=block, SIDE_BLOCK=0, num_warps=warps), gather_bytes)
                p = time_graph(lambda: k.weighted_partial_sums[grid](y, slot, weight, count_tokens, back, h, K=topk,
                                                                     BLOCK=block, num_warps=warps), partial_bytes)
                print(f"BLOCK {block:5d} warps {warps:2d} programs {grid[0]:5d}: gather_rows {g:8.1f} us "
                      f"{gather_bytes / g / 1e3:7.0f} GB/s  weighted_partial_sums {p:8.1f} us "
                      f"{partial_bytes / p / 1e3:7.0f} GB/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
