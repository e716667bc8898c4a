"""CPU tests of the host-level collectives (`ironlink.ops`) and their tuning: no GPU, no torch.

The argument checks are pure functions over `TensorSpec`s; `ironlink.tuning.choose` and the
generator `bench/report/make_tuning.py` are plain Python; the launches go to a fake torch. That
the kernels compile is tests/compile/test_ops_compile.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import math
import re
import subprocess
import types
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

import ironlink
from ironlink.language import _abi
from ironlink.ops import collectives as ops
from ironlink.runtime import registry, status_buffers, tuning
from ironlink.runtime.tuning import decode_table, op_config
from ironlink.ops import variable_all_to_all as a2av

from ironlink.runtime.errors import IronlinkError
from ironlink.ops import Plan
from ironlink.runtime import launch
from ironlink.runtime.tensor_spec import TensorSpec, reduce_op_code

# The fused host modules named after their ops (the package's attributes of those names are the ops).
arn = importlib.import_module("ironlink.fused.all_reduce_rmsnorm")
agm = importlib.import_module("ironlink.fused.all_gather_matmul")
mar = importlib.import_module("ironlink.fused.matmul_all_reduce")
mrs = importlib.import_module("ironlink.fused.matmul_reduce_scatter")

REPO = Path(__file__).resolve().parents[2]
DEV = "cuda:0"


def spec(name: str, n: int, dtype: str = "bfloat16", ptr: int = 1 << 20, **kw: Any) -> TensorSpec:
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "float64": 8, "int64": 8}[dtype]
    fields = dict(shape=(n,), dtype=dtype, itemsize=itemsize, contiguous=True, device=DEV, data_ptr=ptr)
    return TensorSpec(name, **{**fields, **kw})


def test_host_functions_are_exported_lazily() -> None:
    assert ironlink.all_reduce is ops.all_reduce
    assert ironlink.all_gather is ops.all_gather
    assert ironlink.reduce_scatter is ops.reduce_scatter


# --- argument checks ------------------------------------------------------------------------------


def test_reduce_ops() -> None:
    assert reduce_op_code("sum") == _abi.REDUCE_OP["SUM"]
    assert reduce_op_code("AVG") == _abi.REDUCE_OP["AVG"]
    assert reduce_op_code(_abi.REDUCE_OP["MAX"]) == _abi.REDUCE_OP["MAX"]
    from ironlink.constants import REDUCE_OP_MIN

    assert reduce_op_code(REDUCE_OP_MIN) == _abi.REDUCE_OP["MIN"]  # a tl.constexpr
    for bad in ("mean", 99, True, None):
        with pytest.raises(ValueError, match="op must be one of 'sum', 'max', 'min', 'prod', 'avg'"):
            reduce_op_code(bad)  # type: ignore[arg-type]


def test_all_reduce_plan_and_tensor_checks() -> None:
    assert ops.plan_all_reduce(spec("t", 1000), DEV) == Plan(1000, _abi.DTYPE["BFLOAT16"], 2000)
    assert ops.plan_all_reduce(spec("t", 10, "float32", shape=(2, 5)), DEV) == Plan(10, _abi.DTYPE["FLOAT32"], 40)
    assert ops.plan_all_reduce(spec("t", 8, "float16"), DEV).dtype == _abi.DTYPE["FLOAT16"]
    with pytest.raises(TypeError, match="t has dtype int32; ironlink collectives support float32, float16, bfloat16"):
        ops.plan_all_reduce(spec("t", 8, "int32"), DEV)
    with pytest.raises(ValueError, match="t must be contiguous"):
        ops.plan_all_reduce(spec("t", 8, contiguous=False), DEV)
    with pytest.raises(ValueError, match="t is on cuda:1, but the symmetric heap is on cuda:0"):
        ops.plan_all_reduce(spec("t", 8, device="cuda:1"), DEV)


def test_all_gather_plan() -> None:
    world, rank = 4, 2
    out, inp = spec("out", 4 * 100, ptr=0x10000), spec("inp", 100, ptr=0x90000)
    # Message bytes are the whole output's, as the benchmark (and so the tuning table) counts them.
    assert ops.plan_all_gather(out, inp, world, rank, DEV) == Plan(100, _abi.DTYPE["BFLOAT16"], 800)
    in_place = spec("inp", 100, ptr=0x10000 + rank * 200)
    assert ops.plan_all_gather(out, in_place, world, rank, DEV).n == 100
    with pytest.raises(ValueError, match=r"out must have world size x inp's elements \(4 x 100 = 400\), got 399"):
        ops.plan_all_gather(spec("out", 399), inp, world, rank, DEV)
    with pytest.raises(TypeError, match="out is bfloat16 but inp is float32; they must match"):
        ops.plan_all_gather(out, spec("inp", 100, "float32", ptr=0x90000), world, rank, DEV)
    with pytest.raises(ValueError, match=r"inp overlaps out but is not its block for rank 2 \(out\[200:300\]\)"):
        ops.plan_all_gather(out, spec("inp", 100, ptr=0x10000), world, rank, DEV)
    with pytest.raises(ValueError, match="inp is on cuda:3"):
        ops.plan_all_gather(out, spec("inp", 100, device="cuda:3"), world, rank, DEV)


def test_reduce_scatter_plan() -> None:
    world, rank = 8, 3
    inp, out = spec("inp", 8 * 64, "float32", ptr=0x10000), spec("out", 64, "float32", ptr=0x90000)
    assert ops.plan_reduce_scatter(out, inp, world, rank, DEV) == Plan(64, _abi.DTYPE["FLOAT32"], 8 * 64 * 4)
    in_place = spec("out", 64, "float32", ptr=0x10000 + rank * 256)
    assert ops.plan_reduce_scatter(in_place, inp, world, rank, DEV).n == 64
    with pytest.raises(ValueError, match=r"inp must have world size x out's elements \(8 x 64 = 512\), got 500"):
        ops.plan_reduce_scatter(out, spec("inp", 500, "float32"), world, rank, DEV)
    with pytest.raises(ValueError, match=r"out overlaps inp but is not its block for rank 3"):
        ops.plan_reduce_scatter(spec("out", 64, "float32", ptr=0x10000 + 4), inp, world, rank, DEV)
    with pytest.raises(ValueError, match="out must be contiguous"):
        ops.plan_reduce_scatter(spec("out", 64, "float32", contiguous=False), inp, world, rank, DEV)


def test_statuses() -> None:
    launch.check_statuses([0] * 64, "all_reduce", 0)
    with pytest.raises(IronlinkError, match=r"ironlink.all_gather: symm_all_gather returned INVALID_ARGUMENT \(-9\), "
                                            r"TIMEOUT \(-7\) on rank 5") as e:
        launch.check_statuses([0, -7, -9, -9], "all_gather", 5)
    assert e.value.status == -9 and e.value.function == "symm_all_gather"


class _FakeHeap:
    """Stands in for SymmetricHeap in the registry: holds the tensors named in `mine`."""

    def __init__(self, mine: set[str]) -> None:
        self.mine, self.closed = mine, False

    def _local_offset(self, t: Any, what: str) -> tuple[int, int]:
        if t not in self.mine:
            raise IronlinkError(f"{what}: not in this heap")
        return 0, 0

    def usable(self, what: str) -> None:
        if self.closed:
            raise IronlinkError(f"{what}: the symmetric heap is closed")


def test_heap_is_found_from_the_tensor_once_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_HEAPS", type(registry._HEAPS)())
    a, b = _FakeHeap({"x"}), _FakeHeap({"y"})
    with pytest.raises(IronlinkError, match=r"t is not in a symmetric heap ironlink knows of.*pass heap="):
        registry.heap_for("x", "t", None, "all_reduce")
    assert registry.heap_for("x", "t", a, "all_reduce") is a
    assert registry.heap_for("y", "t", b, "all_reduce") is b
    assert registry.heap_for("x", "t", None, "all_reduce") is a
    assert registry.heap_for("y", "t", None, "all_reduce") is b
    b.closed = True  # a closed heap is never chosen
    with pytest.raises(IronlinkError, match="knows of"):
        registry.heap_for("y", "t", None, "all_reduce")
    with pytest.raises(IronlinkError, match=r"ironlink.all_gather\(inp\): not in this heap"):
        registry.in_heap(a, "all_gather", ("x", "out"), ("z", "inp"))
    del a, b  # held weakly: dropping the heaps empties the registry
    import gc

    gc.collect()
    assert len(registry._HEAPS) == 0


# --- tuning ----------------------------------------------------------------------------------------


def test_choose_follows_the_table() -> None:
    w = max(tuning.TABLES["all_reduce"])
    table = tuning.TABLES["all_reduce"][w]
    assert [b for b, _, _ in table] == sorted(b for b, _, _ in table)
    smallest, largest = table[0], table[-1]
    assert tuning.choose("all_reduce", 1, w) == smallest[1:]
    assert tuning.choose("all_reduce", smallest[0], w) == smallest[1:]
    assert tuning.choose("all_reduce", largest[0] * 16, w) == largest[1:]
    for (lo, *_), (hi, ctas, warps) in zip(table, table[1:]):
        assert tuning.choose("all_reduce", lo + 1, w) == (ctas, warps)  # between: the next measured size
        assert tuning.choose("all_reduce", hi, w) == (ctas, warps)
    for c in ("all_gather", "reduce_scatter"):
        largest_world = max(tuning.TABLES[c])
        for world in (16, 32):  # beyond the measured world sizes: the largest one's table
            assert tuning.choose(c, 1 << 20, world) == tuning.choose(c, 1 << 20, largest_world)
    with pytest.raises(ValueError, match="no tuning for 'broadcast'"):
        tuning.choose("broadcast", 1024, 8)


def test_choose_clamps_ctas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tuning.TABLES, "all_reduce", {8: ((1024, 0, 4), (2048, 1000, 8)), 2: ((1 << 30, 16, 4),)})
    assert tuning.choose("all_reduce", 10, 8) == (1, 4)
    assert tuning.choose("all_reduce", 2000, 8) == (_abi.MAX_CTAS, 8)
    assert tuning.choose("all_reduce", 2000, 3) == (16, 4)  # nearest measured world
    assert tuning.choose("all_reduce", 2000, 5) == (16, 4)  # the nearest smaller measured world (lookup.nearest_world)
    assert tuning.choose("all_reduce", 2000, 9) == (_abi.MAX_CTAS, 8)  # above every measured world: the largest


def _make_tuning() -> ModuleType:
    spec_ = importlib.util.spec_from_file_location("make_tuning", REPO / "bench" / "report" / "make_tuning.py")
    assert spec_ is not None and spec_.loader is not None
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    return mod


def _row(coll: str, dt: str, nbytes: int, who: str, config: str, us: float) -> dict[str, Any]:
    return {"collective": coll, "dtype": dt, "bytes": nbytes, "contender": who, "config": config, "us": us}


def test_make_tuning_picks_the_fastest_config_per_size(tmp_path: Path) -> None:
    rows = [
        _row("all_reduce", "bf16", 1024, "nccl", "", 1.0),  # not ours: ignored
        _row("all_reduce", "bf16", 1024, "ironlink_cfg", "8x4", 5.0),
        _row("all_reduce", "bf16", 1024, "ironlink_cfg", "32x4", 6.0),
        _row("all_reduce", "fp32", 1024, "ironlink_cfg", "32x4", 4.0),  # fastest over dtypes wins
        _row("all_reduce", "bf16", 4096, "ironlink_cfg", "8x4", 5.0),
        _row("all_reduce", "bf16", 4096, "ironlink_cfg", "32x4", 4.0),  # same as 1024: merged
        _row("all_reduce", "bf16", 1 << 20, "ironlink_cfg", "8x4", 50.0),
        _row("all_reduce", "bf16", 1 << 20, "ironlink_cfg", "300x16", 9.0),  # clamped to MAX_CTAS
        _row("all_gather", "bf16", 1024, "ironlink", "", 7.0),  # "" is the first config tried: 8x4
        _row("all_gather", "fp32", 1024, "ironlink", "64x8", 9.0),
        _row("all_gather", "bf16", 1 << 20, "ironlink", "64x8", 20.0),
        _row("reduce_scatter", "bf16", 1024, "ironlink", "132x8", 3.0),
    ]
    src = tmp_path / "b.json"
    src.write_text(json.dumps({"world_size": 4, "git_rev": "abc1234", "gpu": "G", "results": rows}))
    out = tmp_path / "tuning_table.py"
    mt = _make_tuning()
    # abc1234 is no commit here: refused unless stale benchmarks are allowed.
    assert mt.main([str(src), "--out", str(out)]) == 1 and not out.exists()
    assert mt.main([str(src), "--out", str(out), "--allow-stale"]) == 0
    text = out.read_text()
    assert text.startswith("# Generated by bench/report/make_tuning.py (at git ")
    assert re.search(r"^# from \S*b\.json \(benchmark at git abc1234, 4x G\)", text, re.M)
    gen: dict[str, Any] = {}
    exec(compile(text, str(out), "exec"), gen)
    assert gen["TABLES"] == {
        "all_reduce": {4: ((4096, 32, 4), (1 << 20, _abi.MAX_CTAS, 16))},
        "all_gather": {4: ((1024, 8, 4), (1 << 20, 64, 8))},
        "reduce_scatter": {4: ((1024, 132, 8),)},
    }
    assert tuning.choose("all_reduce", 5000, 8, gen["TABLES"]) == (_abi.MAX_CTAS, 16)
    assert gen["ALGORITHM_LIMITS"] == {}  # rows without an algorithm: the heap keeps its defaults


def test_make_tuning_derives_algorithm_limits() -> None:
    def r(nbytes: int, alg: str, us: float, config: str = "64x8") -> dict[str, Any]:
        return {**_row("all_reduce", "bf16", nbytes, "ironlink_cfg", config, us), "algorithm": alg}

    rows = [
        r(1024, "one_shot_ll", 5.0), r(1024, "two_shot_ll", 7.0),
        r(4096, "one_shot_ll", 5.0),
        r(65536, "one_shot_ll", 8.0), r(65536, "two_shot_ll", 7.5, "32x4"),  # LL2 wins from here
        r(1 << 20, "two_shot_ll", 14.0), r(1 << 20, "two_shot", 13.0),  # then two-shot
        r(4 << 20, "two_shot_ll", 30.0), r(4 << 20, "two_shot", 40.0),  # a later LL win does not count
        {**_row("all_gather", "bf16", 1024, "ironlink", "8x4", 7.0), "algorithm": "ll"},
        {**_row("all_gather", "bf16", 4096, "ironlink", "8x4", 7.0), "algorithm": "ll"},
        {**_row("all_gather", "bf16", 65536, "ironlink", "8x4", 9.0), "algorithm": "bulk"},
        {**_row("reduce_scatter", "bf16", 1024, "ironlink", "8x4", 7.0), "algorithm": "ll"},
        {**_row("reduce_scatter", "bf16", 4096, "ironlink", "8x4", 8.0), "algorithm": "bulk"},
    ]
    mt = _make_tuning()
    tables, limits = mt.tables_from([{"world_size": 8, "results": rows}])
    assert limits == {8: (4096, 65536, 1024)}  # gather: LL won up to 4 KiB for AG, 1 KiB for RS
    assert tables["all_reduce"][8][:2] == [(4096, 64, 8), (65536, 32, 4)]
    assert tuning.algorithm_limits(8, limits) == (4096, 65536, 1024)
    assert tuning.algorithm_limits(6, limits) == (4096, 65536, 1024)  # nearest measured world
    assert tuning.algorithm_limits(8, {}) is None


def test_make_tuning_refuses_benchmarks_of_other_device_code() -> None:
    mt = _make_tuning()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    if not head:
        pytest.skip("not a git checkout")
    assert mt.stale_reason({"git_rev": head}) is None
    assert "not a commit" in str(mt.stale_reason({"git_rev": "unknown"}))
    # The 8-GPU benchmark of e6d1af2 measured older algorithms (or, in a shallow clone, is unknown).
    assert mt.stale_reason({"git_rev": "e6d1af2"}) is not None


def test_committed_tuning_matches_its_benchmark() -> None:
    # The header names the JSONs it came from; regenerating from them must give the same tables.
    names = re.findall(r"(bench/results/\S+\.json)", (REPO / "python" / "ironlink" / "runtime" / "tuning_table.py").read_text())
    assert names, "tuning_table.py's header does not name its benchmark JSON"
    mt = _make_tuning()
    tables, limits = mt.tables_from([json.loads((REPO / n).read_text()) for n in names])
    want = {c: {w: tuple(t) for w, t in by_world.items()} for c, by_world in tables.items()}
    stale = "python/ironlink/runtime/tuning_table.py is stale: run `python bench/report/make_tuning.py`"
    assert tuning.TABLES == want, stale
    assert tuning.ALGORITHM_LIMITS == limits, stale


# --- the host path, over a stand-in for torch ------------------------------------------------------


class _FakeTensor:
    """The few torch.Tensor methods ironlink.ops calls."""

    def __init__(self, n: int, dtype: str = "bfloat16", ptr: int = 0x10000, contiguous: bool = True,
                 shape: tuple[int, ...] = ()) -> None:
        self.shape, self.dtype, self.ptr, self.contiguous = shape or (n,), f"torch.{dtype}", ptr, contiguous
        self.device, self.values = DEV, [0] * n

    def stride(self, dim: int) -> int:  # row-major
        return 1 if dim == len(self.shape) - 1 else self.shape[-1]

    def element_size(self) -> int:
        return {"uint8": 1, "float32": 4, "int32": 4, "int64": 8, "float64": 8}.get(self.dtype.split(".")[-1], 2)

    def is_contiguous(self) -> bool:
        return self.contiguous

    def data_ptr(self) -> int:
        return self.ptr

    def __getitem__(self, s: slice) -> "_FakeTensor":
        t = _FakeTensor(0, ptr=self.ptr)  # s starts at 0 wherever ironlink slices
        t.values = self.values[s]
        return t

    def tolist(self) -> list[int]:
        return self.values

    def view(self, how: Any) -> "_FakeTensor":  # a workspace's bytes as a dtype or a shape: the same memory
        t = _FakeTensor(0, ptr=self.ptr, contiguous=self.contiguous)
        t.dtype, t.shape = self.dtype, self.shape
        if isinstance(how, tuple):
            t.shape = how
        else:
            t.dtype = str(how)
            t.shape = (len(self.values) * self.element_size() // t.element_size(),)
        t.values = self.values[:math.prod(t.shape)]
        return t

    is_cuda = True

    def numel(self) -> int:
        return len(self.values)

    def copy_(self, src: "_FakeTensor") -> "_FakeTensor":
        COPIES.append((self.ptr, src.ptr))
        return self


STAGED = 0xE000000  # where _Heap's staging workspaces start
COPIES: list[tuple[int, int]] = []  # (destination, source) data pointers of _FakeTensor.copy_, in order


class _Stream:
    """Stands in for torch.cuda.Stream: compared by identity, records what it was made to wait for."""

    def __init__(self, name: str) -> None:
        self.name, self.waited = name, []  # type: ignore[var-annotated]

    def wait_stream(self, other: "_Stream") -> None:
        self.waited.append(other.name)


@pytest.fixture()
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """sys.modules["torch"] replaced for one test (ops imports torch inside its functions). The
    fake heap's world (8) takes the device library's all-reduce at every size here and
    all_reduce_rmsnorm's modes without a workspace (which fake tensors cannot hold): these tests
    check those launches; the lamport paths' are checked on GPUs (tests/gpu/workers/ops_worker.py,
    fusion_worker.py)."""
    k, m, no_limit = 1 << 10, 1 << 20, decode_table.NO_LIMIT
    library = decode_table.DecodeTable((), ((16 * k, "whole"), (32 * m - 1, "rows"), (no_limit, "whole")))
    with decode_table.substituted(_Heap.world_size, library):
        yield _fake_torch(monkeypatch)


def _fake_torch(monkeypatch: pytest.MonkeyPatch) -> Any:
    import contextlib
    import sys
    import types

    torch = types.ModuleType("torch")
    torch.Tensor = _FakeTensor  # type: ignore[attr-defined]
    torch.int32 = "int32"  # type: ignore[attr-defined]
    torch.capturing = False  # type: ignore[attr-defined]
    torch.stream = _Stream("default")  # type: ignore[attr-defined]  # the current stream
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_current_stream_capturing=lambda: torch.capturing, device=lambda d: contextlib.nullcontext(),
        current_stream=lambda device=None: torch.stream,
    )
    torch.zeros = lambda n, dtype, device: _FakeTensor(n, "int32", 0xDEAD)  # type: ignore[attr-defined]
    torch.compiler = types.SimpleNamespace(is_compiling=lambda: False)  # type: ignore[attr-defined]  # eager
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(status_buffers, "_STATUS", {})
    monkeypatch.setattr(registry, "_HEAPS", type(registry._HEAPS)())
    launches: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = []

    class Kernel:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **kw: launches.append((self.name, grid, args, kw))

    for c in ("all_reduce", "all_gather", "reduce_scatter"):
        monkeypatch.setattr(ops, f"_{c}_kernel", Kernel(c))
    monkeypatch.setattr(a2av, "_all_to_all_v_kernel", Kernel("all_to_all_v"))
    for module, name in ((arn, "allreduce_rmsnorm"), (mar, "matmul_allreduce"), (agm, "allgather_matmul"),
                         (mrs, "matmul_reducescatter")):
        for variant in (name, f"{name}_hierarchical"):
            monkeypatch.setattr(module, f"{variant}_kernel", Kernel(variant))
    monkeypatch.setattr(mar, "matmul_allreduce_push_kernel", Kernel("matmul_allreduce_push"))
    monkeypatch.setattr(mar, "matmul_allreduce_owner_kernel", Kernel("matmul_allreduce_owner"))
    torch.cuda.get_device_properties = lambda d: types.SimpleNamespace(multi_processor_count=132)
    torch.cuda.get_device_capability = lambda d: (8, 0)  # no TMA: the kernels get the tensors
    torch.launches = launches  # type: ignore[attr-defined]
    return torch


class _Device:
    index = 0

    def __str__(self) -> str:
        return DEV


class _Heap:
    closed, world_size, rank, ctx, device = False, 8, 3, 0x1234, _Device()
    node_size = 8

    @property
    def multi_node(self) -> bool:
        return self.node_size < self.world_size

    def __init__(self, *tensors: Any) -> None:
        from ironlink.runtime.streams import StreamOrder

        self.mine = {id(t) for t in tensors}
        self.stream_order = StreamOrder()
        self.unusable = ""  # set: usable() raises it, as a closed SymmetricHeap does
        self.compared: list[tuple[str, dict[str, Any]]] = []  # the check=True calls compare_call saw
        self.differs = ""  # set: compare_call raises it, as where the ranks' calls differ

    def usable(self, what: str) -> None:
        if self.unusable:
            raise IronlinkError(f"{what}: {self.unusable}")

    def compare_call(self, name: str, **fields: Any) -> None:
        self.compared.append((name, fields))
        if self.differs:
            raise IronlinkError(f"ironlink.{name}(check=True) on rank 3: {self.differs}; nothing was launched")

    def explain(self, e: IronlinkError) -> IronlinkError:
        """As SymmetricHeap.explain: HEAP_ASYMMETRIC gets the heap calls that differ appended."""
        if e.status != _abi.STATUS["HEAP_ASYMMETRIC"]:
            return e
        return IronlinkError(f"{e}. The first heap call that differs ...", status=e.status, function=e.function)

    def _local_offset(self, t: Any, what: str) -> tuple[int, int]:
        if id(t) not in self.mine and t.data_ptr() < STAGED:  # its tensors, and views of its workspaces
            raise IronlinkError(f"{what}: not in this heap")
        return 0, 0

    def workspace(self, name: str, nbytes: int, zeroed_prefix: int = 0) -> _FakeTensor:
        """At 0xF000000, but the staging workspaces (runtime.staging) at STAGED + 1 MiB x their
        argument position: an op's staged tensors apart."""
        at = STAGED + (int(name.rsplit("/", 1)[1]) << 20) if name.startswith("torch.ops.") else 0xF000000
        return _FakeTensor(nbytes, "uint8", ptr=at)


def test_host_calls_launch_the_tuned_grid(fake_torch: Any) -> None:
    x = _FakeTensor(4096)
    heap = _Heap(x)
    ironlink.all_reduce(x, heap=heap, check=True)
    ironlink.all_reduce(x, op="max")  # the heap is remembered
    ctas, warps = tuning.choose("all_reduce", 8192, 8)
    assert fake_torch.launches == [
        ("all_reduce", (ctas,), (0x1234, x, 4096, 0, status_buffers._STATUS[0]), {"num_warps": warps}),
        ("all_reduce", (ctas,), (0x1234, x, 4096, 1, status_buffers._STATUS[0]), {"num_warps": warps}),
    ]
    out, inp = _FakeTensor(8 * 1024, ptr=0x20000), _FakeTensor(1024, ptr=0x20000 + 3 * 2048)  # in place
    heap.mine |= {id(out), id(inp)}
    ironlink.all_gather(out, inp)
    ironlink.reduce_scatter(inp, out, op="avg")
    ctas, warps = tuning.choose("all_gather", 16384, 8)
    assert fake_torch.launches[-2][1:] == ((ctas,), (0x1234, inp, out, 1024, status_buffers._STATUS[0]), {"num_warps": warps})
    ctas, warps = tuning.choose("reduce_scatter", 16384, 8)
    assert fake_torch.launches[-1][1:3] == ((ctas,), (0x1234, out, inp, 1024, 4, status_buffers._STATUS[0]))
    ironlink.all_reduce(_FakeTensor(0), heap=_Heap())  # empty: nothing to check in the heap or launch
    assert len(fake_torch.launches) == 4


def test_ranks_sharing_a_gpu_launch_their_share_of_it(fake_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With IRONLINK_SHARED_GPU=1 and 4 ranks on one 132-SM GPU, no collective launches more than
    16 CTAs (every rank's CTAs must be resident at once: half its 33, SHARED_GPU_SM_DIVISOR),
    whatever the tuning says or ctas asks."""
    from ironlink.runtime.distributed import grid_cap, ranks_per_gpu, sm_share

    fake_torch.cuda.device_count = lambda: 1
    assert (ranks_per_gpu(), grid_cap(0), sm_share(0)) == (1, ironlink.tuning.MAX_CTAS, 132)
    assert ironlink.sm_share is sm_share  # the public name, for users' persistent kernels
    monkeypatch.setenv("IRONLINK_SHARED_GPU", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert (ranks_per_gpu(), grid_cap(0), sm_share(0)) == (4, 16, 16)
    x, out = _FakeTensor(2048, ptr=0x1000000), _FakeTensor(8 * 1024, ptr=0x20000)
    counts = _FakeTensor(8, "int64", ptr=0x90000)
    recv_counts, recv_offsets = _FakeTensor(8, "int64", ptr=0x91000), _FakeTensor(8, "int64", ptr=0x92000)
    heap = _Heap(x, out, counts, recv_counts, recv_offsets)
    assert tuning.choose("all_reduce", 2048 * 2, 8)[0] > 16  # the cap is what limits it here
    ironlink.all_reduce(x, heap=heap)
    ironlink.all_to_all_v(out, counts, out, recv_counts, recv_offsets, heap=heap, ctas=132)
    assert [grid for _, grid, *_ in fake_torch.launches] == [(16,), (16,)]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert grid_cap(0) == 33


def test_ranks_confined_by_mps_launch_the_sms_the_gpu_reports(fake_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under MPS with $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE at most 100 / ranks a GPU, the GPU
    reports the rank's own share of SMs: that is the share, not divided by the ranks again (only
    by SHARED_GPU_SM_DIVISOR, as every share). A percentage
    that lets the ranks overlap (or none) gets the SMs over the ranks, and init_distributed
    warns that waits can then time out."""
    from ironlink.runtime.distributed import grid_cap, mps_confined, sm_share, warn_unless_confined

    fake_torch.cuda.device_count = lambda: 1
    monkeypatch.setenv("IRONLINK_SHARED_GPU", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")
    fake_torch.cuda.get_device_properties = lambda d: types.SimpleNamespace(multi_processor_count=32)
    assert mps_confined(4) and (sm_share(0), grid_cap(0)) == (16, 16)
    for bad in ("50", "0", "x", ""):
        monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", bad)
        assert not mps_confined(4) and sm_share(0) == 4
    with pytest.warns(UserWarning, match="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"):
        warn_unless_confined()
    # A TIMEOUT says so too (without meeting the other ranks); confined, it is as it was.
    from ironlink.runtime.errors import device_error
    from ironlink.runtime.failure_notes import explained

    def no_asymmetry(e: Any) -> Any:
        raise AssertionError("the heap-call report is for HEAP_ASYMMETRIC only")

    timeout = device_error(_abi.STATUS["TIMEOUT"], 0, 3)
    noted = explained(timeout, no_asymmetry)
    assert str(noted).startswith(str(timeout)) and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in str(noted)
    assert (noted.status, noted.function) == (timeout.status, timeout.function)
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unless_confined()
    assert explained(timeout, no_asymmetry) is timeout


def test_multi_node_heaps_take_the_same_kernels_and_refuse_the_rest(fake_torch: Any) -> None:
    # One kernel per collective: @ironlink.jit compiles it for several nodes by the context
    # (tests/compile/test_topology.py); the host call launches the same kernel on any heap.
    x, out = _FakeTensor(4096), _FakeTensor(8 * 4096, ptr=0x20000)
    counts = _FakeTensor(8, "int64", ptr=0x90000)
    heap = _Heap(x, out, counts)
    heap.node_size = 2  # 8 ranks as 4 nodes of 2
    recv_counts, recv_offsets = _FakeTensor(8, "int64", ptr=0x91000), _FakeTensor(8, "int64", ptr=0x92000)
    heap.mine |= {id(recv_counts), id(recv_offsets)}
    ironlink.all_reduce(x, heap=heap)
    ironlink.all_gather(out, x, heap=heap)
    ironlink.reduce_scatter(x, out, heap=heap)
    ironlink.all_to_all_v(x, counts, out, recv_counts, recv_offsets, heap=heap)
    assert [k for k, *_ in fake_torch.launches] == ["all_reduce", "all_gather", "reduce_scatter", "all_to_all_v"]
    assert launch.MULTI_NODE_OPS == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all_v",
                                  "all_reduce_rmsnorm", "matmul_all_reduce", "all_gather_matmul",
                                  "matmul_reduce_scatter"}
    with pytest.raises(IronlinkError, match=r"ironlink.barrier has no multi-node version yet; this heap spans 4 "
                                            r"nodes of 2 ranks, where all_gather, all_gather_matmul, all_reduce, "
                                            r"all_reduce_rmsnorm, all_to_all_v, matmul_all_reduce, "
                                            r"matmul_reduce_scatter, reduce_scatter run"):
        launch.launch_with_status("barrier", heap, 1, lambda status: None, False)
    assert len(fake_torch.launches) == 4  # refused before any launch


def _fused_operands() -> tuple[_FakeTensor, ...]:
    """The four fused ops' tensors at world 8: all_reduce_rmsnorm's x, residual, out [4, 4096] and
    weight; the matmuls' a [64, 512], b [512, 256], matmul_all_reduce's out, all_gather_matmul's
    a_full and out, matmul_reduce_scatter's out."""
    t, h = 4, 4096
    x, res, out = (_FakeTensor(t * h, ptr=p, shape=(t, h)) for p in (0x100000, 0x200000, 0x300000))
    w = _FakeTensor(h, ptr=0x400000)
    a, b = _FakeTensor(64 * 512, ptr=0x500000, shape=(64, 512)), _FakeTensor(512 * 256, ptr=0x600000, shape=(512, 256))
    c = _FakeTensor(64 * 256, ptr=0x700000, shape=(64, 256))
    a_full = _FakeTensor(8 * 64 * 512, ptr=0x800000, shape=(8 * 64, 512))
    gathered_out = _FakeTensor(8 * 64 * 256, ptr=0x900000, shape=(8 * 64, 256))
    scattered = _FakeTensor(8 * 256, ptr=0xA00000, shape=(8, 256))
    return x, res, out, w, a, b, c, a_full, gathered_out, scattered


def test_checked_calls_compare_what_every_rank_must_share_before_launching(fake_torch: Any) -> None:
    x, out = _FakeTensor(4096), _FakeTensor(8 * 4096, ptr=0x20000)
    counts = _FakeTensor(8, "int64", ptr=0x90000)
    recv_counts, recv_offsets = _FakeTensor(8, "int64", ptr=0x91000), _FakeTensor(8, "int64", ptr=0x92000)
    xs, res, normed, w, a, b, c, a_full, gathered_out, scattered = _fused_operands()
    heap = _Heap(x, out, counts, recv_counts, recv_offsets, xs, c, a_full)
    ironlink.all_reduce(x, op="max", heap=heap)  # unchecked: nothing compared
    assert heap.compared == []
    ironlink.all_reduce(x, op="max", heap=heap, check=True)
    ironlink.all_gather(out, x, heap=heap, check=True)
    ironlink.reduce_scatter(x, out, heap=heap, check=True)
    ironlink.all_to_all_v(x, counts, out, recv_counts, recv_offsets, heap=heap, check=True)
    ironlink.all_reduce_rmsnorm(xs, res, w, out=normed, heap=heap, check=True)
    ironlink.matmul_all_reduce(a, b, out=c, heap=heap, check=True)
    ironlink.all_gather_matmul(a, b, heap, a_full=a_full, out=gathered_out, method="kernel", check=True,
                               exchange=tuning.GatherExchange(copy_engine=False))
    ironlink.matmul_reduce_scatter(a, b, heap, out=scattered, method="kernel", check=True)
    bf16 = "torch.bfloat16"
    assert heap.compared == [
        ("all_reduce", {"elements": 4096, "dtype": "bfloat16", "op": "max"}),
        ("all_gather", {"elements": 4096, "dtype": "bfloat16"}),
        ("reduce_scatter", {"elements": 4096, "dtype": "bfloat16", "op": "sum"}),
        ("all_to_all_v", {"row_elements": 1, "dtype": bf16, "grid": fake_torch.launches[4][1][0]}),
        ("all_reduce_rmsnorm", {"x": (4, 4096), "dtype": bf16, "mode": None, "out": bf16, "residual_out": False}),
        ("matmul_all_reduce", {"a": (64, 512), "b": (512, 256), "dtype": bf16, "method": None}),
        ("all_gather_matmul", {"a_shard": (64, 512), "b": (512, 256), "dtype": bf16, "method": "kernel"}),
        ("matmul_reduce_scatter", {"a": (64, 512), "b": (512, 256), "dtype": bf16, "method": "kernel"}),
    ]
    launched = len(fake_torch.launches)
    heap.differs = "the ranks' calls differ in elements: rank 0: ...; rank 3: ..."
    with pytest.raises(IronlinkError, match=r"ironlink.all_reduce\(check=True\) on rank 3: the ranks' calls differ"):
        ironlink.all_reduce(x, heap=heap, check=True)
    with pytest.raises(IronlinkError, match="nothing was launched"):
        ironlink.matmul_all_reduce(a, b, out=c, heap=heap, check=True)
    assert len(fake_torch.launches) == launched  # refused before any launch


def test_fused_ops_stage_tensors_outside_the_heap(fake_torch: Any) -> None:
    # Any tensor in (issue 63): all_reduce_rmsnorm's x, matmul_all_reduce's out and
    # all_gather_matmul's a_full, outside the heap, go through the op's heap workspace (at one
    # offset on every rank, as the torch operators stage): x copied in and the sum copied back;
    # out and a_full, which the ops only write, copied back alone.
    x, res, normed, w, a, b, c, a_full, gathered_out, _ = _fused_operands()
    heap = _Heap()  # none of them is the heap's
    COPIES.clear()
    ironlink.all_reduce_rmsnorm(x, res, w, out=normed, heap=heap)
    args = fake_torch.launches[-1][2]
    assert args[1].ptr == STAGED and args[5] is normed  # x: the workspace; out where it is
    assert COPIES == [(STAGED, x.ptr), (x.ptr, STAGED)]
    COPIES.clear()
    done = ironlink.all_reduce_rmsnorm(x, res, w, out=x, heap=heap)  # out=x: the normalized rows into x
    assert done[0] is x and fake_torch.launches[-1][2][5].ptr == STAGED
    assert COPIES == [(STAGED, x.ptr), (x.ptr, STAGED)]
    COPIES.clear()
    assert ironlink.matmul_all_reduce(a, b, out=c, heap=heap) is c
    assert all(arg is not c for arg in fake_torch.launches[-1][2]) and COPIES == [(c.ptr, STAGED)]
    COPIES.clear()
    got = ironlink.all_gather_matmul(a, b, heap, a_full=a_full, out=gathered_out, method="kernel",
                                     exchange=tuning.GatherExchange(copy_engine=False))
    assert got == (a_full, gathered_out) and all(arg is not a_full for arg in fake_torch.launches[-1][2])
    assert COPIES == [(a_full.ptr, STAGED)]
    # Heap tensors stay where they are: no copies.
    heap.mine |= {id(x), id(c), id(a_full)}
    COPIES.clear()
    ironlink.all_reduce_rmsnorm(x, res, w, out=normed, heap=heap)
    assert fake_torch.launches[-1][2][1] is x
    ironlink.matmul_all_reduce(a, b, out=c, heap=heap)
    ironlink.all_gather_matmul(a, b, heap, a_full=a_full, out=gathered_out, method="kernel",
                               exchange=tuning.GatherExchange(copy_engine=False))
    assert COPIES == []
    # Without heap= a tensor outside every heap is still refused, naming it.
    with pytest.raises(IronlinkError, match=r"x is not in a symmetric heap ironlink knows of"):
        ironlink.all_reduce_rmsnorm(_FakeTensor(4 * 4096, ptr=0x990000, shape=(4, 4096)), res, w)
    # The heap it takes to stage: the workspace of the largest call beside the op's own.
    for op, args in ((ironlink.all_reduce_rmsnorm, (4, 4096, 8)), (ironlink.matmul_all_reduce, (64, 256, 512, 8))):
        assert op.heap_bytes(*args, outside_heap=True) == op.heap_bytes(*args) + 2 * 64 * 256 * 2 - 4096
    assert ironlink.all_gather_matmul.heap_bytes(512, 256, 512, 8, outside_heap=True) == \
        ironlink.all_gather_matmul.heap_bytes(512, 256, 512, 8, a_full=True) + 2 * 512 * 512 * 2 - 4096


def test_host_collectives_stage_tensors_outside_the_heap(fake_torch: Any) -> None:
    # all_gather, reduce_scatter and all_to_all_v take tensors outside the heap as their torch
    # operators do: each one not of the heap through the op's heap workspace for its position,
    # the written ones copied back; heap tensors where they are.
    heap = _Heap()
    out, inp = _FakeTensor(8 * 1024, ptr=0x20000), _FakeTensor(1024, ptr=0x30000)
    COPIES.clear()
    assert ironlink.all_gather(out, inp, heap=heap) is out
    args = fake_torch.launches[-1][2]
    staged = STAGED, STAGED + (1 << 20)  # the workspaces of argument positions 0 and 1
    assert (args[1].ptr, args[2].ptr) == staged[::-1]  # the kernel takes (inp, out)
    assert COPIES == [(staged[0], out.ptr), (staged[1], inp.ptr), (out.ptr, staged[0])]
    COPIES.clear()
    assert ironlink.reduce_scatter(inp, out, heap=heap) is inp
    assert COPIES == [(staged[0], inp.ptr), (staged[1], out.ptr), (inp.ptr, staged[0])]
    heap.mine |= {id(out)}  # out on the heap: only inp staged for all_gather
    COPIES.clear()
    ironlink.all_gather(out, inp, heap=heap)
    assert fake_torch.launches[-1][2][2] is out and COPIES == [(staged[1], inp.ptr)]
    rows, counts = _FakeTensor(16, ptr=0x40000), _FakeTensor(8, "int64", ptr=0x50000)
    got_rows, recv_counts, recv_offsets = _FakeTensor(64, ptr=0x60000), _FakeTensor(8, "int64", ptr=0x70000), \
        _FakeTensor(8, "int64", ptr=0x80000)
    COPIES.clear()
    result = ironlink.all_to_all_v(rows, counts, got_rows, recv_counts, recv_offsets, heap=heap)
    assert result == (got_rows, recv_counts, recv_offsets)
    assert COPIES[-3:] == [(got_rows.ptr, STAGED + (2 << 20)), (recv_counts.ptr, STAGED + (3 << 20)),
                           (recv_offsets.ptr, STAGED + (4 << 20))]


@pytest.mark.parametrize("node_size", [8, 2])
def test_fused_ops_take_the_hierarchical_kernels_on_several_nodes(fake_torch: Any, node_size: int) -> None:
    x, res, out, w, a, b, c, a_full, gathered_out, scattered = _fused_operands()
    heap = _Heap(x, c, a_full)
    heap.node_size = node_size  # 8: one node of 8; 2: four nodes of 2
    ironlink.all_reduce_rmsnorm(x, res, w, out=out, heap=heap)
    ironlink.matmul_all_reduce(a, b, out=c, heap=heap)
    # One node: the kernels whose CTAs push (the copy-engine launches need real streams: GPU cases).
    ironlink.all_gather_matmul(a, b, heap, a_full=a_full, out=gathered_out, method="kernel",
                               exchange=tuning.GatherExchange(copy_engine=False))
    ironlink.matmul_reduce_scatter(a, b, heap, out=scattered, method="kernel")
    several = node_size < heap.world_size
    suffix = "_hierarchical" if several else ""
    assert [k for k, *_ in fake_torch.launches] == [f"allreduce_rmsnorm{suffix}",
                                                    # one node of 8: push, two-shot (one-shot is world 2's)
                                                    "matmul_allreduce_hierarchical" if several else "matmul_allreduce_owner",
                                                    f"allgather_matmul{suffix}", f"matmul_reducescatter{suffix}"]
    if several:  # the reduce-scatter runs in place in a workspace of the whole product, then to `out`
        rs_args, rs_kw = fake_torch.launches[3][2:]
        assert rs_args[3] is scattered and rs_args[4].ptr == 0xF000000  # out, the workspace
        assert rs_args[5:8] == (64, 256, 512) and rs_kw["WORLD"] == 8  # M, N, K: the whole product
    assert fake_torch.launches[0][3]["WHOLE"] == several  # several nodes: "whole" by default
    ironlink.all_reduce_rmsnorm(x, res, w, out=out, heap=heap, mode="rows")
    assert fake_torch.launches[-1][0] == f"allreduce_rmsnorm{suffix}" and not fake_torch.launches[-1][3]["WHOLE"]


def test_host_call_statuses_and_capture(fake_torch: Any) -> None:
    x = _FakeTensor(4096)
    heap = _Heap(x)
    fake_torch.capturing = True
    with pytest.raises(IronlinkError, match="call each one once outside capture first"):
        ironlink.all_reduce(x, heap=heap)  # the status buffer cannot be allocated while capturing
    fake_torch.capturing = False
    ironlink.all_reduce(x, check=True)
    status_buffers._STATUS[0].values[1] = -7  # a CTA's status
    with pytest.raises(IronlinkError, match=r"symm_all_reduce returned TIMEOUT \(-7\) on rank 3"):
        ironlink.all_reduce(x, check=True)
    status_buffers._STATUS[0].values[1] = _abi.STATUS["HEAP_ASYMMETRIC"]
    with pytest.raises(IronlinkError, match=r"returned HEAP_ASYMMETRIC \(-12\) on rank 3\. The first heap call") as e:
        ironlink.all_reduce(x, check=True)
    assert e.value.status == -12 and e.value.function == "symm_all_reduce"
    ironlink.all_reduce(x)  # not checked: no error
    fake_torch.capturing = True
    with pytest.raises(ValueError, match="capture forbids; call heap.check"):
        ironlink.all_reduce(x, check=True)
    ironlink.all_reduce(x)
    assert len(fake_torch.launches) == 5
    with pytest.raises(TypeError, match="t must be a torch.Tensor, got str"):
        ironlink.all_reduce("x")
    out, elsewhere = _FakeTensor(8, ptr=0x20000), _FakeTensor(1, ptr=0x90000)
    elsewhere.device = "cuda:1"  # on another GPU than the heap: not staged, refused
    with pytest.raises((IronlinkError, ValueError), match=r"inp"):
        ironlink.all_gather(out, elsewhere, heap=_Heap(out))


# --- all_to_all_v (ironlink.ops.variable_all_to_all) ---------------------------------------------------

def spec_of(name: str, shape: tuple[int, ...], dtype: str = "bfloat16") -> TensorSpec:
    return spec(name, 0, dtype, shape=shape)


def _a2av(**kw: TensorSpec) -> a2av.Plan:
    args = {"inp": spec_of("inp", (10, 4, 3)), "send_counts": spec_of("send_counts", (4,), "int64"),
            "out": spec_of("out", (16, 4, 3)), "recv_counts": spec_of("recv_counts", (4,), "int64"),
            "recv_offsets": spec_of("recv_offsets", (4,), "int64")}
    args.update(kw)
    return a2av.plan(args["inp"], args["send_counts"], args["out"], args["recv_counts"], args["recv_offsets"],
                     "cuda:0", 4)


def test_all_to_all_v_plan_takes_rows_of_any_shape() -> None:
    p = _a2av()
    assert (p.in_rows, p.out_rows, p.row_elements) == (10, 16, 12)
    assert (p.ctas, p.warps) == tuning.all_to_all_v_launch()


@pytest.mark.parametrize("kw, err, text", [
    ({"out": spec_of("out", (16, 4, 2))}, ValueError, "same row shape"),
    ({"out": spec_of("out", (16, 4, 3), "float16")}, TypeError, "must match"),
    ({"send_counts": spec_of("send_counts", (4,), "int32")}, ValueError, "send_counts must be a contiguous int64"),
    ({"recv_offsets": spec_of("recv_offsets", (2,), "int64")}, ValueError, r"shape \(4,\)"),
])
def test_all_to_all_v_rejects_bad_tensors(kw: dict, err: type, text: str) -> None:
    with pytest.raises(err, match=text):
        _a2av(**kw)


# --- stream order and unusable heaps (runtime.launch.launch_with_status) --------------------------------------


def test_stream_order_waits_only_when_the_stream_changes() -> None:
    from ironlink.runtime.streams import StreamOrder

    order, a, b, c = StreamOrder(), _Stream("a"), _Stream("b"), _Stream("c")
    order.before_call(a, capturing=False)
    order.before_call(a, capturing=False)
    assert a.waited == [] and order.last is a
    order.before_call(b, capturing=False)  # another stream: waits for a's calls first
    assert b.waited == ["a"] and order.last is b
    order.before_call(c, capturing=True)  # capture: no wait recorded, c does not become the last
    assert c.waited == [] and order.last is b
    order.before_call(a, capturing=False)
    assert a.waited == ["b"] and order.last is a


def test_host_calls_order_a_heaps_calls_across_streams(fake_torch: Any) -> None:
    x = _FakeTensor(4096)
    heap, a, b = _Heap(x), fake_torch.stream, _Stream("b")
    ironlink.all_reduce(x, heap=heap)
    fake_torch.stream = b
    ironlink.all_reduce(x)  # on another stream: b waits for a before the launch
    ironlink.all_reduce(x)
    assert len(fake_torch.launches) == 3 and b.waited == ["default"] and a.waited == []
    fake_torch.stream, fake_torch.capturing = a, True
    ironlink.all_reduce(x)  # captured: no wait, and the capture stream is not the last one
    assert a.waited == [] and heap.stream_order.last is b


def test_host_calls_refuse_a_closed_heap_before_launching(fake_torch: Any) -> None:
    x = _FakeTensor(4096)
    heap = _Heap(x)
    heap.unusable = "the symmetric heap's process group was destroyed"
    with pytest.raises(IronlinkError, match=r"ironlink.all_reduce: the symmetric heap's process group was destroyed"):
        ironlink.all_reduce(x, heap=heap)
    assert fake_torch.launches == [] and heap.stream_order.last is None


@pytest.mark.parametrize("major", [8, 9])
def test_decode_ops_launch_with_pdl_where_the_gpu_has_it(fake_torch: Any, major: int) -> None:
    fake_torch.cuda.get_device_capability = lambda d: (major, 0)
    t, h = 4, 4096
    x, res, out = (_FakeTensor(t * h, ptr=p, shape=(t, h)) for p in (0x100000, 0x200000, 0x300000))
    w = _FakeTensor(h, ptr=0x400000)
    heap = _Heap(x)
    ironlink.all_reduce(x, heap=heap)
    ironlink.all_reduce_rmsnorm(x, res, w, out=out, heap=heap)
    ironlink.all_reduce(x, heap=heap, pdl=False)
    ironlink.all_reduce_rmsnorm(x, res, w, out=out, heap=heap, pdl=False)
    with_pdl = {"PDL": True, "launch_pdl": True}  # the griddepcontrol code and Triton's launch attribute
    got = [{k: kw[k] for k in with_pdl if k in kw} for *_, kw in fake_torch.launches]
    assert got == [with_pdl if major >= 9 else {}] * 2 + [{}] * 2  # default on from sm_90; pdl=False: off
    gathered, mine = _FakeTensor(8 * 1024, ptr=0x500000), _FakeTensor(1024, ptr=0x500000 + 3 * 2048)
    heap.mine |= {id(gathered), id(mine)}
    ironlink.all_gather(gathered, mine)  # not a decode op: never with PDL
    assert "launch_pdl" not in fake_torch.launches[-1][3]
    if major < 9:
        with pytest.raises(ValueError, match=r"ironlink.all_reduce\(pdl=True\): it needs compute capability 9.0"):
            ironlink.all_reduce(x, heap=heap, pdl=True)


def test_ranks_sharing_a_gpu_launch_without_pdl_unless_asked(fake_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks sharing a GPU: with PDL a rank's next kernel could hold the SMs a peer's kernel needs
    (matmul_all_reduce "lamport", 8 launches, 4 ranks on one H200 stalled), so PDL is off by
    default there; asked for, it is on."""
    fake_torch.cuda.get_device_capability = lambda d: (9, 0)
    fake_torch.cuda.device_count = lambda: 1
    monkeypatch.setenv("IRONLINK_SHARED_GPU", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    x = _FakeTensor(4096, ptr=0x100000)
    heap = _Heap(x)
    ironlink.all_reduce(x, heap=heap)
    ironlink.all_reduce(x, heap=heap, pdl=True)
    assert ["launch_pdl" in kw for *_, kw in fake_torch.launches] == [False, True]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one rank a GPU: the default is on again
    ironlink.all_reduce(x, heap=heap)
    assert fake_torch.launches[-1][3].get("launch_pdl") is True


def test_all_reduce_takes_lamport_slots_for_small_messages() -> None:
    # The committed decode tables: lamport slots up to 256 KiB at worlds 2 and 4 (the tuner's runs
    # on H200s), and world 8 (no table) derives from world 4: 3 / 7 of its bytes, as each rank sends
    # 7 copies where it sent 3.
    for world in (2, 4):
        limit = next(b for b, path in decode_table.table_for(world).all_reduce if path == "lamport")
        assert limit == 256 << 10
        assert tuning.all_reduce_takes_lamport(2, world) and tuning.all_reduce_takes_lamport(limit, world)
        assert not tuning.all_reduce_takes_lamport(limit + 1, world) and not tuning.all_reduce_takes_lamport(0, world)
    assert tuning.all_reduce_takes_lamport((256 << 10) * 3 // 7, 8)
    assert not tuning.all_reduce_takes_lamport((256 << 10) * 3 // 7 + 1, 8)
    limit = 256 << 10
    # Every CTA of it carries ALL_REDUCE_LAMPORT_CTA_BYTES: the largest message fits one wave of an H100.
    assert -(-limit // tuning.ALL_REDUCE_LAMPORT_CTA_BYTES) <= 132


def test_op_configs_default_to_the_tuning_and_cross_a_compiled_graph_as_strings() -> None:
    # An op's choices beyond its table are a frozen config passed to it, not a posted global: no
    # setter is left (tuning.overridden is gone).
    assert not hasattr(tuning, "overridden")
    assert tuning.AllReduceConfig() == tuning.AllReduceConfig(tuning.ALL_REDUCE_LAMPORT_CTA_BYTES,
                                                              tuning.ALL_REDUCE_LAMPORT_WARPS)
    assert tuning.RmsnormConfig().split_lamport is tuning.RMSNORM_SPLIT_LAMPORT
    with pytest.raises(dataclasses.FrozenInstanceError):
        tuning.RmsnormConfig().split_lamport = False  # type: ignore[misc]
    for config in (tuning.AllReduceConfig(lamport_cta_bytes=4096, lamport_warps=8),
                   tuning.RmsnormConfig(split_lamport=False), tuning.GatherExchange(copy_engine=False, min_chunks=4),
                   tuning.ScatterExchange(copy_engine_min_rows=None, signal_every=1)):
        text = op_config.as_arg(config)
        assert isinstance(text, str) and op_config.from_arg(type(config), text) == config
    assert op_config.as_arg(None) == "" and op_config.from_arg(tuning.RmsnormConfig, "") is None
    # The rmsnorm plan takes it: split over LL packets where the default takes lamport slots.
    x = TensorSpec("x", (1, 8192), "bfloat16", 2, True, "cuda:0", 1 << 20)
    r, w, o = x._replace(name="residual", data_ptr=2 << 30), TensorSpec("weight", (8192,), "bfloat16", 2, True,
                                                                         "cuda:0", 3 << 30), x._replace(name="out")
    arn = importlib.import_module("ironlink.fused.all_reduce_rmsnorm")
    assert arn.plan(x, r, w, o, "cuda:0", 4, 132, mode="split").lamport is tuning.RMSNORM_SPLIT_LAMPORT
    flipped = tuning.RmsnormConfig(split_lamport=not tuning.RMSNORM_SPLIT_LAMPORT)
    assert arn.plan(x, r, w, o, "cuda:0", 4, 132, mode="split", config=flipped).lamport is flipped.split_lamport




def test_all_reduce_says_the_heap_bytes_its_lamport_path_takes() -> None:
    # The decode sizes go through lamport slots (issue 62: size the heap before the first call):
    # 2 x (world - 1) copies of the message and the launch counters, up to the table's lamport
    # limit; past it the device library's all-reduce takes scratch memory only.
    counters = 4 * _abi.MAX_CTAS
    limit = max(lim for lim, path in decode_table.table_for(4).all_reduce if path == "lamport")
    assert ops.workspace_requests(16384, 2, 4) == {"all_reduce/lamport16": 6 * 16384, "all_reduce/epochs": counters}
    assert ops.workspace_requests(16384, 2, 4, multi_node=True) == {}
    assert ops.workspace_requests(limit + 1, 2, 4) == {}
    assert ironlink.all_reduce.heap_bytes(0, 4) == 0
    assert ironlink.all_reduce.heap_bytes(16384, 4) == (2 * 131072 - 4096) + (2 * max(4096, counters) - 4096)
    # Any size past the limit needs what the limit needs, and fp32 names its own slots.
    assert ironlink.all_reduce.heap_bytes(1 << 30, 4) == ironlink.all_reduce.heap_bytes(limit, 4) > 0
    assert ops.workspace_requests(4096, 4, 2) == {"all_reduce/lamport32": 2 * 4096, "all_reduce/epochs": counters}
    # Tensors outside the heap: the staging workspace too, for the largest call.
    assert ironlink.all_reduce.heap_bytes(1 << 20, 4, outside_heap=True) == \
        ironlink.all_reduce.heap_bytes(1 << 20, 4) + (2 * (1 << 20) - 4096)


def test_all_reduce_stages_a_tensor_outside_the_heap(fake_torch: Any) -> None:
    # Any tensor in (issue 63): the device library's all-reduce reads the peers' copies at the
    # buffer's offset, so a tensor outside the heap goes through the heap workspace
    # (runtime.staging, at the same offset on every rank): copied in, reduced there, copied back.
    x, heap = _FakeTensor(4096, ptr=0x777000), _Heap()
    COPIES.clear()
    ironlink.all_reduce(x, heap=heap)
    (name, _, args, _), = fake_torch.launches
    assert name == "all_reduce" and args[1].ptr == STAGED and args[2] == 4096
    assert COPIES == [(STAGED, 0x777000), (0x777000, STAGED)]
    # A heap tensor is reduced where it is, and without heap= a foreign tensor is still refused.
    heap.mine.add(id(x))
    ironlink.all_reduce(x, heap=heap)
    assert fake_torch.launches[-1][2][1] is x and len(COPIES) == 2
    with pytest.raises(IronlinkError, match=r"t is not in a symmetric heap ironlink knows of"):
        ironlink.all_reduce(_FakeTensor(8, ptr=0x999000))

