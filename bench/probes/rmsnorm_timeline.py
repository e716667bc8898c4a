"""Where all_reduce_rmsnorm's time goes, per CTA: a probe, not a benchmark.

    torchrun --nproc_per_node=2 bench/probes/rmsnorm_timeline.py --tokens 1,8,32,128 --out rmsnorm-timeline.json

Launches the op's kernel with TRACE=True (each CTA stores the GPU's global timer at its start,
after the wait for the previous kernel, after the all-reduce and at its end; ironlink/language/trace.py;
mode split also once its row's slice sums are in: `slice_sums_us` from the all-reduce's end)
in the default mode, with and without PRELOAD (the weight and the first residual row loaded before
the all-reduce), `--repeats` launches back to back in one CUDA graph with PDL as the op's default,
so both ranks run in step as in a model. Reports the median over those launches of the slowest
rank's phases, averaged over CTAs: `wait_us` (start to after the PDL wait: the previous kernel's
tail), `all_reduce_us`, `norm_us`, and the kernel's span; `graph_us` times the same launch
untraced, 20 back to back in a CUDA graph (as bench/fused.py), `traced_graph_us` the traced one so.
`--rows-at-once 1,2` also times each mode timed (the default, or `--modes`'), where it is rows, push
or push_two_shot, with that many rows at a time (the push modes: rows a pipelined step; bf16 and
FP8 out, the variants in turns:
ironlink_bench.GraphRound), rows with `variant` and `graph_us`. In push all of a CTA's work
falls between the wait for the previous kernel and the exchange's end (`all_reduce_us`).
`--ctas 128,64` also times each mode timed, where it is rows, a push mode or lamport, on those grids
(more rows a CTA on fewer CTAs: at one CTA an SM a launch's CTAs cannot start beside the previous
launch's), rows with `variant` "ctas=N" and `graph_us`, in turns as `--rows-at-once`.
`--shapes 256:8:1,132:16:2` also times each mode timed, where it is rows or a push mode, with those
CTAs, warps and rows at a time (CTAS:WARPS:ROWS; at most MAX_CTAS CTAs, the launch counters'),
in turns as `--rows-at-once`: whether two CTAs an SM of half the warps keep more bytes in flight.
`--split-parts 4,8,16` also runs mode split with that many slices a row (where the grid fits),
its slices exchanged over LL packets and through lamport slots (row field `lamport`);
`--two-shot-parts 1,4` mode two_shot so (row field `parts`).
`--fp8` times every plan's phases with an FP8 out too (Hopper; row field `fp8`): where an FP8
out's extra time goes (session 42: +6.7 us at 128 tokens in two_shot).
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
from ironlink.runtime.distributed import sm_share
from ironlink.fused.all_reduce_rmsnorm import launch, plan, split_into, two_shot_into
from ironlink.fused.diagnostics import Diagnostics
from ironlink.language._abi import MAX_CTAS
from ironlink.language.trace import TRACE_SLOTS
from ironlink.runtime.tensor_spec import TensorSpec
from ironlink.runtime.pdl import choose_pdl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness ironlink_bench, run from anywhere
from ironlink_bench import GraphRound, record_row, slowest_rank_median, time_graph, write_results  # noqa: E402


def phases(stamps: torch.Tensor) -> dict[str, float]:
    """Mean phase times (us) over the CTAs and the kernel span from int64 stamps [ctas, SLOTS]."""
    s = stamps[:, :4].double() / 1e3
    d = s[:, 1:] - s[:, :-1]
    got = {"wait_us": round(float(d[:, 0].mean()), 2), "all_reduce_us": round(float(d[:, 1].mean()), 2),
           "norm_us": round(float(d[:, 2].mean()), 2), "kernel_us": round(float(s[:, 3].max() - s[:, 0].min()), 2),
           "start_skew_us": round(float(s[:, 0].max() - s[:, 0].min()), 2)}
    if bool((stamps[:, 4] != 0).all()):  # mode split: slot 4 once the row's slice sums are in
        got["slice_sums_us"] = round(float((stamps[:, 4].double() / 1e3 - s[:, 2]).mean()), 2)
    return got


def in_turns(rows: list[dict[str, Any]], heap: Any, variants: list[tuple[str, Any]], x: torch.Tensor,
             residual: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, status: torch.Tensor, pdl: bool) -> None:
    """Each (label, plan) of `variants`, bf16 and FP8 out (Hopper), timed in turns: a row each
    with `variant` (the label) and `graph_us`."""
    t = x.shape[0]
    out8 = torch.empty(x.shape, device="cuda", dtype=torch.float8_e4m3fn)
    scale = torch.empty(t, device="cuda", dtype=torch.float32)
    runs = [(label, q._replace(fp8=fp8)) for fp8 in ((False, True) if torch.cuda.get_device_capability()[0] >= 9
                                                      else (False,)) for label, q in variants]
    timer = GraphRound()
    for _, q in runs:
        o, sc = (out8, scale) if q.fp8 else (out, out)

        # Defaults bind this variant. A def, not a lambda: mypy cannot type a lambda with defaults
        # (python/mypy#15459).
        def variant(q: Any = q, o: torch.Tensor = o, sc: torch.Tensor = sc) -> None:
            launch(heap, q, x, residual, residual, weight, o, sc, 1e-6, status, pdl)

        timer.add(variant, x.nbytes)
    for (label, q), us in zip(runs, timer.run()):
        record_row(rows, {"tokens": t, "hidden": x.shape[1], "mode": q.mode, "ctas": q.ctas,
                          "variant": f"{label}{',fp8' if q.fp8 else ''}", "graph_us": round(us, 2)})
    heap.check()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,8,32,128")
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rows-at-once", default="",
                    help="e.g. 1,2: rows at a time (the push modes: rows a step) to compare, where the mode is rows, "
                         "push or push_two_shot")
    ap.add_argument("--ctas", default="",
                    help="e.g. 128,64,32: grids to compare (rows a CTA: ceil(tokens / ctas)), where the mode is "
                         "rows, a push mode or lamport; the plan's own grid is timed among them if listed")
    ap.add_argument("--shapes", default="", help="e.g. 256:8:1,132:16:2: CTAS:WARPS:ROWS to compare, where the "
                         "mode is rows, push or push_two_shot")
    ap.add_argument("--modes", default="", help="e.g. rows,push: these modes instead of the default one")
    ap.add_argument("--split-parts", default="", help="e.g. 4,8,16: mode split with that many slices a row too")
    ap.add_argument("--two-shot-parts", default="",
                    help="e.g. 1,2,4,8: mode two_shot with that many slices a row too (where the grid fits)")
    ap.add_argument("--fp8", action="store_true", help="every plan with an FP8 out too (Hopper)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ironlink.init_distributed()
    world = dist.get_world_size()
    heap = ironlink.SymmetricHeap(1 << 30)  # every mode's workspace at 2048 tokens kept at once
    sms = sm_share(torch.cuda.current_device())
    major = torch.cuda.get_device_capability()[0]
    rows: list[dict[str, Any]] = []
    for t in map(int, args.tokens.split(",")):
        x = heap.zeros((t, args.hidden), torch.bfloat16)
        residual = torch.randn(t, args.hidden, device="cuda").to(torch.bfloat16)
        weight = torch.ones(args.hidden, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(residual)
        spec = TensorSpec.from_tensor
        status = torch.zeros(256, dtype=torch.int32, device="cuda")
        pdl = choose_pdl(None, major, "all_reduce_rmsnorm", heap.multi_node)
        for mode in args.modes.split(",") if args.modes else [None]:
            try:
                p = plan(spec(x, "x"), spec(residual, "residual"), spec(weight, "weight"), spec(out, "out"),
                         str(heap.device), world, sms, mode, heap.multi_node, None, None)
            except ValueError:  # a mode that cannot run this shape (split's grid)
                continue
            timeline(rows, args, heap, p, x, residual, weight, out, status, pdl)
            if args.rows_at_once and p.mode in ("rows", "push", "push_two_shot"):
                in_turns(rows, heap, [(f"rows_at_once={v}", p._replace(rows_at_once=int(v)))
                                      for v in args.rows_at_once.split(",")], x, residual, weight, out, status, pdl)
            if args.shapes and p.mode in ("rows", "push", "push_two_shot"):
                shapes = [tuple(map(int, v.split(":"))) for v in args.shapes.split(",")]
                in_turns(rows, heap, [(f"ctas={c},warps={w},rows_at_once={r}", p._replace(ctas=c, warps=w,
                                                                                         rows_at_once=r))
                                      for c, w, r in shapes if 0 < c <= min(MAX_CTAS, status.numel())],
                         x, residual, weight, out, status, pdl)
            if args.ctas and p.mode in ("rows", "push", "push_two_shot", "lamport"):  # rows a CTA: ceil(T / ctas)
                in_turns(rows, heap, [(f"ctas={c}", p._replace(ctas=int(c))) for c in args.ctas.split(",")
                                      if 0 < int(c) <= min(sms, status.numel())], x, residual, weight, out, status, pdl)
        for parts in (int(v) for v in args.split_parts.split(",") if v):
            if t * parts <= min(sms, status.numel()):  # every CTA resident
                for lamport in (False, True):
                    q = split_into(p, parts, x.element_size(), world, lamport)
                    timeline(rows, args, heap, q, x, residual, weight, out, status, pdl)
        for parts in (int(v) for v in args.two_shot_parts.split(",") if v):
            if parts == 1 or t * parts <= min(sms, status.numel()):  # slices: every CTA resident
                timeline(rows, args, heap, two_shot_into(p, parts, x.element_size(), world, sms), x, residual, weight,
                         out, status, pdl)
        heap.free(x)
    write_results(args.out, world, rows, probe="rmsnorm_timeline")
    heap.close()
    dist.destroy_process_group()


def timeline(rows: list[dict[str, Any]], args: argparse.Namespace, heap: Any, p: Any, x: torch.Tensor,
             residual: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, status: torch.Tensor,
             pdl: bool) -> None:
    """Plan `p`'s phases with and without PRELOAD (and with an FP8 out, `--fp8`): a row each into
    `rows`."""
    t = p.tokens
    plan_of = p
    out8 = torch.empty(x.shape, device="cuda", dtype=torch.float8_e4m3fn)
    scale = torch.empty(t, device="cuda", dtype=torch.float32)
    fp8s = (False, True) if args.fp8 and torch.cuda.get_device_capability()[0] >= 9 else (False,)
    for fp8, preload in ((f, pre) for f in fp8s for pre in (True, False)):
        p = plan_of._replace(preload=preload, fp8=fp8)
        o, sc = (out8, scale) if fp8 else (out, out)
        # The launches back to back in one CUDA graph, each with its own stamps: in step with
        # the other rank as in a model's graph (a launch after a host barrier measures the
        # ranks' start skew instead).
        traces = torch.zeros(args.repeats, p.ctas, TRACE_SLOTS.value, dtype=torch.int64, device="cuda")
        for _ in range(2):  # compile, and create the heap's state outside capture
            launch(heap, p, x, residual, residual, weight, o, sc, 1e-6, status, pdl, Diagnostics(trace=traces[0]))
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(args.repeats):
                launch(heap, p, x, residual, residual, weight, o, sc, 1e-6, status, pdl, Diagnostics(trace=traces[i]))
        traces.zero_()
        torch.cuda.synchronize()
        dist.barrier()
        g.replay()
        torch.cuda.synchronize()
        runs = [phases(traces[i].cpu()) for i in range(2, args.repeats)]  # the first two: still skewed
        del g
        heap.check()
        graph_us = time_graph(lambda: launch(heap, p, x, residual, residual, weight, o, sc, 1e-6, status, pdl),
                              x.nbytes)
        # The traced launch timed the same way: whether the stamps themselves slow the kernel
        # (the 2 H100 run's traced launches took 25-110 us where untraced ones took 10-22).
        traced_graph_us = time_graph(lambda: launch(heap, p, x, residual, residual, weight, o, sc, 1e-6,
                                                    status, pdl, Diagnostics(trace=traces[0])), x.nbytes)
        worst, _ = slowest_rank_median(runs, lambda r: r["kernel_us"])
        row = {"tokens": t, "hidden": args.hidden, "mode": p.mode, "parts": p.parts, "lamport": p.lamport,
               "fp8": fp8, "ctas": p.ctas, "warps": p.warps,
               "preload": preload, "pdl_in_graph": pdl, "graph_us": round(graph_us, 2),
               "traced_graph_us": round(traced_graph_us, 2), **worst,
               "kernel_us_spread": round(statistics.pstdev([r["kernel_us"] for r in runs]), 2)}
        record_row(rows, row)


if __name__ == "__main__":
    main()
