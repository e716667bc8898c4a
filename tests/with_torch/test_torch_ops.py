"""ironlink's PyTorch custom operators (`torch.ops.ironlink.*`) on the CPU: schemas and mutation
annotations, fake implementations, torch.library.opcheck, the heaps' handles and staging. Needs
torch (skipped without it, as in CI). torch.compile of the public functions: test_torch_compile.py.

No GPU: the heap and the eager functions the operators call are the CPU stand-ins of
_torch_stand_ins.py.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")

import ironlink  # noqa: E402
from ironlink.fused import torch_library as fused_lib  # noqa: E402,F401 - registers the fused operators
from ironlink.moe.exchange import MoeExchange  # noqa: E402
from ironlink.ops import torch_library as ops_lib  # noqa: E402
from ironlink.runtime import eager, handles  # noqa: E402
from ironlink.runtime.errors import IronlinkError  # noqa: E402

from _torch_stand_ins import (EAGER, WORLD, FakeHeap, StandInExchange, StandInHeap,  # noqa: E402
                              StandIns, installed)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIns]:
    yield from installed(monkeypatch)


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
    from ironlink.moe import torch_library  # noqa: F401 - registers the MoE operators

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
