"""Runs the copy-engine kernels of matmul_reduce_scatter and all_gather_matmul in sequences of
shapes and calls, each on a fresh heap, and says per rank whether every call passed: which
sequences make a copy-engine wait time out. Session 38 found the deadlock of a side stream that
was the caller's stream this way (docs/record.md, as bench/copy_engine_sequence_probe.py). A
correctness check run by hand, not by tests/gpu/run.sh; needs only the package (setup_native.sh).

    torchrun --nproc_per_node=2 tests/gpu/workers/copy_engine_sequences.py [--on-copy-stream] \\
        [--graphs "2048:sm,ce2/4096:ce2;..."] [--sequences "rs:2048,4096;ag:2048,4096"]
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

import ironlink
from ironlink.runtime import tuning

N, K_TOTAL = 8192, 8192


def on_fresh_heap(nbytes: int, timeout_s: float, body: Callable[[Any], None]) -> str:
    """Runs `body(heap)` on a new heap: "ok", or what it raised. Closes the heap after a
    synchronize and a barrier, so the next sequence starts clean on every rank."""
    heap = ironlink.SymmetricHeap(nbytes, timeout_s=timeout_s)
    try:
        body(heap)
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:160]}"
    finally:
        torch.cuda.synchronize()
        dist.barrier()
        heap.close()


def report(label: str, run: Callable[[], str]) -> None:
    """Prints (rank 0) every rank's outcome of `run` and how long it took."""
    t = time.time()
    results: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(results, run())
    if dist.get_rank() == 0:
        print(f"{label}: {results} ({time.time() - t:.1f} s)", flush=True)


def reduce_scatter_operands(m: int) -> tuple[Any, Any, Any]:
    w = dist.get_world_size()
    a = torch.randn(m, K_TOTAL // w, device="cuda").to(torch.bfloat16)
    b = (torch.randn(K_TOTAL // w, N, device="cuda") / K_TOTAL ** 0.5).to(torch.bfloat16)
    return a, b, torch.empty(m // w, N, device="cuda", dtype=torch.bfloat16)


def eager_sequence(op: str, ms: list[int], calls: int, heap: Any) -> None:
    """`calls` checked calls of op ("rs" or "ag") at each M in turn; matmul_reduce_scatter's out
    compared with a float32 reference."""
    w, r = dist.get_world_size(), dist.get_rank()
    for m in ms:
        for i in range(calls):
            if op == "rs":
                a, b, out = reduce_scatter_operands(m)
                ironlink.matmul_reduce_scatter(a, b, heap=heap, out=out, method="kernel", check=True,
                                               exchange=tuning.ScatterExchange(copy_engine_min_rows=0))
                ref = torch.matmul(a.float(), b.float())
                dist.all_reduce(ref)
                want = ref[r * (m // w):(r + 1) * (m // w)]
                err = (out.float() - want).abs().max().item()
                if err > 0.05 * want.abs().max().item() + 1e-2:
                    raise RuntimeError(f"M={m} call {i}: wrong, max error {err:.3g}")
            else:
                shard = torch.randn(m // w, K_TOTAL, device="cuda").to(torch.bfloat16)
                b = (torch.randn(K_TOTAL, N // w, device="cuda") / K_TOTAL ** 0.5).to(torch.bfloat16)
                a_full = heap.empty((m, K_TOTAL), torch.bfloat16)
                ironlink.all_gather_matmul(shard, b, heap=heap, a_full=a_full, method="kernel", check=True)
                heap.free(a_full)


def graph_sequence(spec: str, heap: Any) -> None:
    """`spec`: "M:c,c,.../M:c,..." - at each M, matmul_reduce_scatter contenders captured and
    replayed in turns as bench/fused.py does (GraphRound), the heap checked after each capture and
    after the replays. Contenders: sm (the SM-push kernel), coll, ovl, ce1 / ce2 / ce4 (the
    copy-engine kernel with that many chunks at least)."""
    from ironlink.tune.timing import GraphRound  # what bench/ironlink_bench.py re-exports

    for step in spec.split("/"):
        m_text, names = step.split(":")
        m = int(m_text)
        a, b, out = reduce_scatter_operands(m)
        rnd = GraphRound()
        for name in names.split(","):
            method = {"coll": "collective", "ovl": "overlap"}.get(name, "kernel")
            ce = name.startswith("ce")
            exchange = tuning.ScatterExchange(copy_engine_min_rows=0 if ce else None,
                                              min_chunks=int(name[2:]) if ce else 1)

            def call(method: str = method, exchange: tuning.ScatterExchange = exchange) -> None:
                ironlink.matmul_reduce_scatter(a, b, heap=heap, out=out, method=method, exchange=exchange)

            rnd.add(call, m * N * 2)
            checked(heap, f"M={m} {name}")
        rnd.run()
        checked(heap, f"M={m} replays")


def checked(heap: Any, where: str) -> None:
    try:
        heap.check()
    except Exception as e:
        raise RuntimeError(f"{where}: {e}") from None


def on_copy_stream(op: str, old_choice: bool, heap: Any) -> None:
    """One call of op's copy-engine kernel with the stream its copies would take as the current
    stream. old_choice: the side stream chosen as before session 38 (the first made stream, whatever
    the current stream): shows the timeout the fix removes."""
    from ironlink.runtime import streams

    w = dist.get_world_size()
    chosen = streams.side_streams
    if old_choice:
        streams.side_streams = lambda device, count, main: streams._made_streams(device, count + 1)[:count]
    stream = streams._made_streams(torch.cuda.current_device(), 2)[0]
    try:
        with torch.cuda.stream(stream):
            if op == "rs":
                a = torch.randn(1024, 512, device="cuda").to(torch.bfloat16)
                b = torch.randn(512, 1024, device="cuda").to(torch.bfloat16)
                ironlink.matmul_reduce_scatter(a, b, heap=heap, method="kernel", check=True,
                                               exchange=tuning.ScatterExchange(copy_engine_min_rows=0))
            else:
                shard = torch.randn(512, 512, device="cuda").to(torch.bfloat16)
                b = torch.randn(512, 1024, device="cuda").to(torch.bfloat16)
                a_full = heap.empty((512 * w, 512), torch.bfloat16)
                ironlink.all_gather_matmul(shard, b, heap=heap, a_full=a_full, method="kernel", check=True)
    finally:
        streams.side_streams = chosen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", default="rs:2048,4096;rs:2048,8192;rs:4096,2048;ag:2048,4096;rs:4096,4096",
                    help="eager sequences 'op:M,M,...', ';'-separated (op: rs or ag)")
    ap.add_argument("--on-copy-stream", action="store_true",
                    help="call each op on its copies' stream, with the side stream chosen as now and as before")
    ap.add_argument("--graphs", default="", help="graph_sequence specs, ';'-separated")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=2.0)
    args = ap.parse_args()
    ironlink.init_distributed()
    t = args.timeout_s
    if args.on_copy_stream:
        for op in ("rs", "ag"):
            for old_choice in (True, False):
                report(f"{op} on the copies' stream, {'old' if old_choice else 'new'} choice",
                       lambda: on_fresh_heap(1 << 30, t, lambda heap: on_copy_stream(op, old_choice, heap)))
    for spec in filter(None, args.graphs.split(";")):
        report(spec, lambda: on_fresh_heap(4 << 30, t, lambda heap: graph_sequence(spec, heap)))
    for seq in filter(None, args.sequences.split(";")):
        op, ms = seq.split(":")
        report(seq, lambda: on_fresh_heap(2 << 30, t, lambda heap: eager_sequence(
            op, [int(m) for m in ms.split(",")], args.calls, heap)))


if __name__ == "__main__":
    main()
