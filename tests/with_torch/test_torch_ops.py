"""ironlink's PyTorch custom operators (`torch.ops.ironlink.*`) on the CPU: schemas and mutation
annotations, fake implementations, and torch.compile(fullgraph=True) of the public functions
with no graph break. Needs torch (skipped without it, as in CI).

No GPU: the heap is `FakeHeap` (tensors it made count as in the heap), and the eager functions
the operators call when the graph runs are replaced by CPU stand-ins that simulate two ranks
holding the same data (a sum over ranks doubles). The compiled results are compared with the
stand-ins called directly; tests/gpu/workers/compile_worker.py checks the real ones against eager.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

torch = pytest.importorskip("torch")

import ironlink  # noqa: E402
from ironlink.fused import torch_library as fused_lib  # noqa: E402,F401 - registers the fused operators
from ironlink.moe.exchange import MoeExchange  # noqa: E402
from ironlink.moe.layout import Layout  # noqa: E402
from ironlink.moe.relay import RelayPath  # noqa: E402
from ironlink.ops import torch_library as ops_lib  # noqa: E402
from ironlink.runtime import eager, handles  # noqa: E402
from ironlink.runtime.errors import IronlinkError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WORLD = 2


class FakeHeap:
    """What the operators read of a SymmetricHeap, on the CPU, for two simulated ranks."""

    def __init__(self) -> None:
        self.rank, self.device, self.closed, self.multi_node = 0, torch.device("cpu"), False, False
        self._handle = handles.register(self)
        self.tensors: list[Any] = []
        self.workspaces: dict[str, Any] = {}

    # Properties, as SymmetricHeap's: Dynamo reads them through their getters.
    @property
    def handle(self) -> int:
        return self._handle

    @property
    def world_size(self) -> int:
        return WORLD

    def empty(self, shape: Any, dtype: Any = None, at_top: bool = False) -> Any:
        t = torch.zeros(shape, dtype=dtype or torch.float32)
        self.tensors.append(t)
        return t

    def workspace(self, name: str, nbytes: int) -> Any:
        if name not in self.workspaces or self.workspaces[name].numel() < nbytes:
            self.workspaces[name] = self.empty((nbytes,), torch.uint8)
        return self.workspaces[name]

    def _local_offset(self, t: Any, what: str) -> tuple[int, int]:
        for h in self.tensors:
            base, size = h.data_ptr(), h.numel() * h.element_size()
            if base <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= base + size:
                return t.data_ptr() - base, size
        raise IronlinkError(f"{what}: not in the fake heap")

    def holds(self, t: Any) -> bool:
        try:
            self._local_offset(t, "")
        except IronlinkError:
            return False
        return True


# --- the CPU stand-ins of the eager functions (two ranks with the same data) ------------------------


def rmsnorm(r: Any, w: Any, eps: float) -> Any:
    rf = r.float()
    return (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(r.dtype)


class StandIns:
    """Replaces the eager functions the operators call; records which tensors were in the heap."""

    def __init__(self) -> None:
        self.not_in_heap: list[str] = []

    def need(self, heap: FakeHeap, name: str, *ts: Any) -> None:
        self.not_in_heap += [name for t in ts if not heap.holds(t)]

    def all_reduce(self, t: Any, op: Any = "sum", heap: Any = None, check: bool = False, pdl: Any = None,
                   config: Any = None) -> Any:
        self.need(heap, "all_reduce", t)
        return t.mul_(WORLD)

    def all_gather(self, out: Any, inp: Any, heap: Any = None, check: bool = False) -> Any:
        self.need(heap, "all_gather", out, inp)
        return out.copy_(inp.repeat(WORLD))

    def reduce_scatter(self, out: Any, inp: Any, op: Any = "sum", heap: Any = None, check: bool = False) -> Any:
        self.need(heap, "reduce_scatter", out, inp)
        return out.copy_(inp[:out.numel()] * WORLD)

    def all_to_all_v(self, inp: Any, send_counts: Any, out: Any, recv_counts: Any, recv_offsets: Any,
                     heap: Any = None, check: bool = False, ctas: Optional[int] = None) -> Any:
        self.need(heap, "all_to_all_v", inp, send_counts, out, recv_counts, recv_offsets)
        out[:inp.shape[0]] = inp
        recv_counts.copy_(send_counts)
        recv_offsets.copy_(torch.cumsum(send_counts, 0) - send_counts)
        return out, recv_counts, recv_offsets

    def all_reduce_rmsnorm(self, x: Any, residual: Any, weight: Any, eps: float = 1e-6, out: Any = None,
                           heap: Any = None, mode: Any = None, check: bool = False, residual_out: Any = None,
                           scale: Any = None, pdl: Any = None, config: Any = None) -> Any:
        self.need(heap, "all_reduce_rmsnorm", x)
        x.mul_(WORLD)
        r = residual if residual_out is None else residual_out
        r.copy_(x + residual)
        y = rmsnorm(r, weight, eps)
        if scale is not None:
            scale.copy_(y.float().abs().amax(-1))
        out.copy_(y)
        return out, r

    def matmul_all_reduce(self, a: Any, b: Any, out: Any = None, heap: Any = None, config: Any = None,
                          method: Any = None, check: bool = False, exchange: Any = None) -> Any:
        self.need(heap, "matmul_all_reduce", out)
        assert config is None or isinstance(config, ironlink.tuning.MatmulConfig)
        return out.copy_((a @ b) * WORLD)

    def all_gather_matmul(self, a_shard: Any, b: Any, heap: Any, a_full: Any = None, out: Any = None,
                          config: Any = None, check: bool = False, method: Any = None, exchange: Any = None) -> Any:
        self.need(heap, "all_gather_matmul", a_full)
        a_full.copy_(a_shard.repeat(WORLD, 1))
        out.copy_(a_full @ b)
        return a_full, out

    def matmul_reduce_scatter(self, a: Any, b: Any, heap: Any, out: Any = None, config: Any = None,
                              check: bool = False, method: Any = None, exchange: Any = None) -> Any:
        assert exchange is None or isinstance(exchange, ironlink.tuning.ScatterExchange)
        return out.copy_(((a @ b) * WORLD)[:out.shape[0]])


class StandInRelay(RelayPath):
    """The relay path of a StandInExchange, its steps torch on the CPU: every token goes to recv_x
    in token order, expert 0 gets them all, combine doubles them."""

    def pack(self, x: Any, idx: Any, weights: Any, t: int) -> Any:
        self._x = x
        return torch.arange(t).view(t, 1).expand(t, self.m.world).clone()

    def exchange(self, *args: Any) -> None:
        pass

    def place(self) -> Layout:
        m, t = self.m, self._x.shape[0]
        m.recv_x[:t] = self._x
        counts = torch.zeros(m.local_experts, dtype=torch.int64)
        counts[0] = t
        rows = m.world * m.max_tokens
        slot = torch.full((rows, m.topk), -1, dtype=torch.int64)
        return Layout(counts, torch.zeros_like(counts), slot, torch.ones(rows, m.topk), torch.tensor([t]))

    def reduce_here(self, y: Any, layout: Layout) -> None:
        self._y = y

    def sum_ranks(self, layout: Layout, t: int) -> Any:
        return self._y[:t] * 2


class StandInExchange(MoeExchange):
    """A MoeExchange of one simulated rank whose relay path (built with path="relay") is
    `StandInRelay`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.impl = StandInRelay(self, self.heap, self.config)


class StandInHeap(FakeHeap):
    """The heap MoeExchange takes (its allocations are plain CPU tensors)."""

    def free(self, t: Any) -> None:
        pass

    def check(self) -> None:
        pass


# The public functions the operators run, entered in runtime.eager by their modules.
EAGER = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all_v", "all_reduce_rmsnorm", "matmul_all_reduce",
         "all_gather_matmul", "matmul_reduce_scatter")


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIns]:
    s = StandIns()
    for name in EAGER:  # what the operators look up when they run
        monkeypatch.setitem(eager.FUNCTIONS, name, getattr(s, name))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield s
    torch._dynamo.reset()


def graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


# --- schemas and fake implementations -------------------------------------------------------------

MUTATED = {
    "all_reduce": {"t"},
    "all_gather": {"out"},
    "reduce_scatter": {"out"},
    "all_to_all_v": {"out", "recv_counts", "recv_offsets"},
    "all_reduce_rmsnorm": {"x", "residual", "out", "scale"},
    "all_reduce_rmsnorm_out": {"x", "residual_out", "out", "scale"},
    "matmul_all_reduce": {"out"},
    "all_gather_matmul": {"a_full", "out"},
    "matmul_reduce_scatter": {"out"},
    "moe_dispatch": {"recv_x", "recv_scales"},
    "moe_combine": set(),
}


def test_every_operator_is_registered_with_its_mutations() -> None:
    import ironlink.moe.torch_library  # noqa: F401 - registers the MoE operators

    for name, mutated in MUTATED.items():
        schema = getattr(torch.ops.ironlink, name).default._schema
        written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert written == mutated, (name, str(schema))
        assert schema.arguments[0].name in ("heap", "exchange") and str(schema.arguments[0].type) == "int"
    # The functions the operators run are the public functions themselves.
    for name in EAGER:
        assert eager.function(name) is getattr(ironlink, name), name
    # Operators that only write their arguments return nothing (nothing for a fake to compute).
    assert str(torch.ops.ironlink.all_reduce.default._schema) == (
        "ironlink::all_reduce(SymInt heap, Tensor(a1!) t, SymInt op, bool check, bool? pdl, str config) -> ()")


def test_fake_implementations_write_nothing_and_trace() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    heap = FakeHeap()

    def f(t: Any, out: Any, inp: Any, a: Any, b: Any, big: Any) -> Any:
        torch.ops.ironlink.all_reduce(heap.handle, t, 0, False, None, "")
        torch.ops.ironlink.all_gather(heap.handle, out, inp, False)
        torch.ops.ironlink.matmul_all_reduce(heap.handle, a, b, big, [16, 16, 16, 1, 4, 2], None, False, "")
        return t + 1, out, big

    with FakeTensorMode():
        args = (torch.empty(8), torch.empty(16), torch.empty(8), torch.empty(4, 3, dtype=torch.bfloat16),
                torch.empty(3, 5, dtype=torch.bfloat16), torch.empty(4, 5, dtype=torch.bfloat16))
        assert torch.ops.ironlink.all_reduce(heap.handle, args[0], 0, False, None, "") is None
    gm = make_fx(f, tracing_mode="fake")(*[torch.empty(a.shape, dtype=a.dtype) for a in args])
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets[:3] == ["ironlink.all_reduce.default", "ironlink.all_gather.default",
                           "ironlink.matmul_all_reduce.default"], targets


def test_moe_fake_shapes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from ironlink.moe import torch_library  # noqa: F401

    moe = StandInExchange(StandInHeap(), max_tokens=8, hidden=16, topk=2, num_experts=4, path="relay")
    with FakeTensorMode():
        x = torch.empty(5, 16, dtype=torch.bfloat16)
        recv_x, recv_scales = torch.empty(moe.recv_x.shape, dtype=moe.recv_x.dtype), torch.empty(moe.recv_scales.shape)
        counts, offsets, send_row, slot, weight, received = torch.ops.ironlink.moe_dispatch(
            moe.op_handle, x, torch.empty(5, 2, dtype=torch.int64), torch.empty(5, 2), recv_x, recv_scales, False)
        rows = moe.world * moe.max_tokens
        assert [tuple(t.shape) for t in (counts, offsets, send_row, slot, weight, received)] == [
            (moe.local_experts,), (moe.local_experts,), (5, moe.world), (rows, 2), (rows, 2), (1,)]
        assert weight.dtype == torch.float32 and counts.dtype == torch.int64
        y = torch.ops.ironlink.moe_combine(moe.op_handle, torch.empty(moe.capacity, 16, dtype=torch.bfloat16),
                                           send_row, slot, weight, received, False)
        assert tuple(y.shape) == (5, 16) and y.dtype == torch.bfloat16


# --- handles ----------------------------------------------------------------------------------------


def test_handles_are_weak_and_ordered() -> None:
    a, b = FakeHeap(), FakeHeap()
    assert b.handle == a.handle + 1 and handles.lookup(a.handle, "x") is a
    assert [h for h in handles.live(FakeHeap) if h in (a, b)] == [a, b]
    gone = a.handle
    del a
    gc.collect()
    with pytest.raises(IronlinkError, match=f"torch.ops.ironlink.all_reduce: handle {gone} names no live"):
        ops_lib.heap_of(gone, torch.empty(1), "all_reduce")


def test_an_operator_without_a_heap_names_the_fix() -> None:
    with pytest.raises(IronlinkError, match="pass heap= under torch.compile"):
        ops_lib.heap_of(handles.NO_HANDLE, torch.empty(1), "all_reduce")


def test_staging_runs_the_op_on_heap_copies(stand_ins: StandIns) -> None:
    heap = FakeHeap()
    t = torch.arange(6.0)
    ops_lib.all_reduce_op(heap.handle, t, 0, False, None, "")  # not a heap tensor: staged
    assert torch.equal(t, torch.arange(6.0) * WORLD) and stand_ins.not_in_heap == []
    inside = heap.empty((6,))
    inside.copy_(torch.arange(6.0))
    ops_lib.all_reduce_op(heap.handle, inside, 0, False, None, "")  # a heap tensor: in place, no new workspace
    assert torch.equal(inside, torch.arange(6.0) * WORLD) and len(heap.workspaces) == 1


# --- torch.compile(fullgraph=True) of the public functions ------------------------------------------


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


def test_importing_the_package_does_not_import_torch() -> None:
    # Importing the packages also enters every function the operators run (runtime.eager), without torch.
    code = ("import sys, ironlink, ironlink.ops, ironlink.fused, ironlink.moe, ironlink.runtime.heap, "
            "ironlink.runtime.handles; assert 'torch' not in sys.modules, 'torch imported'; "
            f"from ironlink.runtime import eager; assert sorted(eager.FUNCTIONS) == {sorted(EAGER)}, eager.FUNCTIONS")
    r = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(REPO / "python")}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_opcheck_mutations_and_fakes(stand_ins: StandIns) -> None:
    """torch.library.opcheck: the declared mutations are the real ones (with the stand-ins), the
    fakes agree with the implementations, and the operators survive AOT dispatch."""
    heap = FakeHeap()
    cases = [
        (torch.ops.ironlink.all_reduce.default, (heap.handle, torch.randn(8), 0, False, None, "")),
        (torch.ops.ironlink.all_gather.default, (heap.handle, torch.zeros(16), torch.randn(8), False)),
        (torch.ops.ironlink.reduce_scatter.default, (heap.handle, torch.zeros(8), torch.randn(16), 0, False)),
        (torch.ops.ironlink.all_reduce_rmsnorm.default,
         (heap.handle, torch.randn(2, 8), torch.randn(2, 8), torch.rand(8), torch.zeros(2, 8), None, 1e-6, None, False,
          None, "")),
        (torch.ops.ironlink.matmul_all_reduce.default,
         (heap.handle, torch.randn(2, 3), torch.randn(3, 4), torch.zeros(2, 4), None, None, False, "")),
        (torch.ops.ironlink.matmul_reduce_scatter.default,
         (heap.handle, torch.randn(4, 3), torch.randn(3, 4), torch.zeros(2, 4), None, False, None,
          '{"copy_engine_min_rows": 0, "min_chunks": 2, "signal_every": 4}')),
        (torch.ops.ironlink.all_reduce_rmsnorm_out.default,
         (heap.handle, torch.randn(2, 8), torch.randn(2, 8), torch.zeros(2, 8), torch.rand(8), None,
          torch.zeros(2), 1e-6, "rows", False, False, '{"split_lamport": false}')),
        (torch.ops.ironlink.all_gather_matmul.default,
         (heap.handle, torch.randn(2, 3), torch.randn(3, 4), torch.zeros(4, 3), torch.zeros(4, 4),
          [16, 16, 16, 1, 4, 2], False, "kernel", "")),
        (torch.ops.ironlink.all_to_all_v.default,
         (heap.handle, torch.randn(3, 4), torch.tensor([1, 2]), torch.zeros(6, 4), torch.zeros(2, dtype=torch.int64),
          torch.zeros(2, dtype=torch.int64), False, None)),
    ]
    from ironlink.moe import torch_library  # noqa: F401 - registers the MoE operators

    moe = StandInExchange(StandInHeap(), max_tokens=4, hidden=16, topk=2, num_experts=4, path="relay")
    cases.append((torch.ops.ironlink.moe_dispatch.default,
                  (moe.op_handle, torch.randn(3, 16).to(torch.bfloat16), torch.zeros(3, 2, dtype=torch.int64),
                   torch.ones(3, 2), moe.recv_x, moe.recv_scales, False)))
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_moe_buffers_come_from_the_heaps_top_and_its_oom_names_the_bytes() -> None:
    """MoeExchange takes its heap buffers from the heap's top (`heap.empty(at_top=True)`: the same
    offsets on every rank whatever each allocated before); where the heap runs out, the error
    says how many bytes the exchange needs (needs the compiled extension for heap_bytes)."""
    pytest.importorskip("ironlink._native")

    class FullHeap:
        world_size, rank, device, multi_node, simulated_peers = WORLD, 0, torch.device("cpu"), False, None

        def empty(self, shape: Any, dtype: Any, at_top: bool = False) -> Any:
            assert at_top, "an exchange buffer outside the heap's top"
            raise IronlinkError("symmetric heap out of memory for an op's workspace")

    need = MoeExchange.heap_bytes(WORLD, 64, 1024, 2, path="direct")
    with pytest.raises(IronlinkError, match=rf"MoeExchange \(direct path\) needs {need} bytes .*out of memory"):
        MoeExchange(FullHeap(), 64, 1024, 2, 8, path="direct")
