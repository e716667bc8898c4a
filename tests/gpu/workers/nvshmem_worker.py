"""GPU suite of the NVSHMEM backend (run under torchrun by `tests/gpu/run.sh nvshmem`).

Two heaps in every process: `SymmetricHeap(..., backend="nvshmem")` (PyTorch's NVSHMEM symmetric
memory) and the default P2P heap. Every host-level call (ironlink.all_reduce in every algorithm
and op, all_gather, reduce_scatter, all_to_all_v, the fused all_reduce_rmsnorm and
matmul_all_reduce, MoeExchange dispatch + combine, an all-reduce replayed in a CUDA graph) runs on the same data over both, and
the NVSHMEM results must equal the P2P ones bit for bit (same algorithms, same grids); all_reduce
max and all_gather also equal torch.distributed's exactly. Also: the context carries backend
kind NVSHMEM, a peer's copy of a tensor reads through `peer_tensor`, and `heap.check()` stays clean.

Then simulated nodes: a third heap with `node_size=world // 2` (4 GPUs as 2 nodes of 2, 2 as 2 of
1) runs the hierarchical collectives over NVSHMEM (`Nodes`): all-reduce and reduce-scatter
exact against torch.distributed for max and for sums of small integers, within the dtype's
tolerance for random sums, the all-reduce bitwise equal on every rank and replayed in a CUDA
graph; all-gather, all-to-all, all_to_all_v (random counts, rows of 14 B to 14 KiB, and over
capacity), broadcast and reduce (kernels of their own for all-to-all, broadcast and reduce)
exactly torch.distributed's; 1000 hierarchical barriers and signals to every rank return OK;
MoeExchange (bf16 and fp8, uniform and skewed) bitwise the same layer's on a one-node P2P heap;
all_reduce_rmsnorm and matmul_all_reduce against the same ops on that heap (bitwise with nodes
of one rank); all_gather_matmul and matmul_reduce_scatter by their "kernel" and "collective"
methods against the same on that heap; the tile all-gather (tiles matched by index, blocks
stacked and interleaved), all-reduce and reduce-scatter exactly torch.distributed's; other nodes' peer tensors are refused.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

import ironlink
from ironlink.language import _abi
from ironlink.runtime import tuning

from _cases import Cases, heap_timeout_s, small  # tests/gpu/workers/, the script's own directory
from _nvshmem_common import HEAP_BYTES, backend_kind, data, raises_ironlink, same_moe_layer
from _nvshmem_nodes import Nodes, reference_heap_bytes


class Suite(Cases):
    def __init__(self, nvshmem: Any, p2p: Any) -> None:
        super().__init__()
        self.nv, self.p2p = nvshmem, p2p
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def both(self, inputs: list[Any], call: Callable[[Any, list[Any]], list[Any]]) -> None:
        """Copies `inputs` (plain tensors) into each heap, runs `call(heap, heap_inputs)` on each and
        asserts the tensors it returns are bitwise equal between the heaps. Frees in `finally`,
        newest first, so allocation order stays the same on every rank after a failed case."""
        results = []
        for heap in (self.nv, self.p2p):
            ts = [heap.empty(t.shape, t.dtype).copy_(t) for t in inputs]
            try:
                results.append([r.clone() for r in call(heap, ts)])
                heap.check()
            finally:
                for t in reversed(ts):
                    heap.free(t)
        for i, (a, b) in enumerate(zip(*results)):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (
                f"output {i}: NVSHMEM heap differs from P2P heap (max abs diff "
                f"{(a.double() - b.double()).abs().max().item()})")

    # --- cases -------------------------------------------------------------------------------
    def context_kind(self) -> None:
        assert self.nv.backend == "nvshmem" and self.p2p.backend == "p2p"
        assert backend_kind(self.nv) == _abi.BACKEND["NVSHMEM"], "backend kind in the context"

    def peer_tensor(self) -> None:
        x = self.nv.empty((1000,), torch.float32)
        try:
            x.fill_(float(self.rank))
            self.nv.barrier()
            for r in range(self.world):
                assert torch.equal(self.nv.peer_tensor(x, r), torch.full_like(x, float(r))), f"rank {r}'s copy"
            self.nv.barrier()
        finally:
            self.nv.free(x)

    def all_reduce(self, n: int, dtype: Any, op: str) -> None:
        x = data(n, dtype)
        self.both([x], lambda h, ts: [ironlink.all_reduce(ts[0], op=op, heap=h, check=True)])
        if op == "max":  # exact: equal to NCCL's
            y = self.nv.empty((n,), dtype).copy_(x)
            try:
                ref = x.clone()
                dist.all_reduce(ref, op=dist.ReduceOp.MAX)
                ironlink.all_reduce(y, op="max", heap=self.nv, check=True)
                assert torch.equal(y, ref), "all_reduce max differs from torch.distributed"
            finally:
                self.nv.free(y)

    def forced(self, alg: str, n: int) -> None:
        """One all-reduce algorithm, forced through the limits on both heaps."""
        old_nv, old_p2p = self.nv.algorithm_limits, self.p2p.algorithm_limits
        self.nv.set_algorithm_limits(*tuning.FORCED_LIMITS[alg])
        self.p2p.set_algorithm_limits(*tuning.FORCED_LIMITS[alg])
        try:
            self.all_reduce(n, torch.bfloat16, "sum")
        finally:
            self.nv.set_algorithm_limits(*old_nv)
            self.p2p.set_algorithm_limits(*old_p2p)

    def all_gather(self, n: int, dtype: Any) -> None:
        x = data(n, dtype)
        out = torch.empty(self.world * n, dtype=dtype, device="cuda")

        def call(h: Any, ts: list[Any]) -> list[Any]:
            ironlink.all_gather(ts[1], ts[0], heap=h, check=True)
            return [ts[1]]

        self.both([x, out], call)
        ref = torch.empty_like(out)
        dist.all_gather_into_tensor(ref, x)
        y, o = self.nv.empty((n,), dtype).copy_(x), self.nv.empty((self.world * n,), dtype)
        try:
            ironlink.all_gather(o, y, heap=self.nv, check=True)
            assert torch.equal(o, ref), "all_gather differs from torch.distributed"
        finally:
            self.nv.free(o)
            self.nv.free(y)

    def reduce_scatter(self, n: int, dtype: Any) -> None:
        full, out = data(self.world * n, dtype), torch.empty(n, dtype=dtype, device="cuda")

        def call(h: Any, ts: list[Any]) -> list[Any]:
            ironlink.reduce_scatter(ts[1], ts[0], op="sum", heap=h, check=True)
            return [ts[1]]

        self.both([full, out], call)

    def all_to_all_v(self, row: int) -> None:
        g = torch.Generator().manual_seed(7)  # the same counts matrix on every rank
        counts = torch.randint(0, 9, (self.world, self.world), generator=g)
        mine = counts[self.rank].to(torch.int64).cuda()
        # Every rank allocates the same sizes (heap offsets must match: the peers read `mine` at
        # this rank's offset), so the input holds the most rows any rank sends.
        rows_in = int(counts.sum(1).max())
        x = data(max(rows_in, 1) * row, torch.bfloat16).view(-1, row)
        out = torch.zeros(int(counts.sum(0).max()) + 1, row, dtype=torch.bfloat16, device="cuda")

        def call(h: Any, ts: list[Any]) -> list[Any]:
            o, rc, ro = ironlink.all_to_all_v(ts[0], ts[1], ts[2], heap=h, check=True)
            res = [o, rc.clone(), ro.clone()]
            h.free(ro)
            h.free(rc)
            return res

        self.both([x, mine, out], call)

    def rmsnorm(self, tokens: int, hidden: int) -> None:
        x, res = data(tokens * hidden, torch.bfloat16), data(tokens * hidden, torch.bfloat16)
        w = data(hidden, torch.bfloat16)

        def call(h: Any, ts: list[Any]) -> list[Any]:
            xs, rs = ts[0].view(tokens, hidden), ts[1].view(tokens, hidden)
            out, r = ironlink.all_reduce_rmsnorm(xs, rs, w, heap=h, check=True)
            return [out, r]

        self.both([x, res], call)

    def matmul_all_reduce(self, m: int) -> None:
        a, b = data(m * 512, torch.bfloat16).view(m, 512), data(512 * 1024, torch.bfloat16).view(512, 1024)
        out = torch.empty(m, 1024, dtype=torch.bfloat16, device="cuda")

        def call(h: Any, ts: list[Any]) -> list[Any]:
            return [ironlink.matmul_all_reduce(a, b, out=ts[0], heap=h, check=True)]

        self.both([out], call)

    def moe(self, tokens: int, skewed: bool, fp8: bool) -> None:
        same_moe_layer(self.nv, self.p2p, tokens, skewed, 3, fp8)

    def cuda_graph(self, n: int) -> None:
        """An all-reduce captured once and replayed over changing data, on both heaps."""
        inputs = [data(n, torch.bfloat16) for _ in range(3)]

        def call(h: Any, ts: list[Any]) -> list[Any]:
            buf = ts[0]
            ironlink.all_reduce(buf, heap=h)  # runs once outside capture (status buffer, kernel)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                ironlink.all_reduce(buf, heap=h)
            outs = []
            for t in inputs:
                buf.copy_(t)
                g.replay()
                torch.cuda.synchronize()
                outs.append(buf.clone())
            return outs

        self.both([inputs[0]], call)


def simulated_nodes(t0: float) -> int:
    """The `Nodes` cases on a fresh heap of `world // 2` ranks per node; their exit code."""
    world = dist.get_world_size()
    heap = ironlink.SymmetricHeap(HEAP_BYTES, backend="nvshmem", node_size=world // 2, timeout_s=heap_timeout_s())
    p2p = ironlink.SymmetricHeap(reference_heap_bytes(world), timeout_s=heap_timeout_s())
    s = Nodes(heap, p2p)
    s.run("context carries kind NVSHMEM_MULTI_NODE", s.context_kind)
    for dtype in (torch.bfloat16, torch.float32):
        esize = torch.tensor([], dtype=dtype).element_size()
        for nbytes in small((1 << 10, 64 << 10, 1 << 20, 16 << 20), (1 << 10, 1 << 20)):
            n = nbytes // esize
            s.run(f"nodes: all_reduce sum {dtype} {nbytes} B (integers)", lambda: s.all_reduce(n, dtype, "sum", True))
            s.run(f"nodes: all_reduce sum {dtype} {nbytes} B", lambda: s.all_reduce(n, dtype, "sum", False))
            s.run(f"nodes: all_reduce max {dtype} {nbytes} B", lambda: s.all_reduce(n, dtype, "max", False))
        s.run(f"nodes: all_reduce sum {dtype} odd size", lambda: s.all_reduce(30001, dtype, "sum", False))
        for n in small((37, 30001, 1 << 20), (37, 30001)):
            s.run(f"nodes: reduce_scatter sum {dtype} {n} per rank (integers)",
                  lambda: s.reduce_scatter(n, dtype, "sum", True))
            s.run(f"nodes: reduce_scatter sum {dtype} {n} per rank", lambda: s.reduce_scatter(n, dtype, "sum", False))
            s.run(f"nodes: reduce_scatter max {dtype} {n} per rank", lambda: s.reduce_scatter(n, dtype, "max", False))
            s.run(f"nodes: all_gather {dtype} {n} per rank", lambda: s.all_gather(n, dtype))
            s.run(f"nodes: all_to_all {dtype} {n} per block", lambda: s.all_to_all(n, dtype))
    for row in (7, 64, 7168):  # 14 bytes (pieces end mid-unit), 128, 14 KiB
        s.run(f"nodes: all_to_all_v rows of {row} bf16", lambda: s.all_to_all_v(row, 11 + row))
    s.run("nodes: all_to_all_v over capacity", lambda: s.all_to_all_v(64, 5, over=True))
    for root in sorted({0, world - 1, world // 2}):
        for n in small((37, 300001), (37,)):
            s.run(f"nodes: broadcast and reduce, root {root}, {n} elements",
                  lambda: s.broadcast_and_reduce(n, root))
    s.run("nodes: 1000 hierarchical barriers in 8 CTAs", lambda: s.barriers(1000))
    s.run("nodes: signals to every rank of every node", s.signals)
    s.run("nodes: all_reduce in a CUDA graph", lambda: s.cuda_graph(300000))
    for tokens, skewed, fp8 in small(((1, False, False), (64, False, False), (64, True, False), (200, False, True)),
                                     ((64, True, False), (64, False, True))):
        s.run(f"nodes: MoeExchange {tokens} tokens{' skewed' if skewed else ''}{' fp8' if fp8 else ''}, "
              "bitwise the one-node layer's", lambda: s.moe(tokens, skewed, fp8))
    for tokens in small((1, 32, 1000), (1, 32)):
        s.run(f"nodes: all_reduce_rmsnorm {tokens}x4096", lambda: s.fused("rmsnorm", tokens))
        s.run(f"nodes: all_reduce_rmsnorm rows {tokens}x4096", lambda: s.fused("rmsnorm_rows", tokens))
    for m in small((16, 1000), (16,)):
        s.run(f"nodes: matmul_all_reduce M={m}", lambda: s.fused("matmul", m))
    for op in ("gather", "scatter"):
        for method in ("kernel", "collective"):
            for m in small((16, 1000), (16,)):
                name = "all_gather_matmul" if op == "gather" else "matmul_reduce_scatter"
                s.run(f"nodes: {name} ({method}) {m} rows per rank",
                      lambda: s.sequence_parallel(op, m, method))
    for rows, cols in small(((40, 300), (1, 1000)), ((40, 300),)):
        for interleaved in (False, True):
            s.run(f"nodes: tile all_gather {rows}x{cols} blocks{' interleaved' if interleaved else ''}",
                  lambda: s.tile_gathers(rows, cols, interleaved))
    for dtype in (torch.bfloat16, torch.float32):
        for scatter in (False, True):
            name = "reduce_scatter" if scatter else "all_reduce"
            for rows, cols in small(((70, 300), (1, 4000)), ((70, 300),)):
                s.run(f"nodes: tile {name} {dtype} {rows}x{cols}", lambda: s.tile_reductions(rows, cols, dtype, scatter))
    s.run("nodes: other nodes' peer tensors are refused", s.other_nodes_refused)
    s.run("nodes: heap.check() is clean", heap.check)
    p2p.close()
    heap.close()
    return s.report(f"nvshmem as simulated nodes of {world // 2}", world, t0)


def main() -> int:
    if not torch.cuda.is_available() or "RANK" not in os.environ:
        print("== nvshmem: skipped (no CUDA GPU, or not under torchrun) ==", flush=True)
        return 0
    import torch.distributed._symmetric_memory as symm_mem

    if not symm_mem.is_nvshmem_available():
        print("== nvshmem: skipped (this torch has no NVSHMEM symmetric memory) ==", flush=True)
        return 0
    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        with raises_ironlink("at least 2 ranks"):
            ironlink.SymmetricHeap(HEAP_BYTES, backend="nvshmem")
        print("== nvshmem world 1: skipped (PyTorch's NVSHMEM memory needs 2 ranks; the refusal was checked) ==")
        dist.destroy_process_group()
        return 0
    torch.manual_seed(1900 + rank)
    t0 = time.time()
    nv = ironlink.SymmetricHeap(HEAP_BYTES, backend="nvshmem", timeout_s=heap_timeout_s())
    p2p = ironlink.SymmetricHeap(HEAP_BYTES, timeout_s=heap_timeout_s())
    s = Suite(nv, p2p)
    s.run("context carries backend kind NVSHMEM", s.context_kind)
    s.run("peer_tensor reads every rank's copy", s.peer_tensor)
    for alg in small(("one_shot_ll", "two_shot_ll", "two_shot"), ("one_shot_ll", "two_shot")):
        s.run(f"all_reduce forced {alg}", lambda: s.forced(alg, 40000))
    for dtype in (torch.bfloat16, torch.float32):
        esize = torch.tensor([], dtype=dtype).element_size()
        for nbytes in small((1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20), (1 << 10, 1 << 20)):
            n = nbytes // esize
            for op in ("sum", "max"):
                s.run(f"all_reduce {op} {dtype} {nbytes} B", lambda: s.all_reduce(n, dtype, op))
            per = n // world
            s.run(f"all_gather {dtype} {per * world * esize} B", lambda: s.all_gather(per, dtype))
            s.run(f"reduce_scatter {dtype} {per * world * esize} B", lambda: s.reduce_scatter(per, dtype))
        s.run(f"all_reduce sum {dtype} odd size", lambda: s.all_reduce(30001, dtype, "sum"))
    for row in small((7, 4096), (7,)):
        s.run(f"all_to_all_v row {row}", lambda: s.all_to_all_v(row))
    for tokens in small((1, 32, 512), (1, 32)):
        s.run(f"all_reduce_rmsnorm {tokens}x4096", lambda: s.rmsnorm(tokens, 4096))
    for m in small((16, 1000), (16,)):
        s.run(f"matmul_all_reduce M={m}", lambda: s.matmul_all_reduce(m))
    for tokens, skewed, fp8 in small(((64, False, False), (64, True, False), (200, False, True)), ((64, True, True),)):
        s.run(f"MoeExchange {tokens} tokens{' skewed' if skewed else ''}{' fp8' if fp8 else ''}",
              lambda: s.moe(tokens, skewed, fp8))
    s.run("all_reduce in a CUDA graph", lambda: s.cuda_graph(300000))
    s.run("heap.check() is clean", nv.check)
    p2p.close()
    nv.close()
    code = s.report("nvshmem", world, t0)
    code = simulated_nodes(time.time()) or code
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
