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

import contextlib
import os
import sys
import time
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

import ironlink
import triton.language as tl

import ironlink.language as il
import ironlink.typed as ilt
from ironlink.language import _abi
from ironlink.runtime import tuning

from _cases import (Cases, expert_rows, heap_timeout_s, moe_routing, moe_scaled_layer,  # tests/gpu/workers/, the script's own directory
                    same_on_all_ranks, small)

HEAP_BYTES = 160 << 20


@ironlink.jit(nvshmem=True, several_nodes=True)
def _all_to_all_hierarchical_kernel(ctx, inp, out, n, status):
    tl.store(status + tl.program_id(0), ilt.all_to_all(ctx, inp, out, n))


@ironlink.jit(nvshmem=True, several_nodes=True)
def _barriers_kernel(ctx, rounds, status):
    s = il.symm_barrier(ctx)
    for _ in range(1, rounds):
        s = tl.minimum(s, il.symm_barrier(ctx))
    tl.store(status + tl.program_id(0), s)


@ironlink.jit(nvshmem=True, several_nodes=True)
def _broadcast_reduce_kernel(ctx, buf, inp, out, n, root, status):
    s = ilt.broadcast(ctx, buf, n, root)
    s = tl.minimum(s, ilt.reduce(ctx, inp, out, n, 0, root))  # 0: REDUCE_OP_SUM
    tl.store(status + tl.program_id(0), s)


@ironlink.jit(nvshmem=True, several_nodes=True)
def _tiles_kernel(ctx, inp, out, rows, cols, stride, bstride, rank, status, OP: tl.constexpr, TR: tl.constexpr,
                  TC: tl.constexpr):
    # Every TR x TC tile of a rows x cols matrix (rows `stride` apart), rank r running tile t on CTA
    # (t + r) % grid, so only matching by tile index pairs the calls: OP "all_gather" (in place in
    # `inp`'s world blocks, `bstride` apart), "all_reduce" (in place in `inp`), "reduce_scatter"
    # (`inp`'s world blocks into `out`).
    pid, grid = tl.program_id(0), tl.num_programs(0)
    tiles_c = tl.cdiv(cols, TC)
    worst = pid * 0
    for t in range(0, tl.cdiv(rows, TR) * tiles_c):
        if (t + rank) % grid == pid:
            i0, j0 = (t // tiles_c) * TR, (t % tiles_c) * TC
            r, c, at = tl.minimum(TR, rows - i0), tl.minimum(TC, cols - j0), i0 * stride + j0
            if OP == "all_gather":
                s = ilt.tile_all_gather(ctx, inp + at, r, c, stride, bstride, t)
            elif OP == "all_reduce":
                s = ilt.tile_all_reduce(ctx, inp + at, r, c, stride, t)
            else:
                s = ilt.tile_reduce_scatter(ctx, inp + at, out + at, r, c, stride, bstride, t)
            worst = ilt.failure_or(s, worst)
    tl.store(status + pid, worst)


@ironlink.jit(nvshmem=True)
def _signals_kernel(ctx, world, rank, slot, status):
    # Every other rank's slot + 1 (over NVSHMEM for ranks of the other node), then wait for ours.
    s = il.symm_signal(ctx, slot, 1, 1, (rank + 1) % world)  # 1: SIGNAL_OP_ADD
    for k in range(2, world):
        s = tl.minimum(s, il.symm_signal(ctx, slot, 1, 1, (rank + k) % world))
    s = tl.minimum(s, il.symm_signal_wait(ctx, slot, 4, world - 1))  # 4: CMP_GE
    tl.store(status, s)


def backend_kind(heap: Any) -> int:
    """The backend field of the context the heap wrote to the device."""
    off, size = _abi.CONTEXT_FIELDS["backend"]
    return int.from_bytes(bytes(heap._open().read_context())[off:off + size], "little")


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

    @staticmethod
    def data(n: int, dtype: Any) -> Any:
        return (torch.randn(n, device="cuda") * 2).to(dtype)

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
        x = self.data(n, dtype)
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
        x = self.data(n, dtype)
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
        full, out = self.data(self.world * n, dtype), torch.empty(n, dtype=dtype, device="cuda")

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
        x = self.data(max(rows_in, 1) * row, torch.bfloat16).view(-1, row)
        out = torch.zeros(int(counts.sum(0).max()) + 1, row, dtype=torch.bfloat16, device="cuda")

        def call(h: Any, ts: list[Any]) -> list[Any]:
            o, rc, ro = ironlink.all_to_all_v(ts[0], ts[1], ts[2], heap=h, check=True)
            res = [o, rc.clone(), ro.clone()]
            h.free(ro)
            h.free(rc)
            return res

        self.both([x, mine, out], call)

    def rmsnorm(self, tokens: int, hidden: int) -> None:
        x, res = self.data(tokens * hidden, torch.bfloat16), self.data(tokens * hidden, torch.bfloat16)
        w = self.data(hidden, torch.bfloat16)

        def call(h: Any, ts: list[Any]) -> list[Any]:
            xs, rs = ts[0].view(tokens, hidden), ts[1].view(tokens, hidden)
            out, r = ironlink.all_reduce_rmsnorm(xs, rs, w, heap=h, check=True)
            return [out, r]

        self.both([x, res], call)

    def matmul_all_reduce(self, m: int) -> None:
        a, b = self.data(m * 512, torch.bfloat16).view(m, 512), self.data(512 * 1024, torch.bfloat16).view(512, 1024)
        out = torch.empty(m, 1024, dtype=torch.bfloat16, device="cuda")

        def call(h: Any, ts: list[Any]) -> list[Any]:
            return [ironlink.matmul_all_reduce(a, b, out=ts[0], heap=h, check=True)]

        self.both([out], call)

    def moe(self, tokens: int, skewed: bool, fp8: bool) -> None:
        same_moe_layer(self.nv, self.p2p, tokens, skewed, 3, fp8)

    def cuda_graph(self, n: int) -> None:
        """An all-reduce captured once and replayed over changing data, on both heaps."""
        inputs = [self.data(n, torch.bfloat16) for _ in range(3)]

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


class Nodes(Cases):
    """The hierarchical collectives on a heap of simulated nodes."""

    def __init__(self, heap: Any, p2p: Any) -> None:
        super().__init__()
        self.h, self.p2p = heap, p2p  # p2p: one-node references (MoE)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def context_kind(self) -> None:
        assert self.h.multi_node and self.h.node_size == self.world // 2
        assert backend_kind(self.h) == _abi.BACKEND["NVSHMEM_MULTI_NODE"], "backend kind in the context"

    def all_reduce(self, n: int, dtype: Any, op: str, integers: bool) -> None:
        x = torch.randint(-4, 5, (n,), device="cuda").to(dtype) if integers else Suite.data(n, dtype)
        y = self.h.empty((n,), dtype).copy_(x)
        try:
            ironlink.all_reduce(y, op=op, heap=self.h, check=True)
            same_on_all_ranks(y)
            ref, size = x.double(), x.double().abs()
            dist.all_reduce(ref, op=REDUCE_OPS[op])
            dist.all_reduce(size)
            like_reference(y, ref, exact=integers or op == "max", size=size)
        finally:
            self.h.free(y)

    def reduce_scatter(self, n: int, dtype: Any, op: str, integers: bool) -> None:
        x = (torch.randint(-4, 5, (self.world * n,), device="cuda").to(dtype) if integers
             else Suite.data(self.world * n, dtype))
        inp, out = self.h.empty(x.shape, dtype).copy_(x), self.h.empty((n,), dtype)
        try:
            ironlink.reduce_scatter(out, inp, op=op, heap=self.h, check=True)
            ref, size = (torch.empty((n,), dtype=torch.float64, device="cuda") for _ in range(2))
            dist.reduce_scatter_tensor(ref, x.double(), op=REDUCE_OPS[op])
            dist.reduce_scatter_tensor(size, x.double().abs())
            like_reference(out, ref, exact=integers or op == "max", size=size)
        finally:
            self.h.free(out)
            self.h.free(inp)

    def all_gather(self, n: int, dtype: Any) -> None:
        x = Suite.data(n, dtype)
        inp, out = self.h.empty((n,), dtype).copy_(x), self.h.empty((self.world * n,), dtype)
        try:
            ironlink.all_gather(out, inp, heap=self.h, check=True)
            ref = torch.empty((self.world * n,), dtype=dtype, device="cuda")
            dist.all_gather_into_tensor(ref, x)
            assert torch.equal(out, ref), "not torch.distributed's all_gather"
        finally:
            self.h.free(out)
            self.h.free(inp)

    def all_to_all(self, n: int, dtype: Any) -> None:
        x = Suite.data(self.world * n, dtype)
        inp, out = self.h.empty(x.shape, dtype).copy_(x), self.h.empty(x.shape, dtype)
        try:
            launch_ok(_all_to_all_hierarchical_kernel, 4, 8, self.h.ctx, inp, out, n)
            ref = torch.empty_like(x)
            dist.all_to_all_single(ref, x)
            assert torch.equal(out, ref), "not torch.distributed's all_to_all"
        finally:
            self.h.free(out)
            self.h.free(inp)

    def all_to_all_v(self, row: int, seed: int, over: bool = False) -> None:
        """ironlink.all_to_all_v (hierarchical here) with a random count matrix, some counts 0,
        against torch.distributed's all_to_all_single with the same splits; with `over`, one
        rank's output one row short of what it receives: CAPACITY_EXCEEDED, counts still written."""
        g = torch.Generator().manual_seed(seed)  # the same counts matrix on every rank
        counts = torch.randint(0, 9, (self.world, self.world), generator=g)
        counts[counts < 3] = 0
        counts[0, -1] = 37  # skewed: several rounds across nodes
        rows_in, rows_out = int(counts.sum(1).max()), int(counts.sum(0).max())
        x = Suite.data(rows_in * row, torch.bfloat16).view(rows_in, row)
        # Equal sizes on every rank (heap offsets must match).
        inp = self.h.empty((rows_in, row), torch.bfloat16).copy_(x)
        out = self.h.empty((rows_out - 1 if over else rows_out + 1, row), torch.bfloat16).fill_(float("nan"))
        send = self.h.empty((self.world,), torch.int64).copy_(counts[self.rank])
        rc, ro = self.h.empty((self.world,), torch.int64), self.h.empty((self.world,), torch.int64)
        try:
            recv = counts[:, self.rank]
            if over:
                with raises_ironlink("CAPACITY_EXCEEDED"):
                    ironlink.all_to_all_v(inp, send, out, rc, ro, heap=self.h, check=True)
                with raises_ironlink("CAPACITY_EXCEEDED"):
                    self.h.check()  # it was recorded too (and is cleared here)
                assert rc.tolist() == recv.tolist(), "receive counts after CAPACITY_EXCEEDED"
                return
            ironlink.all_to_all_v(inp, send, out, rc, ro, heap=self.h, check=True)
            ref = torch.empty(int(recv.sum()), row, dtype=torch.bfloat16, device="cuda")
            sent = int(counts[self.rank].sum())
            dist.all_to_all_single(ref, x[:sent].contiguous(), recv.tolist(), counts[self.rank].tolist())
            assert rc.tolist() == recv.tolist(), f"receive counts {rc.tolist()} != {recv.tolist()}"
            assert ro.tolist() == (torch.cumsum(recv, 0) - recv).tolist(), "receive offsets"
            assert torch.equal(out[:ref.shape[0]], ref), "rows not torch.distributed's all_to_all_single"
        finally:
            for t in (ro, rc, send, out, inp):
                self.h.free(t)

    def broadcast_and_reduce(self, n: int, root: int) -> None:
        """A kernel's hierarchical broadcast (every buffer = the root's) and reduce of small
        integers to the root (exactly torch.distributed's sum)."""
        x = torch.randint(-4, 5, (n,), device="cuda").to(torch.bfloat16)
        buf, inp = self.h.empty((n,), torch.bfloat16).copy_(x), self.h.empty((n,), torch.bfloat16).copy_(x)
        out = self.h.zeros((n,), torch.bfloat16)
        try:
            launch_ok(_broadcast_reduce_kernel, 4, 8, self.h.ctx, buf, inp, out, n, root)
            want = x.clone()
            dist.broadcast(want, root)
            assert torch.equal(buf, want), "broadcast: not the root's buffer"
            total = x.double()
            dist.all_reduce(total)
            if self.rank == root:
                assert torch.equal(out.double(), total), "reduce: not torch.distributed's sum"
            else:
                assert torch.equal(out, torch.zeros_like(out)), "reduce wrote a non-root output"
        finally:
            self.h.free(out)
            self.h.free(inp)
            self.h.free(buf)

    def signals(self) -> None:
        """symm_signal to every other rank (another node's over NVSHMEM), symm_signal_wait with
        the context's timeout; the slot then holds world - 1 on every rank."""
        launch_ok(_signals_kernel, 1, 4, self.h.ctx, self.world, self.rank, 3)
        self.h.check()

    def barriers(self, rounds: int) -> None:
        launch_ok(_barriers_kernel, 8, 4, self.h.ctx, rounds)
        self.h.check()

    def cuda_graph(self, n: int) -> None:
        y = self.h.empty((n,), torch.float32)
        try:
            ironlink.all_reduce(y.fill_(1.0), heap=self.h)  # compile and warm up outside capture
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                ironlink.all_reduce(y, heap=self.h)
            for k in range(3):
                y.fill_(float(self.rank + k))
                g.replay()
                torch.cuda.synchronize()
                want = float(sum(r + k for r in range(self.world)))
                assert torch.equal(y, torch.full_like(y, want)), f"replay {k}"
            self.h.check()
        finally:
            self.h.free(y)

    def moe(self, tokens: int, skewed: bool, fp8: bool) -> None:
        """MoeExchange across nodes (its exchanges are the hierarchical all_to_all_v): every output
        bitwise that of the same layer on a one-node P2P heap."""
        same_moe_layer(self.h, self.p2p, tokens, skewed, 5, fp8)

    def fused(self, op: str, size: int) -> None:
        """all_reduce_rmsnorm ([size, 4096]; "rmsnorm_rows": mode "rows", its tile all-reduce across
        nodes) or matmul_all_reduce (M = size) across nodes: their grid barrier then the
        hierarchical all-reduce. Against the same op on a one-node P2P heap:
        bitwise with nodes of one rank (the same sums in rank order), within bf16 rounding of the
        node partials otherwise; bitwise the same on every rank."""
        if op.startswith("rmsnorm"):
            # The residual and the weight are replicated (as in tensor parallelism), so the outputs
            # are too; each rank's x differs.
            torch.manual_seed(76)
            res, w = Suite.data(size * 4096, torch.bfloat16).view(size, 4096), Suite.data(4096, torch.bfloat16)
            torch.manual_seed(77 + self.rank)
            x = Suite.data(size * 4096, torch.bfloat16).view(size, 4096)
            mode = "rows" if op == "rmsnorm_rows" else None  # the P2P heap picks its own

            def run(h: Any) -> list[Any]:
                xs = h.empty(x.shape, x.dtype).copy_(x)
                try:
                    m = mode if h is self.h else None
                    out, r = ironlink.all_reduce_rmsnorm(xs, res.clone(), w, heap=h, mode=m, check=True)
                    return [out.clone(), r]
                finally:
                    h.free(xs)
        else:
            torch.manual_seed(77 + self.rank)
            a = Suite.data(size * 512, torch.bfloat16).view(size, 512)
            b = Suite.data(512 * 1024, torch.bfloat16).view(512, 1024)

            def run(h: Any) -> list[Any]:
                out = h.empty((size, 1024), torch.bfloat16)
                try:
                    return [ironlink.matmul_all_reduce(a, b, out=out, heap=h, check=True).clone()]
                finally:
                    h.free(out)
        got, want = run(self.h), run(self.p2p)
        for g, r in zip(got, want):
            same_on_all_ranks(g)
            if self.h.node_size == 1:
                assert torch.equal(g, r), f"{op}: differs from the one-node result"
            else:  # node partials rounded to bf16: errors of a few ulps of the partials' size
                err = ((g.double() - r.double()).abs().max() / r.double().abs().max().clamp_min(1e-30)).item()
                assert err < 2e-2, f"{op}: max error {err} of the one-node result's largest value"
        self.h.check()

    def sequence_parallel(self, op: str, m: int, method: str) -> None:
        """all_gather_matmul (a_shard [m, 512]) or matmul_reduce_scatter (a [world * m, 512]) across
        nodes by `method` ("kernel": grid barriers around the hierarchical collective in one
        kernel; "collective": the hierarchical host op and a cuBLAS GEMM), against the same op by
        the same method on a one-node P2P heap: a_full and the gathered product bitwise (the same
        GEMM of the same rows) and the same on every rank; the scattered sums within bf16 rounding
        of the node partials."""
        torch.manual_seed(91)  # b: the same on every rank, so the gathered product is replicated
        b = Suite.data(512 * 768, torch.bfloat16).view(512, 768)
        torch.manual_seed(92 + self.rank)
        if op == "gather":
            a = Suite.data(m * 512, torch.bfloat16).view(m, 512)

            def run(h: Any) -> list[Any]:
                a_full = h.empty((self.world * m, 512), torch.bfloat16)
                try:
                    full, out = ironlink.all_gather_matmul(a, b, h, a_full=a_full, method=method, check=True)
                    return [full.clone(), out]
                finally:
                    h.free(a_full)
        else:
            a = Suite.data(self.world * m * 512, torch.bfloat16).view(self.world * m, 512)

            def run(h: Any) -> list[Any]:
                return [ironlink.matmul_reduce_scatter(a, b, h, method=method, check=True)]
        got, want = run(self.h), run(self.p2p)
        if op == "gather":
            assert torch.equal(got[0], want[0]), "a_full differs from the one-node gather"
            assert torch.equal(got[1], want[1]), "the product differs from the one-node op's"
            same_on_all_ranks(got[1])
        else:
            g, r = got[0].double(), want[0].double()
            err = ((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
            assert err < 2e-2, f"max error {err} of the one-node result's largest value"
        self.h.check()

    def tile_gathers(self, rows: int, cols: int, interleaved: bool) -> None:
        """symm_tile_all_gather_hierarchical over every 16 x 96 tile of [rows, cols] fp32 blocks
        (stacked, or side by side in one row stride), run by different CTAs on every rank, twice
        with new values: every block exactly its rank's, as torch.distributed gathers them."""
        w = self.world
        stride = w * cols + 8 if interleaved else cols + 8
        bstride = cols if interleaved else rows * stride
        buf = self.h.empty((w * bstride + rows * stride,), torch.float32)
        try:
            for launch in range(2):
                buf.fill_(-1.0)
                mine = buf[self.rank * bstride:].as_strided((rows, cols), (stride, 1))
                ids = torch.arange(rows * cols, device="cuda", dtype=torch.float32).view(rows, cols)
                mine.copy_(ids + 1e6 * (self.rank + 1) + 1e5 * launch)
                status = torch.full((8,), -1, dtype=torch.int32, device="cuda")
                _tiles_kernel[(8,)](self.h.ctx, buf, buf, rows, cols, stride, bstride, self.rank, status,
                                    OP="all_gather", TR=16, TC=96, num_warps=4)
                torch.cuda.synchronize()
                assert status.tolist() == [0] * 8, f"statuses {status.tolist()}"
                want = [torch.empty_like(ids) for _ in range(w)]
                dist.all_gather(want, mine.contiguous())
                for p in range(w):
                    got = buf[p * bstride:].as_strided((rows, cols), (stride, 1))
                    assert torch.equal(got, want[p]), f"block {p} is not rank {p}'s"
        finally:
            self.h.free(buf)
        self.h.check()

    def tile_reductions(self, rows: int, cols: int, dtype: Any, scatter: bool) -> None:
        """symm_tile_all_reduce_hierarchical (in place) or symm_tile_reduce_scatter_hierarchical
        (stacked blocks) over every 32 x 128 tile of [rows, cols] matrices with strided rows, run
        by different CTAs on every rank, twice with new data: sums of small integers, so exactly
        torch.distributed's (every partial exact), the all-reduce bitwise the same on every rank,
        the row gaps untouched."""
        w, stride = self.world, cols + 8
        blocks = w if scatter else 1
        inp = self.h.empty((blocks * rows * stride,), dtype)
        out = self.h.empty((rows * stride,), dtype)
        view = lambda t, p: t[p * rows * stride:].as_strided((rows, cols), (stride, 1))  # noqa: E731
        try:
            for launch in range(2):
                inp.fill_(7.0)
                out.fill_(7.0)
                x = torch.randint(-4, 5, (blocks, rows, cols), device="cuda").to(dtype)
                for p in range(blocks):
                    view(inp, p).copy_(x[p])
                status = torch.full((8,), -1, dtype=torch.int32, device="cuda")
                _tiles_kernel[(8,)](self.h.ctx, inp, out, rows, cols, stride, rows * stride, self.rank, status,
                                    OP="reduce_scatter" if scatter else "all_reduce", TR=32, TC=128, num_warps=4)
                torch.cuda.synchronize()
                assert status.tolist() == [0] * 8, f"statuses {status.tolist()}"
                want = x.double()
                dist.all_reduce(want)
                got = view(out, 0) if scatter else view(inp, 0)
                assert torch.equal(got.double(), want[self.rank] if scatter else want[0]), \
                    f"launch {launch}: not torch.distributed's sum"
                if not scatter:
                    same_on_all_ranks(got.contiguous())
                gaps = (out if scatter else inp)[:rows * stride].view(rows, stride)[:, cols:]
                assert torch.all(gaps == 7.0), "a row gap was written"
        finally:
            self.h.free(out)
            self.h.free(inp)
        self.h.check()

    def other_nodes_refused(self) -> None:
        x = self.h.empty((64 * self.world,), torch.float32)
        try:
            # A rank of another node has no address here; one of this node has.
            with raises_ironlink("no load/store address"):
                self.h.peer_tensor(x, (self.rank + self.h.node_size) % self.world)
            mate = self.rank // self.h.node_size * self.h.node_size
            assert self.h.peer_tensor(x, mate).shape == x.shape
        finally:
            self.h.free(x)


def moe_layer(heap: Any, tokens: int, skewed: bool, seed: int, fp8: bool = False) -> list[Any]:
    """One MoeExchange dispatch + combine on `heap` (routing from `seed`, the same on any heap):
    recv_x, expert counts and the combined output, cloned. Expert e of this rank scales its rows
    by (global expert id + 1) between the two. recv_x comes as its experts' rows sorted by their
    bits (`expert_rows`; an fp8 row's bytes followed by its scales' bytes) and without the
    offsets: the low-latency path (the default for few tokens on one node, bf16 or fp8) lays
    recv_x out by expert block, in an order that varies run to run, where the relay path (several
    nodes) packs it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden, k, experts = 256, 4, max(2 * world, 8)
    x, idx, wts = moe_routing(torch.Generator(device="cuda").manual_seed(seed * 100 + rank), tokens, hidden, experts, k,
                              skewed)
    moe = ironlink.MoeExchange(heap, tokens, hidden, k, experts,
                               dispatch_dtype=torch.float8_e4m3fn if fp8 else None)
    try:
        results = moe_scaled_layer(moe, x, idx, wts)
        assert int(results[-3].sum()) <= moe.capacity  # the expert counts
        if fp8:
            rows, scales, counts, offsets, out = results
            recv = torch.cat([rows.view(torch.uint8), scales.contiguous().view(torch.uint8)], 1)
        else:
            recv, counts, offsets, out = results
        return [torch.cat(expert_rows(recv, counts, offsets)), counts, out]
    finally:
        moe.close()


def same_moe_layer(heap: Any, ref: Any, tokens: int, skewed: bool, seed: int, fp8: bool) -> None:
    """`moe_layer` on `heap` equals it on the P2P heap `ref`, every output bit for bit."""
    got, want = (moe_layer(h, tokens, skewed, seed, fp8) for h in (heap, ref))
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"MoE output {i} differs from the P2P heap's"


def launch_ok(kernel: Any, ctas: int, warps: int, *args: Any) -> None:
    """Runs `kernel[(ctas,)](*args, status)`, each CTA storing its status, and asserts all are 0."""
    status = torch.full((ctas,), -1, dtype=torch.int32, device="cuda")
    kernel[(ctas,)](*args, status, num_warps=warps)
    torch.cuda.synchronize()
    assert status.tolist() == [0] * ctas, f"statuses {status.tolist()}"


REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def like_reference(got: Any, ref: Any, exact: bool, size: Optional[Any] = None) -> None:
    """`got` equals torch.distributed's float64 `ref` exactly, or within its dtype's tolerance of
    `size` (default |ref|). A hierarchical sum rounds each node's partial to the dtype before the
    sum across nodes, so its error scales with the partials, which cancellation can make far
    larger than the result: callers pass the sum of the inputs' magnitudes, which bounds them."""
    if exact:
        assert torch.equal(got.double(), ref), "not exactly torch.distributed's"
        return
    tol = 2e-2 if got.dtype == torch.bfloat16 else 1e-5
    scale = ref.abs() if size is None else size
    err = ((got.double() - ref).abs() / scale.clamp_min(1)).max().item()
    assert err < tol, f"relative error {err} vs the f64 reference"


def reference_heap_bytes(world: int) -> int:
    """The one-node P2P heap the `Nodes` cases compare against: 32 MiB for their tensors and the
    MoE layer, plus the workspaces of the fused cases' largest calls as the ops size them (each op
    keeps its own, so they add up). At world 4 all_reduce_rmsnorm's 1000 x 4096 alone takes 64 MiB;
    a fixed 32 MiB heap ran out there."""
    rmsnorm = ironlink.all_reduce_rmsnorm.heap_bytes(1000, 4096, world)
    matmul = ironlink.matmul_all_reduce.heap_bytes(1000, 1024, 512, world)
    gather = max(ironlink.all_gather_matmul.heap_bytes(world * 1000, 768, 512, world, method=m, a_full=True)
                 for m in ("kernel", "collective"))
    scatter = max(ironlink.matmul_reduce_scatter.heap_bytes(world * 1000, 768, 512, world, method=m)
                  for m in ("kernel", "collective"))
    return (32 << 20) + rmsnorm + matmul + gather + scatter


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


@contextlib.contextmanager
def raises_ironlink(words: str) -> Iterator[None]:
    """The block must raise IronlinkError with `words` in its message."""
    try:
        yield
    except ironlink.IronlinkError as e:
        assert words in str(e), str(e)
        return
    raise AssertionError(f"no IronlinkError naming {words!r}")


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
