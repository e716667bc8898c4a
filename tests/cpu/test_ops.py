"""CPU tests of the host-level collectives (`ironlink.ops`) and their tuning: no GPU, no torch.

The argument checks are pure functions over `TensorSpec`s; `ironlink.tuning.choose` and the
generator `bench/report/make_tuning.py` are plain Python. The launches, over a fake torch, are
tests/cpu/test_host_calls.py; that the kernels compile is tests/compile/test_ops_compile.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import re
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import ironlink
from ironlink.language import _abi
from ironlink.ops import collectives as ops
from ironlink.runtime import registry, tuning
from ironlink.runtime.tuning import decode_table, op_config
from ironlink.ops import variable_all_to_all as a2av

from ironlink.runtime.errors import IronlinkError
from ironlink.ops import Plan
from ironlink.runtime import launch
from ironlink.runtime.tensor_spec import TensorSpec, reduce_op_code


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
