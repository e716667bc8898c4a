"""How far apart the ranks' first calls of each op launch when their kernels compile, and whether
that alone makes a call time out at the heap's default timeout: a probe, not a benchmark.

    TRITON_CACHE_DIR=$(mktemp -d) torchrun --nproc_per_node=8 bench/probes/first_call_skew.py \
        --out skew.json                                     # cold: the ranks share an empty cache

A first call compiles its kernels (Triton; seconds each at world 8) and then launches them; the
ranks compile side by side and finish at different times, and the first to launch waits on the
device for the others, up to the heap's timeout. Here every rank leaves one barrier, makes the
first call of an op, and notes when that call returned (its last kernel launched) on the host's
clock (one machine: the ranks' clocks agree). Per op: each rank's seconds from the barrier, the
spread between the first and the last rank, and what `heap.check()` raised after it (a TIMEOUT is
the skew, not a bug in the op: every rank made the same call). Run it twice on the same cache:
the second run is the warm case (each kernel loaded, not compiled).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

import ironlink
from ironlink.runtime.heap import DEFAULT_TIMEOUT_S
from ironlink.tune.timing import git_rev

HIDDEN = 8192


def calls(heap: Any, world: int) -> list[tuple[str, Callable[[], Any]]]:
    """Each op's first call, at a decode or small prefill shape, in the order a model warms them."""
    bf16 = torch.bfloat16
    x_small = heap.zeros((8, HIDDEN), bf16)
    x_large = heap.zeros((1 << 22,), bf16)
    res = torch.zeros((8, HIDDEN), dtype=bf16, device="cuda")
    w = torch.ones(HIDDEN, dtype=bf16, device="cuda")
    a = torch.randn(128, 4096, dtype=bf16, device="cuda") / 64
    b = torch.randn(4096, 4096, dtype=bf16, device="cuda") / 64
    shard = torch.randn(128, 4096, dtype=bf16, device="cuda") / 64
    rows = torch.randn(128 * world, 4096, dtype=bf16, device="cuda") / 64
    moe = ironlink.MoeExchange(heap, 128, 7168, 8, 64)
    tokens = torch.randn(128, 7168, dtype=bf16, device="cuda")
    idx = torch.stack([torch.randperm(64, device="cuda")[:8] for _ in range(128)])
    weights = torch.full((128, 8), 1 / 8, device="cuda")

    def moe_round_trip() -> Any:
        recv, _, _, handle = moe.dispatch(tokens, idx, weights)
        return moe.combine(recv, handle)

    return [
        ("all_reduce 16 KiB (lamport)", lambda: ironlink.all_reduce(x_small[:1], heap=heap)),
        ("all_reduce 8 MiB (library)", lambda: ironlink.all_reduce(x_large, heap=heap)),
        ("all_reduce_rmsnorm 8 tokens", lambda: ironlink.all_reduce_rmsnorm(x_small, res, w, heap=heap)),
        ("matmul_all_reduce M=128", lambda: ironlink.matmul_all_reduce(a, b, heap=heap)),
        ("all_gather_matmul M=128/rank", lambda: ironlink.all_gather_matmul(shard, b, heap)),
        ("matmul_reduce_scatter M=128/rank", lambda: ironlink.matmul_reduce_scatter(rows, b, heap)),
        ("MoeExchange dispatch + combine, 128 tokens", moe_round_trip),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="JSON of every op's per-rank seconds (rank 0 writes)")
    args = p.parse_args()
    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    heap = ironlink.SymmetricHeap(1 << 30)  # the default timeout: what a user's first calls meet
    rows = []
    for name, call in calls(heap, world):
        heap.barrier()
        t0 = time.time()
        call()
        returned = time.time() - t0
        torch.cuda.synchronize()
        done = time.time() - t0
        try:
            heap.check()
            error = ""
        except ironlink.IronlinkError as e:
            error = str(e).split(":")[0] + ": " + ("TIMEOUT" if "TIMEOUT" in str(e) else str(e)[:120])
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, (returned, done, error))
        if rank == 0:
            launched = [g[0] for g in gathered]
            row = {"op": name, "launched_s": launched, "done_s": [g[1] for g in gathered],
                   "spread_s": max(launched) - min(launched), "errors": sorted({g[2] for g in gathered if g[2]})}
            rows.append(row)
            print(f"{name:44s} launched {min(launched):6.2f}-{max(launched):6.2f} s  spread {row['spread_s']:5.2f} s"
                  f"  done {max(row['done_s']):6.2f} s  {'; '.join(row['errors']) or 'ok'}", flush=True)
    if rank == 0 and args.out:
        args.out.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(), "gpus": torch.cuda.device_count(), "world": world,
            "timeout_s": DEFAULT_TIMEOUT_S, "git": git_rev(), "rows": rows}, indent=1))
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
