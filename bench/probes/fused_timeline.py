"""Where a fused matmul + all-reduce spends its time, per CTA: a probe, not a benchmark.

    torchrun --nproc_per_node=2 bench/probes/fused_timeline.py --ms 1024,4096 --out timeline.json

Launches matmul_all_reduce's kernels (every method) with TRACE=True, so each CTA stores the
GPU's global timer at its start and after each phase of each tile (ironlink/language/trace.py):
- method "tile": GEMM done, tile all-reduced (the all-reduce's two cross-rank barriers included);
- method "push", one-shot: the first part of the K loop, the previous tile's partial pushed, the
  rest of the K loop, the signal, the partial staged, the reduce of the tile two steps back (the
  wait for the peers' partials included); then the end ("finish": the last push and reduces);
- method "push", two-shot: the K loop up to the signal point, the previous tile's signal, the
  rest of the K loop, the wait for the peers' partials (owned tiles), the push of the partial or
  of the sum; then the end ("finish": the last signal, the wait for the sums).
  One-shot rows also sum each CTA's last tile alone (the `last_<i>_<phase>` columns).
Per launch it reports, summed over the CTAs of the slowest rank and as a share of CTA time:
the GEMM, each communication phase, and the time from a CTA's last stamp to the kernel's end
(idle SMs). Traced launches run one at a time after a host barrier, so a rank that starts first
waits for the other (their start skew shows in the reduce); `graph_us` times the same launch
untraced, 20 back to back in a CUDA graph (as bench/fused.py).
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
from ironlink.runtime import tuning
from ironlink.fused.matmul_all_reduce import launch, plan
from ironlink.fused.diagnostics import Diagnostics
from ironlink.language.trace import TRACE_SLOTS
from ironlink.runtime.tensor_spec import TensorSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness ironlink_bench, run from anywhere
from ironlink_bench import record_row, slowest_rank_median, time_graph, write_results  # noqa: E402

PHASES = {"tile": ("gemm", "tile_all_reduce"), "push": ("gemm", "push_prev", "gemm", "signal", "stage", "reduce"),
          "push_two_shot": ("gemm", "signal_prev", "gemm", "wait_partials", "push_or_sum")}
# Summed phase times are CTA-microseconds: kernel_us x ctas is the whole; start skew and the idle
# time after a CTA's last stamp make up the rest.


def summarize(stamps: torch.Tensor, phases: tuple[str, ...]) -> dict[str, Any]:
    """Per-phase totals (us, summed over CTAs) and the kernel span from int64 stamps [ctas, SLOTS]:
    after the start, len(phases) stamps per tile, then (push) one at the end ("finish")."""
    per = len(phases)
    totals = {p: 0.0 for p in (*phases, "finish")}
    last = {f"last_{i}_{p}": 0.0 for i, p in enumerate(phases)}  # each CTA's last tile
    tails, tiles = [], 0
    t0 = int(stamps[:, 0].min())
    end = int(stamps.max())
    for row in stamps.tolist():
        marks = [v for v in row[1:] if v]
        prev = row[0]
        last_tile_from = (len(marks) - 1) // per * per - per  # the last tile's first stamp (finish after)
        for i, v in enumerate(marks):
            last_alone = i == len(marks) - 1 and len(marks) % per == 1
            totals["finish" if last_alone else phases[i % per]] += (v - prev) / 1e3
            if not last_alone and i >= last_tile_from:
                last[f"last_{i % per}_{phases[i % per]}"] += (v - prev) / 1e3
            tiles += i % per == 0 and not last_alone
            prev = v
        tails.append((end - prev) / 1e3)
    cta_time = stamps.shape[0] * (end - t0) / 1e3
    out = {"kernel_us": (end - t0) / 1e3, "ctas": stamps.shape[0], "tiles_traced": tiles,
           "idle_after_last_stamp_us": round(sum(tails), 1),
           "idle_share": round(sum(tails) / cta_time, 3),
           "start_skew_us": round((int(stamps[:, 0].max()) - t0) / 1e3, 2)}
    for p, v in totals.items():
        out[f"{p}_us"] = round(v, 1)
        out[f"{p}_share"] = round(v / cta_time, 3)
    if "push_prev" in phases:  # one-shot: its last tile alone
        out.update({f"{p}_us": round(v, 1) for p, v in last.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1024,4096")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k-total", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--staggers", default=str(tuning.MATMUL_PUSH_STAGGER),
                    help="push method: CTA groups pushing at different points of the K loop (1: all at once)")
    ap.add_argument("--tma-push", default="1", help="push method: 1 pushes through TMA where possible, 0 by stores "
                    "from registers; '0,1' both")
    ap.add_argument("--shots", default="auto", help="push method: 'one', 'two', 'auto' (tuning.matmul_one_shot); "
                    "comma-separated")
    ap.add_argument("--signal-at", default=str(tuning.MATMUL_SIGNAL_AT),
                    help="push two-shot, nested: where in the next tile's K loop a CTA signals (comma-separated "
                    "shares)")
    ap.add_argument("--flat", default=str(int(tuning.MATMUL_FLAT)),
                    help="push two-shot: 1 flattens the tile and K loops, 0 nests them; '0,1' both")
    ap.add_argument("--signal-every", default=str(tuning.MATMUL_SIGNAL_EVERY),
                    help="push two-shot, flat, world 2: signal every this many tiles (comma-separated)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ironlink.init_distributed()
    world = dist.get_world_size()
    heap = ironlink.SymmetricHeap(2 << 30)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows: list[dict[str, Any]] = []
    for m in map(int, args.ms.split(",")):
        k = args.k_total // world
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = (torch.randn(k, args.n, device="cuda") / k ** 0.5).to(torch.bfloat16)
        out = heap.empty((m, args.n), torch.bfloat16)
        specs = [TensorSpec.from_tensor(t, n) for t, n in ((a, "a"), (b, "b"), (out, "out"))]
        status = torch.zeros(256, dtype=torch.int32, device="cuda")
        variants = [("push", shot, st, tma, at, flat, every) for shot in args.shots.split(",")
                    for st in map(int, args.staggers.split(",")) for tma in map(int, args.tma_push.split(","))
                    for at in map(float, args.signal_at.split(",")) for flat in map(int, args.flat.split(","))
                    for every in map(int, args.signal_every.split(","))]
        variants.append(("tile", "auto", 0, 0, 1.0, 0, 1))
        seen: set[tuple[Any, ...]] = set()
        for method, shot, stagger, tma, at, flat, every in variants:
            p = plan(*specs, str(heap.device), world, sms, None, method)
            if shot != "auto":
                p = p._replace(one_shot=shot == "one")
            # One-shot takes the stagger, two-shot the signal point (nested) or the batch of signals
            # (flat): each distinct launch once.
            key = (method, p.one_shot, tma, stagger if p.one_shot else (flat, every if flat else at))
            if key in seen:
                continue
            seen.add(key)
            phases = PHASES["push" if p.one_shot else "push_two_shot"] if method == "push" else PHASES[method]
            pacing = tuning.PushPacing(stagger or tuning.MATMUL_PUSH_STAGGER, tuning.MATMUL_TAIL_INTERLEAVED, at,
                                       bool(flat), every, tma_push=bool(tma))
            trace = torch.zeros(p.ctas, TRACE_SLOTS.value, dtype=torch.int64, device="cuda")
            for _ in range(3):
                launch(heap, p, a, b, out, status, pacing)
            results = []
            for _ in range(args.repeats):
                trace.zero_()
                torch.cuda.synchronize()
                dist.barrier()
                launch(heap, p, a, b, out, status, pacing, Diagnostics(trace=trace))
                torch.cuda.synchronize()
                results.append(summarize(trace.cpu(), phases))
            heap.check()
            # The same launch untraced, 20 back to back in a CUDA graph (as bench/fused.py times).
            graph_us = time_graph(lambda: launch(heap, p, a, b, out, status, pacing), out.nbytes)
            heap.check()
            worst, gathered = slowest_rank_median(results, lambda r: r["kernel_us"])
            row = {"M": m, "N": args.n, "K": k, "method": method, "stagger": stagger, "tma_push": bool(tma),
                   "signal_at": at, "flat": bool(flat), "signal_every": every,
                   "config": list(p.config), "ctas": p.ctas, "one_shot": p.one_shot, "graph_us": round(graph_us, 2),
                   **worst, "kernel_us_all_ranks": [r["kernel_us"] for r in gathered],
                   "kernel_us_spread": round(statistics.pstdev([r["kernel_us"] for r in results]), 2)}
            record_row(rows, row)
        heap.free(out)
    write_results(args.out, world, rows, probe="fused_timeline")
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
