"""GPU suite of the host-level ops (ironlink.all_reduce / all_gather / reduce_scatter /
all_to_all_v and MoeExchange).

    torchrun --standalone --nproc_per_node=8 tests/gpu/workers/ops_worker.py    # tests/gpu/run.sh ops

One process per GPU. Each case fills heap tensors with fresh random data, runs the ironlink call
and the same collective through torch.distributed (NCCL), and compares: all_gather bitwise (a
copy), reductions against NCCL run on the inputs upcast to fp32 (NCCL reduces bf16 in bf16 step by
step, ironlink in fp32 with one rounding, so their bf16 outputs may differ by an ulp). bf16 and
fp32, messages of 1 KiB to 64 MiB plus an odd element count, in-place variants, the lamport and
hierarchical all-reduce paths, tensors outside the heap, all three calls captured in one CUDA graph
and replayed with new data. all_to_all_v bit-exact against dist.all_to_all_single (rows of any
width, in a CUDA graph with counts changed between replays, over capacity). MoeExchange's dispatch
bit-exact and combine against a float64 reference on every path (relay, direct, low-latency, the
receive deferred), fp8 dispatch, CUDA graphs, an SM budget, over capacity, out-of-range expert ids
and the largest promised shape. Then the argument errors. Rank 0 prints
"== ops world N: X passed, Y failed =="; the exit status is non-zero on failure. Without torch,
CUDA or torchrun it prints why it skipped and exits 0.
"""

from __future__ import annotations

import os
import sys
import time

import ironlink  # torch-free: importable where the suite then skips
from ironlink.runtime.distributed import ranks_per_gpu

try:
    import torch
    import torch.distributed as dist
    from _cases import SMALL, heap_timeout_s, replays, small  # tests/gpu/workers/, the script's own directory
    from _ops_moe import (LIMITS, all_to_all_v_case, limits_case_bytes, moe_bad_ids_case, moe_case, moe_limits_case,
                         moe_paths_case)
    from _ops_suite import MESSAGE_BYTES, ODD_ELEMENTS, Suite
except ImportError:  # the CPU machines have no torch
    torch = None  # type: ignore[assignment]


def skip_reason() -> str | None:
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return "not under torchrun (RANK/WORLD_SIZE unset)"
    return None


def main() -> int:
    reason = skip_reason()
    if reason:
        print(f"== ops: skipped ({reason}) ==", flush=True)
        return 0
    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(4321 + rank)
    heap = ironlink.SymmetricHeap(320 << 20, timeout_s=heap_timeout_s())
    s = Suite(heap)
    t0 = time.time()

    def first_call_names_heap() -> None:
        # No heap passed yet in this process: the error asks for heap=; then it is remembered.
        x = heap.zeros((256,), torch.float32)
        try:
            try:
                ironlink.all_reduce(x)
                raise AssertionError("a heap no call had named was found")
            except ironlink.IronlinkError as e:
                assert "heap=" in str(e), str(e)
            x.fill_(1.0)
            ironlink.all_reduce(x, heap=heap, check=True)
            ironlink.all_reduce(x, check=True)  # found from the tensor now
            torch.cuda.synchronize()
            assert torch.equal(x, torch.full_like(x, float(world * world))), "sum of sums"
        finally:
            heap.free(x)

    s.run("first call needs heap=, later calls find it", first_call_names_heap)
    for dtype in (torch.bfloat16, torch.float32):
        esize = torch.tensor([], dtype=dtype).element_size()
        counts = [b // esize for b in small(MESSAGE_BYTES, MESSAGE_BYTES[:2])] + [ODD_ELEMENTS * world]
        for total in counts:
            per_rank = total // world
            label = f"{dtype} {total * esize} B"
            s.run(f"all_reduce sum {label}", lambda: s.all_reduce(total, dtype, "sum"))
            s.run(f"all_gather {label}", lambda: s.all_gather(per_rank, dtype, False))
            s.run(f"reduce_scatter sum {label}", lambda: s.reduce_scatter(per_rank, dtype, "sum", False))
        n = (1 << 20) // esize
        for op in ("max", "avg"):
            s.run(f"all_reduce {op} {dtype} 1 MiB", lambda: s.all_reduce(n, dtype, op))
            s.run(f"reduce_scatter {op} {dtype} 1 MiB", lambda: s.reduce_scatter(n // world, dtype, op, False))
        # Through lamport slots: one CTA (1 element, 1 KiB), a ragged last CTA, the most CTAs.
        lamport_counts = [1, 1024 // esize, 5000, (256 << 10) // esize]
        for n_lamport in small(lamport_counts, lamport_counts[:3]):
            for op in ("sum", "max", "min", "prod", "avg"):
                s.run(f"all_reduce lamport {op} {dtype} {n_lamport} elements",
                      lambda: s.all_reduce_lamport(n_lamport, dtype, op))
        s.run(f"all_reduce lamport sum {dtype} 16 KiB: {replays(300)} graph replays with new data",
              lambda: s.all_reduce_lamport((16 << 10) // esize, dtype, "sum", replays=replays(300)))
        for op in ("sum", "avg"):
            s.run(f"all_reduce_hierarchical {op} {dtype} (one node: two-shot)",
                  lambda: s.all_reduce_hierarchical(300001, dtype, op))
        for nbytes in (1024, 64 << 10, 4 << 20):  # lamport sizes (taken where they are), then staged
            for graph in (False, True):
                s.run(f"all_reduce sum {dtype} {nbytes} B outside the heap{' in a CUDA graph' if graph else ''}",
                      lambda: s.all_reduce_outside_heap(nbytes // esize, dtype, graph))
        s.run(f"all_gather and reduce_scatter {dtype} outside the heap", lambda: s.gather_scatter_outside_heap(4099, dtype))
        s.run(f"all_gather in place {dtype}", lambda: s.all_gather(4099, dtype, True))
        s.run(f"reduce_scatter in place {dtype}", lambda: s.reduce_scatter(4099, dtype, "sum", True))
        s.run(f"cuda graph {dtype} small", lambda: s.cuda_graph(dtype, 300))
        if not SMALL:
            s.run(f"cuda graph {dtype} 1 MiB per rank", lambda: s.cuda_graph(dtype, (1 << 20) // esize))
    for dtype in (torch.bfloat16, torch.float32):
        for row in small((7, 4096), (7,)):
            s.run(f"all_to_all_v {dtype} row {row}", lambda: all_to_all_v_case(s, row, dtype, (1, 2, 3), graph=False))
        s.run(f"all_to_all_v {dtype} in a CUDA graph, counts changed between replays",
              lambda: all_to_all_v_case(s, 1000, dtype, (4, 5, 6), graph=True))
    for tokens, skewed in ((37, False), (256, True)):
        s.run(f"moe dispatch/combine {tokens} tokens {'skewed' if skewed else 'uniform'}",
              lambda: moe_case(s, tokens, skewed, graph=False))
    s.run("moe dispatch/combine in a CUDA graph, routing changed between replays",
          lambda: moe_case(s, 64, False, graph=True))
    s.run("moe over capacity", lambda: moe_case(s, 64, True, graph=False, capacity=32))
    for tokens, skewed, fp8 in ((300, False, False), (256, True, False), (256, True, True)):
        s.run(f"moe direct path = relay path bitwise, {tokens} tokens{' skewed' if skewed else ''}{' fp8' if fp8 else ''}",
              lambda: moe_paths_case(s, tokens, skewed, fp8))
    s.run("moe on an 8-SM budget in a CUDA graph, routing changed between replays",
          lambda: moe_case(s, 64, True, graph=True, sms=8))
    for tokens, skewed in ((37, False), (128, True)):
        s.run(f"moe low-latency path {tokens} tokens {'skewed' if skewed else 'uniform'}",
              lambda: moe_case(s, tokens, skewed, graph=False, path="low_latency"))
    s.run("moe low-latency path in a CUDA graph, routing changed between replays",
          lambda: moe_case(s, 64, False, graph=True, path="low_latency"))
    s.run("moe low-latency path fp8 dispatch 64 tokens skewed",
          lambda: moe_case(s, 64, True, graph=False, fp8=True, path="low_latency"))
    # x in the heap: the direct path pulls its rows in place (no stage copy).
    s.run("moe direct path, x in the heap, 300 tokens skewed",
          lambda: moe_case(s, 300, True, graph=False, path="direct", x_in_heap=True))
    s.run("moe direct path, x in the heap, in a CUDA graph, routing changed between replays",
          lambda: moe_case(s, 64, False, graph=True, path="direct", x_in_heap=True))
    # The receive deferred (return_recv_hook) past a kernel on the low-latency kernels' tile indices.
    s.run("moe low-latency path, receive deferred, 128 tokens skewed",
          lambda: moe_case(s, 128, True, graph=False, path="low_latency", deferred=True))
    s.run("moe low-latency path, receive deferred, fp8, in a CUDA graph, routing changed between replays",
          lambda: moe_case(s, 64, False, graph=True, fp8=True, path="low_latency", deferred=True))
    s.run("moe out-of-range expert ids", lambda: moe_bad_ids_case(s))
    s.run("moe fp8 dispatch 256 tokens skewed", lambda: moe_case(s, 256, True, graph=False, fp8=True))
    if not SMALL:
        for fp8 in (False, True):
            name = (f"moe at the limits: {LIMITS[0]} tokens, hidden {LIMITS[1]}, top-{LIMITS[2]} of 256 experts, "
                    f"skewed{', fp8' if fp8 else ''}")
            need = limits_case_bytes(s.world, fp8) * ranks_per_gpu()
            have = torch.cuda.get_device_properties(0).total_memory
            if need > have:
                if rank == 0:
                    print(f"skipped: {name}: {ranks_per_gpu()} rank(s) on a GPU need about {need / 2**30:.0f} GiB "
                          f"of its {have / 2**30:.0f} GiB")
                continue
            s.run(name, lambda: moe_limits_case(s, fp8))
    for path in ("low_latency", "direct"):
        s.run(f"moe fp8 dispatch in a CUDA graph, routing changed between replays, {path} path",
              lambda: moe_case(s, 64, False, graph=True, fp8=True, path=path))
    s.run("all_to_all_v over capacity", lambda: all_to_all_v_case(s, 64, torch.bfloat16, (7,), graph=False, out_rows=5))
    s.run("argument errors", s.argument_errors)
    s.run("heap.check() is clean", lambda: s.heap.check())
    s.heap.close()
    code = s.report("ops", world, t0)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
