"""Where the one-kernel sequence-parallel ops lose time: a probe, not a benchmark (issue 36).

    torchrun --nproc_per_node=2 bench/probes/sp_probe.py --ms 4096,16384 --out sp-probe.json

For all_gather_matmul and matmul_reduce_scatter's method "kernel", at bench/fused.py's shapes
(K = N = 8192, b column-parallel / row-parallel), in CUDA graphs, max over ranks:
- `torch.matmul`: cuBLAS on the whole local product (the floor a fused op chases);
- `kernel`: the op as users call it (`method="kernel"`; all_gather_matmul's shard is contiguous,
  so the copy engine moves it: `allgather_matmul_copy_engine_kernel`);
- all_gather_matmul `sm_push`: the kernel whose CTAs push the shard
  (`tuning.GatherExchange(copy_engine=False)`; the variants below are of that kernel);
  `ce_copy`: the copy engine's transfer alone (the shard into every peer's a_full, both ranks at once);
  `triton_flat_gemm+ce_copy`: `triton_flat_gemm` (below) with that transfer on a side stream at
  the same time, no flags and no waits (what the copies cost the GEMM: HBM, power);
- matmul_reduce_scatter `copy_engine`: its partials stored locally and moved by the copy engine
  (`tuning.ScatterExchange(copy_engine_min_rows=0)`);
- `gemm_only`: the same kernel with `Diagnostics(communicate=False)` (no push, no waits on peers: the GEMM
  plus, for all_gather_matmul, its grid barrier);
- all_gather_matmul `nested`: the other ranks' tiles in a nested loop instead of the flattened one;
  `register_push`: the shard pushed by stores from registers instead of TMA (world 2);
  `segments=S`: each own-row tile's K loop in S pieces, a piece of the push before each
  (default `tuning.ALL_GATHER_MATMUL_PUSH_SEGMENTS`); `gemm_only,segments=1`: the GEMM alone with
  whole K loops; `triton_flat_gemm`: the same product by matmul_all_reduce's two-shot kernel
  without communication (one flattened tile loop over all rows: the Triton tile's best here).
kernel - gemm_only is what the communication costs; gemm_only - torch.matmul the GEMM's gap.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

import ironlink
from ironlink.fused.all_gather_matmul import launch as launch_gather, plan as plan_gather
from ironlink.fused.matmul_all_reduce import launch as launch_matmul, plan as plan_matmul
from ironlink.fused.matmul_reduce_scatter import launch as launch_scatter, plan as plan_scatter
from ironlink.fused.diagnostics import Diagnostics
from ironlink.runtime.streams import side_streams
from ironlink.runtime.tensor_spec import TensorSpec
from ironlink.runtime import tuning
from ironlink.runtime.distributed import sm_share

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness ironlink_bench, run from anywhere
from ironlink_bench import record_row, time_graph, write_results  # noqa: E402

GEMM_ONLY = Diagnostics(communicate=False)  # the kernel without its exchange: no pushes, no waits on peers


def probe_all_gather(heap: Any, m: int, n: int, k: int, row: Callable[..., None]) -> None:
    w = heap.world_size
    shard = torch.randn(m // w, k, device="cuda").to(torch.bfloat16)
    b = (torch.randn(k, n // w, device="cuda") / k ** 0.5).to(torch.bfloat16)
    a_full = heap.empty((m, k), torch.bfloat16)
    out = torch.empty(m, n // w, device="cuda", dtype=torch.bfloat16)
    spec = TensorSpec.from_tensor
    p = plan_gather(spec(shard, "a_shard"), spec(b, "b"), spec(a_full, "a_full"), spec(out, "out"), str(heap.device),
                    w, sm_share(heap.device))
    status = torch.zeros(p.ctas, dtype=torch.int32, device="cuda")
    shape = (m, n // w, k)
    row("all_gather_matmul", "torch.matmul", shape, lambda: torch.matmul(a_full, b, out=out))
    row("all_gather_matmul", "kernel", shape,
        lambda: ironlink.all_gather_matmul(shard, b, heap=heap, a_full=a_full, out=out, method="kernel"))
    row("all_gather_matmul", "sm_push", shape,
        lambda: ironlink.all_gather_matmul(shard, b, heap=heap, a_full=a_full, out=out, method="kernel",
                                           exchange=tuning.GatherExchange(copy_engine=False)))
    mine = a_full[heap.rank * (m // w):(heap.rank + 1) * (m // w)]

    def copy_shard() -> None:  # into every peer's a_full, by the copy engine (the current stream)
        for i in range(1, w):
            heap.peer_tensor(mine, (heap.rank + i) % w).copy_(shard)

    row("all_gather_matmul", "ce_copy", shape, copy_shard)
    row("all_gather_matmul", "gemm_only", shape,
        lambda: launch_gather(heap, p, shard, b, a_full, out, status, diagnostics=GEMM_ONLY))
    measured = tuning.gather_push(torch.cuda.get_device_capability()[0])
    row("all_gather_matmul", "nested", shape,
        lambda: launch_gather(heap, p, shard, b, a_full, out, status, push=replace(measured, flat=False)))
    row("all_gather_matmul", "register_push", shape,
        lambda: launch_gather(heap, p, shard, b, a_full, out, status, push=replace(measured, tma_push=False)))
    for segments in (1, 2, 8):
        row("all_gather_matmul", f"segments={segments}", shape,
            lambda: launch_gather(heap, p, shard, b, a_full, out, status, push=replace(measured, segments=segments)))
    row("all_gather_matmul", "gemm_only,segments=1", shape,
        lambda: launch_gather(heap, p, shard, b, a_full, out, status, replace(measured, segments=1), GEMM_ONLY))
    flat_out = heap.empty((m, n // w), torch.bfloat16)
    fp = plan_matmul(spec(a_full, "a"), spec(b, "b"), spec(flat_out, "out"), str(heap.device), w, sm_share(heap.device),
                     None, "push")._replace(one_shot=False)
    row("all_gather_matmul", "triton_flat_gemm", shape,
        lambda: launch_matmul(heap, fp, a_full, b, flat_out, status, diagnostics=GEMM_ONLY))

    def gemm_beside_copies() -> None:  # no flags, no waits: what the copies alone cost the GEMM
        main = torch.cuda.current_stream()
        # Never the current stream: the copies would queue behind the GEMM.
        side = side_streams(torch.cuda.current_device(), 1, main)[0]
        side.wait_stream(main)
        with torch.cuda.stream(side):
            copy_shard()
        launch_matmul(heap, fp, a_full, b, flat_out, status, diagnostics=GEMM_ONLY)
        main.wait_stream(side)

    row("all_gather_matmul", "triton_flat_gemm+ce_copy", shape, gemm_beside_copies)
    heap.check()
    heap.free(flat_out)
    heap.free(a_full)


def probe_reduce_scatter(heap: Any, m: int, n: int, k: int, row: Callable[..., None]) -> None:
    w = heap.world_size
    a = torch.randn(m, k // w, device="cuda").to(torch.bfloat16)
    b = (torch.randn(k // w, n, device="cuda") / k ** 0.5).to(torch.bfloat16)
    out = torch.empty(m // w, n, device="cuda", dtype=torch.bfloat16)
    full = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    spec = TensorSpec.from_tensor
    p = plan_scatter(spec(a, "a"), spec(b, "b"), spec(out, "out"), str(heap.device), w, sm_share(heap.device))
    status = torch.zeros(p.ctas, dtype=torch.int32, device="cuda")
    shape = (m, n, k // w)
    row("matmul_reduce_scatter", "torch.matmul", shape, lambda: torch.matmul(a, b, out=full))
    row("matmul_reduce_scatter", "kernel", shape,
        lambda: ironlink.matmul_reduce_scatter(a, b, heap=heap, out=out, method="kernel"))
    row("matmul_reduce_scatter", "copy_engine", shape,
        lambda: ironlink.matmul_reduce_scatter(a, b, heap=heap, out=out, method="kernel",
                                               exchange=tuning.ScatterExchange(copy_engine_min_rows=0)))
    row("matmul_reduce_scatter", "gemm_only", shape,
        lambda: launch_scatter(heap, p, a, b, out, status, diagnostics=GEMM_ONLY))
    heap.check()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="4096,16384")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--only", default="", help="variants to time, '|'-separated (default: all)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ironlink.init_distributed()
    heap = ironlink.SymmetricHeap(4 << 30)
    rows: list[dict[str, Any]] = []

    def row(op: str, variant: str, shape: tuple[int, int, int], fn: Callable[[], Any]) -> None:
        if args.only and not any(v == variant for v in args.only.split("|")):
            return
        m, n, k = shape
        record_row(rows, {"op": op, "variant": variant, "M": m, "N": n, "K": k, "us": round(time_graph(fn, m * k * 2), 2)})

    for m in map(int, args.ms.split(",")):
        probe_all_gather(heap, m, args.n, args.k, row)
        probe_reduce_scatter(heap, m, args.n, args.k, row)
    write_results(args.out, dist.get_world_size(), rows, probe="sp_probe")
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
