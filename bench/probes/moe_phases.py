"""Where MoeExchange's direct path spends its time, step by step: a probe, not a benchmark.

    torchrun --nproc_per_node=4 bench/probes/moe_phases.py --tokens 4096 --out moe-phases.json

For each token count and routing (bench/moe.py's: hidden 7168, top-8 of 64, uniform and skewed),
the layer up to and with each of its steps (stage; gather_meta; sort + pull_rows; reduce_push;
sum_partials) captured in CUDA graphs and replayed in turns (ironlink_bench.GraphRound), every
rank in step: each step's share by difference. An eager profile cannot attribute the layer's
time, since each exchange kernel starts with a barrier that waits for the other ranks' late
launches. Rows op "prefix:<step>", us; rank 0 prints each step's share. `--profile` also prints
rank 0's torch.profiler table of one eager layer's kernels (their GPU time, largest first).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

import ironlink

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: ironlink_bench and moe.py, run from anywhere
from ironlink_bench import GraphRound, record_row, write_results  # noqa: E402
from moe import routing  # noqa: E402  bench/moe.py: the benchmark's inputs

STEPS = ("stage", "gather_meta", "sort+pull_rows", "reduce_push", "sum_partials")


def prefix(moe: Any, x: Any, idx: Any, w: Any, y: Any, steps: int) -> Callable[[], None]:
    """The direct path's layer up to and with its first `steps` steps (STEPS), `y` the rows
    combine sends back."""
    d = moe.direct

    def run() -> None:
        moe._stage(x, idx, w)
        if steps > 1:
            d.gather(False)
        if steps > 2:
            lay = d.place(False)
            if steps > 3:
                d.push(y, lay, False)
            if steps > 4:
                d.sum(x.shape[0])
    return run


def profile(moe: Any, x: Any, idx: Any, w: Any, shape: dict[str, Any]) -> None:
    """Rank 0 prints the GPU time of each kernel of one eager layer (after a warm-up), largest first."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    def layer() -> None:
        recv_x, _, _, handle = moe.dispatch(x, idx, w)
        moe.combine(recv_x, handle)

    layer()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        layer()
        torch.cuda.synchronize()
    if dist.get_rank() == 0:
        print(f"profile {shape}:\n" + prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)


def steps_of(rows: list[dict[str, Any]], args: argparse.Namespace, tokens: int, skewed: bool) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    nbytes = ironlink.MoeExchange.heap_bytes(world, tokens, args.hidden, args.topk) + tokens * args.hidden * 2
    heap = ironlink.SymmetricHeap(nbytes + (1 << 20))
    try:
        x_plain, idx, w = routing(rank, tokens, args.hidden, args.topk, args.experts, skewed)
        x = heap.empty(tuple(x_plain.shape), x_plain.dtype).copy_(x_plain)  # pulled in place, as bench/moe.py's
        moe = ironlink.MoeExchange(heap, tokens, args.hidden, args.topk, args.experts)
        if moe.direct is None:
            raise SystemExit("moe_phases: this heap's MoeExchange does not take the direct path")
        recv_x, _, _, handle = moe.dispatch(x, idx, w)  # compiles every kernel, the ranks in step after
        moe.combine(recv_x, handle)
        payload = tokens * args.topk * args.hidden * 2
        timer = GraphRound()
        for i in range(len(STEPS)):
            timer.add(prefix(moe, x, idx, w, recv_x, i + 1), payload)
        times = timer.run()
        moe.check()
        shape = {"tokens": tokens, "hidden": args.hidden, "topk": args.topk, "experts": args.experts,
                 "routing": "skewed" if skewed else "uniform"}
        for name, us in zip(STEPS, times):
            record_row(rows, {"op": f"prefix:{name}", "contender": "ironlink", **shape, "us": round(us, 3)})
        if rank == 0:
            shares = ", ".join(f"{n} {t - (times[i - 1] if i else 0.0):.1f}" for i, (n, t) in enumerate(zip(STEPS, times)))
            print(f"phases {shape}: {shares} us", flush=True)
        if args.profile:
            profile(moe, x, idx, w, shape)
        moe.close()
    finally:
        heap.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", default=None, help="JSON file to write (rank 0)")
    ap.add_argument("--tokens", default="4096")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--profile", action="store_true", help="also print one eager layer's kernels (torch.profiler)")
    args = ap.parse_args()
    ironlink.init_distributed()
    rows: list[dict[str, Any]] = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for skewed in (False, True):
            steps_of(rows, args, tokens, skewed)
    write_results(args.out, dist.get_world_size(), rows, probe="moe_phases")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
