"""Where MoeExchange's low-latency dispatch and combine spend their time, per CTA: a probe, not a
benchmark.

    torchrun --nproc_per_node=2 bench/probes/moe_timeline.py --tokens 128 --out moe-timeline.json

Builds MoeExchange(path="low_latency") for each token count and routing (bench/moe.py's: hidden
7168, top-8 of 64, uniform and skewed), and runs `--repeats` dispatch + combine layers back to back
in one CUDA graph with the kernels built with TRACE (each CTA stores the GPU's global timer at the
points moe/low_latency_kernels.py names), so both ranks run in step as in a model. Reports, for the
median layer of the slowest rank, averaged over CTAs: dispatch `send_us` (start to its sends
issued), `counts_us` (until every rank's count word is in, this rank's own rows taken meanwhile),
`copy_us` (the peers' landed rows into recv_x), `arrive_us` (the last-CTA count of arrivals), its
span; combine `sums_us` (weighted sums sent), `sum_us` (the own tokens' rows added as they land),
`rendezvous_us` (every rank's count word), its span; `gap_us` from dispatch's last CTA end to
combine's first CTA start, and each kernel's `start_skew_us`.
`graph_us` / `traced_graph_us` time the layer untraced / traced (20 back to back in a CUDA graph).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import ironlink
from ironlink.language.trace import TRACE_SLOTS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: ironlink_bench and moe.py, run from anywhere
from ironlink_bench import record_row, slowest_rank_median, time_graph, write_results  # noqa: E402
from moe import routing  # noqa: E402  bench/moe.py: the benchmark's inputs


def phases(d: torch.Tensor, c: torch.Tensor) -> dict[str, float]:
    """Mean phase times (us) over the CTAs of one layer from int64 stamps [ctas, SLOTS] of its
    dispatch (5 stamps) and combine (4)."""
    ds, cs = d[:, :5].double() / 1e3, c[:, :4].double() / 1e3
    dd, cd = ds[:, 1:] - ds[:, :-1], cs[:, 1:] - cs[:, :-1]
    return {"send_us": float(dd[:, 0].mean()), "counts_us": float(dd[:, 1].mean()),
            "copy_us": float(dd[:, 2].mean()), "arrive_us": float(dd[:, 3].mean()),
            "dispatch_us": float(ds[:, 4].max() - ds[:, 0].min()),
            "dispatch_start_skew_us": float(ds[:, 0].max() - ds[:, 0].min()),
            "gap_us": float(cs[:, 0].min() - ds[:, 4].max()),
            "sums_us": float(cd[:, 0].mean()), "sum_us": float(cd[:, 1].mean()),
            "rendezvous_us": float(cd[:, 2].mean()), "combine_us": float(cs[:, 3].max() - cs[:, 0].min()),
            "combine_start_skew_us": float(cs[:, 0].max() - cs[:, 0].min())}


def timeline(rows: list[dict[str, Any]], args: argparse.Namespace, heap: Any, tokens: int, skewed: bool) -> None:
    x, idx, w = routing(dist.get_rank(), tokens, args.hidden, args.topk, args.experts, skewed)
    moe = ironlink.MoeExchange(heap, tokens, args.hidden, args.topk, args.experts, path="low_latency")
    ll = moe.low_latency
    assert ll is not None
    ctas = int(ll.ctas)
    n = args.repeats
    dtr = torch.zeros(n, ctas, TRACE_SLOTS.value, dtype=torch.int64, device="cuda")
    ctr = torch.zeros_like(dtr)

    def layer(i: int = -1) -> None:
        ll.trace = dtr[i] if i >= 0 else None
        recv_x, _, _, handle = moe.dispatch(x, idx, w)
        ll.trace = ctr[i] if i >= 0 else None
        moe.combine(recv_x, handle)
        ll.trace = None

    for i in (-1, 0, -1, 0):  # compile both builds; make the exchange's state outside capture
        layer(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            layer(i)
    dtr.zero_()
    ctr.zero_()
    torch.cuda.synchronize()
    dist.barrier()
    g.replay()
    torch.cuda.synchronize()
    runs = [phases(dtr[i].cpu(), ctr[i].cpu()) for i in range(2, n)]  # the first two: still skewed
    del g
    moe.check()
    graph_us = time_graph(layer, 2 * tokens * args.hidden * 2)
    traced_graph_us = time_graph(lambda: layer(0), 2 * tokens * args.hidden * 2)
    worst, _ = slowest_rank_median(runs, lambda r: r["dispatch_us"] + r["combine_us"])
    row = {"tokens": tokens, "hidden": args.hidden, "topk": args.topk, "experts": args.experts,
           "routing": "skewed" if skewed else "uniform", "ctas": ctas, "graph_us": round(graph_us, 2),
           "traced_graph_us": round(traced_graph_us, 2), **{k: round(v, 2) for k, v in worst.items()},
           "dispatch_us_spread": round(statistics.pstdev([r["dispatch_us"] for r in runs]), 2)}
    record_row(rows, row)
    moe.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="128")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ironlink.init_distributed()
    heap = ironlink.SymmetricHeap(1 << 30)
    rows: list[dict[str, Any]] = []
    for t in map(int, args.tokens.split(",")):
        for skewed in (False, True):
            timeline(rows, args, heap, t, skewed)
    write_results(args.out, dist.get_world_size(), rows, probe="moe_timeline")
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
