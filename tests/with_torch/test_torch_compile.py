"""torch.compile(fullgraph=True) of ironlink's public functions on the CPU: a tensor-parallel
block and every other public function compile with no graph break and no recompilation, and
give what the eager functions give; the forms that would allocate are refused while tracing.
Needs torch (skipped without it, as in CI).

No GPU: the heap and the eager functions are the CPU stand-ins of _torch_stand_ins.py; the
compiled results are compared with the stand-ins called directly
(tests/gpu/workers/compile_worker.py checks the real ones against eager).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")

import ironlink  # noqa: E402
from ironlink.fused import torch_library as fused_lib  # noqa: E402,F401 - registers the fused operators
from ironlink.ops import torch_library as ops_lib  # noqa: E402
from ironlink.runtime import handles  # noqa: E402

from _torch_stand_ins import (WORLD, FakeHeap, StandInExchange, StandInHeap, StandIns,  # noqa: E402
                              graph_breaks, installed, rmsnorm)


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIns]:
    yield from installed(monkeypatch)


class TensorParallelBlock(torch.nn.Module):
    """Column-parallel linear, ReLU, row-parallel linear into a heap tensor + all_reduce_rmsnorm,
    matmul_all_reduce, then an MoE layer: the block of tests/gpu/workers/compile_worker.py, on the CPU."""

    def __init__(self, heap: FakeHeap, tokens: int = 4, hidden: int = 16, ffn: int = 8) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        dt = torch.bfloat16
        self.heap = heap
        self.w_col = torch.nn.Parameter(torch.randn(hidden, ffn, generator=g).to(dt), requires_grad=False)
        self.w_row = torch.nn.Parameter(torch.randn(ffn, hidden, generator=g).to(dt), requires_grad=False)
        self.w_mar = torch.nn.Parameter(torch.randn(hidden, hidden, generator=g).to(dt), requires_grad=False)
        self.norm = torch.nn.Parameter(torch.rand(hidden, generator=g).to(dt), requires_grad=False)
        self.partial = heap.empty((tokens, hidden), dt)
        self.mar_out = heap.empty((tokens, hidden), dt)
        self.moe = StandInExchange(StandInHeap(), max_tokens=tokens, hidden=hidden, topk=2, num_experts=4, path="relay")

    def forward(self, x: Any, residual: Any, topk_idx: Any, topk_w: Any) -> Any:
        h = torch.relu(x @ self.w_col)
        torch.mm(h, self.w_row, out=self.partial)
        normed, residual = ironlink.all_reduce_rmsnorm(self.partial, residual, self.norm, heap=self.heap)
        y = ironlink.matmul_all_reduce(normed, self.w_mar, out=self.mar_out, heap=self.heap)
        recv, counts, offsets, handle = self.moe.dispatch(y, topk_idx, topk_w)
        experts = recv * 3
        return self.moe.combine(experts, handle), residual, counts


def block_inputs(tokens: int = 4, hidden: int = 16) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(tokens, hidden, generator=g).to(torch.bfloat16),
            torch.randn(tokens, hidden, generator=g).to(torch.bfloat16),
            torch.randint(0, 4, (tokens, 2), generator=g), torch.rand(tokens, 2, generator=g))


def block_reference(m: TensorParallelBlock, s: StandIns, x: Any, residual: Any, idx: Any, w: Any) -> tuple[Any, ...]:
    """The block with the stand-ins called directly (what eager would compute)."""
    partial = (torch.relu(x @ m.w_col) @ m.w_row) * WORLD
    residual = partial + residual
    y = (rmsnorm(residual, m.norm, 1e-6) @ m.w_mar) * WORLD
    counts = torch.zeros(m.moe.local_experts, dtype=torch.int64)
    counts[0] = x.shape[0]
    return (y * 3 * 2)[:x.shape[0]], residual, counts


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_tensor_parallel_block_compiles_without_graph_breaks(stand_ins: StandIns, backend: str) -> None:
    m = TensorParallelBlock(FakeHeap())
    args = block_inputs()
    expected = block_reference(m, stand_ins, *[a.clone() for a in args])
    compiled = torch.compile(m, fullgraph=True, backend=backend)
    for _ in range(3):
        got = compiled(*[a.clone() for a in args])
        for g, e in zip(got, expected):
            assert torch.equal(g, e)
    assert graph_breaks() == 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # no recompilation between calls
    # Every op ran on heap tensors: in place where Inductor kept the heap tensor, else staged.
    assert stand_ins.not_in_heap == []
    # Tensors reached through the module's attributes, the MoeExchange's included, are static
    # inputs: CUDA graphs (mode="reduce-overhead") accept their mutation and keep their addresses.
    for t in (m.partial, m.mar_out, m.moe.recv_x, m.moe.recv_scales):
        assert getattr(t, "_dynamo_static_input_type", None) is not None


class Collectives(torch.nn.Module):
    """Every other public function, with the argument forms the block leaves out."""

    def __init__(self, heap: FakeHeap, n: int = 8) -> None:
        super().__init__()
        self.heap = heap
        self.buf = heap.empty((n,))
        self.big = heap.empty((WORLD * n,))
        self.small = heap.empty((n,))
        self.rows_in, self.rows_out = heap.empty((3, 4)), heap.empty((2 * 3, 4))
        self.send_counts = heap.empty((WORLD,), torch.int64)
        self.recv_counts, self.recv_offsets = heap.empty((WORLD,), torch.int64), heap.empty((WORLD,), torch.int64)
        self.a_full = heap.empty((WORLD * 2, 3), torch.bfloat16)
        self.x = heap.empty((2, 8))

    def forward(self, v: Any, shard: Any, b: Any, res: Any, w: Any) -> tuple[Any, ...]:
        self.buf.copy_(v)
        ironlink.all_reduce(self.buf, op="max")  # heap found from the tensor when the graph runs: no handle
        ironlink.all_gather(self.big, self.buf, heap=self.heap)
        ironlink.reduce_scatter(self.small, self.big, op=ironlink.constants.REDUCE_OP_SUM, heap=self.heap)
        self.rows_in.fill_(1.0)
        self.send_counts.fill_(1)
        out, counts, offsets = ironlink.all_to_all_v(self.rows_in, self.send_counts, self.rows_out, self.recv_counts,
                                                     self.recv_offsets, heap=self.heap)
        a_full, prod = ironlink.all_gather_matmul(shard, b, self.heap, a_full=self.a_full,
                                                  config=ironlink.tuning.MatmulConfig(16, 16, 16, 1, 4, 2))
        rs = ironlink.matmul_reduce_scatter(a_full, b.t().contiguous(), self.heap)
        self.x.copy_(res)
        res_out = torch.empty_like(res)
        normed, r2 = ironlink.all_reduce_rmsnorm(self.x, res, w, out=self.x, residual_out=res_out, heap=self.heap)
        return self.small + 0, out + 0, counts + 0, offsets + 0, prod, rs, normed + 0, r2, res


def test_every_public_function_compiles_fullgraph(stand_ins: StandIns) -> None:
    heap = FakeHeap()
    m = Collectives(heap)
    # all_reduce without heap= finds the heap when the graph runs: among the live SymmetricHeaps,
    # which this FakeHeap is not; the stand-in is given it here instead.
    real_heap_of = ops_lib.heap_of
    g = torch.Generator().manual_seed(2)
    args = (torch.randn(8, generator=g), torch.randn(2, 3, generator=g).to(torch.bfloat16),
            torch.randn(3, 3, generator=g).to(torch.bfloat16), torch.randn(2, 8, generator=g),
            torch.rand(8, generator=g))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops_lib, "heap_of", lambda h, t, op: heap if h == handles.NO_HANDLE else real_heap_of(h, t, op))
        got = torch.compile(m, fullgraph=True, backend="aot_eager")(*[a.clone() for a in args])
    v, shard, b, res, w = args
    small = (v * WORLD).repeat(WORLD)[:8] * WORLD
    a_full = shard.repeat(WORLD, 1)
    prod = a_full @ b
    rs = ((a_full @ b.t().contiguous()) * WORLD)[:2]
    r2 = res * WORLD + res
    rows_out = torch.cat([torch.ones(3, 4), torch.zeros(3, 4)])  # the stand-in's 3 rows, then untouched zeros
    expected = (small, rows_out, torch.ones(WORLD, dtype=torch.int64), torch.arange(WORLD), prod, rs,
                rmsnorm(r2, w, 1e-6), r2, res)
    for i, (gv, e) in enumerate(zip(got, expected)):
        assert torch.equal(gv, e), i
    assert graph_breaks() == 0 and stand_ins.not_in_heap == []


def test_allocating_forms_are_refused_while_tracing(stand_ins: StandIns) -> None:
    heap = FakeHeap()

    def f(a: Any, b: Any) -> Any:
        return ironlink.matmul_all_reduce(a, b, heap=heap)  # out=None would allocate from the heap

    with pytest.raises(Exception, match="needs out= given"):
        torch.compile(f, fullgraph=True, backend="eager")(torch.ones(2, 2), torch.ones(2, 2))
