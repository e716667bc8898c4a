"""Runs matmul_reduce_scatter's copy-engine kernel (and all_gather_matmul's) at a sequence of
shapes in one process, each call checked, on a fresh heap per sequence: which sequences of
shapes make a call time out. torchrun --nproc_per_node=2 bench/copy_engine_sequence_probe.py"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import ironlink
from ironlink.runtime import tuning


def run_sequence(ms: list[int], op: str, n: int, k_total: int, calls: int, timeout_s: float) -> str:
    w = dist.get_world_size()
    heap = ironlink.SymmetricHeap(2 << 30, timeout_s=timeout_s)
    try:
        for m in ms:
            for i in range(calls):
                if op == "rs":
                    a = torch.randn(m, k_total // w, device="cuda").to(torch.bfloat16)
                    b = (torch.randn(k_total // w, n, device="cuda") / k_total ** 0.5).to(torch.bfloat16)
                    out = torch.empty(m // w, n, device="cuda", dtype=torch.bfloat16)
                    with tuning.overridden(MATMUL_REDUCE_SCATTER_COPY_ENGINE=True):
                        ironlink.matmul_reduce_scatter(a, b, heap=heap, out=out, method="kernel", check=True)
                    ref = torch.empty(m, n, device="cuda", dtype=torch.float32)
                    torch.matmul(a.float(), b.float(), out=ref)
                    dist.all_reduce(ref)
                    want = ref[dist.get_rank() * (m // w):(dist.get_rank() + 1) * (m // w)]
                    err = (out.float() - want).abs().max().item()
                    if err > 0.05 * want.abs().max().item() + 1e-2:
                        return f"M={m} call {i}: wrong, max error {err:.3g}"
                else:
                    shard = torch.randn(m // w, k_total, device="cuda").to(torch.bfloat16)
                    b = (torch.randn(k_total, n // w, device="cuda") / k_total ** 0.5).to(torch.bfloat16)
                    a_full = heap.empty((m, k_total), torch.bfloat16)
                    out = torch.empty(m, n // w, device="cuda", dtype=torch.bfloat16)
                    ironlink.all_gather_matmul(shard, b, heap=heap, a_full=a_full, out=out, method="kernel",
                                               check=True)
                    heap.free(a_full)
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:160]}"
    finally:
        torch.cuda.synchronize()
        dist.barrier()
        heap.close()


def graph_sequence(spec: str, timeout_s: float) -> str:
    """`spec`: "M:c,c,...;M:c,..." - at each M, matmul_reduce_scatter contenders captured and
    replayed in turns as bench/fused.py does (GraphRound), the heap checked after each capture and
    after the replays. Contenders: sm (the SM-push kernel), coll, ovl, ce1 / ce2 / ce4 (the
    copy-engine kernel with that many chunks at least)."""
    from ironlink_bench import GraphRound

    w = dist.get_world_size()
    heap = ironlink.SymmetricHeap(4 << 30, timeout_s=timeout_s)
    n, k_total = 8192, 8192
    where = ""
    try:
        for step in spec.split("/"):
            m_text, names = step.split(":")
            m = int(m_text)
            a = torch.randn(m, k_total // w, device="cuda").to(torch.bfloat16)
            b = (torch.randn(k_total // w, n, device="cuda") / k_total ** 0.5).to(torch.bfloat16)
            out = torch.empty(m // w, n, device="cuda", dtype=torch.bfloat16)
            rnd = GraphRound()
            for name in names.split(","):
                where = f"M={m} {name}"
                method = {"coll": "collective", "ovl": "overlap"}.get(name, "kernel")
                ce = name.startswith("ce")
                least = int(name[2:]) if ce else 1
                tables = dict(MATMUL_REDUCE_SCATTER_COPY_ENGINE=ce, COPY_ENGINE_MIN_CHUNKS={
                    **tuning.COPY_ENGINE_MIN_CHUNKS, "matmul_reduce_scatter": least})
                def call(method: str = method) -> None:
                    ironlink.matmul_reduce_scatter(a, b, heap=heap, out=out, method=method)

                with tuning.overridden(**tables):
                    rnd.add(call, m * n * 2)
                heap.check()
            where = f"M={m} replays"
            rnd.run()
            heap.check()
        return "ok"
    except Exception as e:
        return f"{where}: {type(e).__name__}: {str(e)[:100]}"
    finally:
        torch.cuda.synchronize()
        dist.barrier()
        heap.close()


def on_copy_stream(op: str, old_choice: bool, timeout_s: float) -> str:
    """One call of `op`'s copy-engine kernel with the stream its copies would take as the current
    stream. old_choice: the side stream chosen as before session 38 (the pool's first, whatever
    the current stream): shows the timeout the fix removes."""
    from ironlink.fused import sp_streams

    w = dist.get_world_size()
    heap = ironlink.SymmetricHeap(1 << 30, timeout_s=timeout_s)
    chosen = sp_streams.side_streams
    if old_choice:
        sp_streams.side_streams = lambda device, count, main: sp_streams._made_streams(device, count + 1)[:count]
    stream = sp_streams._made_streams(torch.cuda.current_device(), 2)[0]
    try:
        with torch.cuda.stream(stream), tuning.overridden(MATMUL_REDUCE_SCATTER_COPY_ENGINE=True):
            if op == "rs":
                a = torch.randn(1024, 512, device="cuda").to(torch.bfloat16)
                b = torch.randn(512, 1024, device="cuda").to(torch.bfloat16)
                ironlink.matmul_reduce_scatter(a, b, heap=heap, method="kernel", check=True)
            else:
                shard = torch.randn(512, 512, device="cuda").to(torch.bfloat16)
                b = torch.randn(512, 1024, device="cuda").to(torch.bfloat16)
                a_full = heap.empty((512 * w, 512), torch.bfloat16)
                ironlink.all_gather_matmul(shard, b, heap=heap, a_full=a_full, method="kernel", check=True)
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:90]}"
    finally:
        sp_streams.side_streams = chosen
        torch.cuda.synchronize()
        dist.barrier()
        heap.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", default="rs:2048,4096;rs:2048,8192;rs:4096,2048;ag:2048,4096;rs:4096,4096")
    ap.add_argument("--on-copy-stream", action="store_true",
                    help="call each op on its copies' stream, with the side stream chosen as now and as before")
    ap.add_argument("--graphs", default="", help="graph_sequence specs, ';'-separated")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=2.0)
    args = ap.parse_args()
    ironlink.init_distributed()
    if args.on_copy_stream:
        for op in ("rs", "ag"):
            for old_choice in (True, False):
                result = on_copy_stream(op, old_choice, args.timeout_s)
                results = [None] * dist.get_world_size()
                dist.all_gather_object(results, result)
                if dist.get_rank() == 0:
                    print(f"{op} on the copies' stream, {'old' if old_choice else 'new'} choice: {results}", flush=True)
    for spec in filter(None, args.graphs.split(";")):
        t = time.time()
        result = graph_sequence(spec, args.timeout_s)
        results = [None] * dist.get_world_size()
        dist.all_gather_object(results, result)
        if dist.get_rank() == 0:
            print(f"{spec}: {results} ({time.time() - t:.1f} s)", flush=True)
    for seq in filter(None, args.sequences.split(";")):
        op, ms = seq.split(":")
        t = time.time()
        result = run_sequence([int(m) for m in ms.split(",")], op, 8192, 8192, args.calls, args.timeout_s)
        results = [None] * dist.get_world_size()
        dist.all_gather_object(results, result)
        if dist.get_rank() == 0:
            print(f"{seq:>24}: {results} ({time.time() - t:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
