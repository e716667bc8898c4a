"""`ironlink.runtime.compile_ahead`: a kernel recorded as it compiles, compiled again in another
process into a fresh Triton cache, is found there by the launch (no compile), with no GPU."""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import triton.language as tl

import ironlink
import ironlink.language as il
from triton import knobs
from triton.runtime import driver
from triton.runtime.jit import MockTensor

from ironlink.fused.barrier import _barrier_kernel
from ironlink.language import _nvshmem
from ironlink.language._lib import bitcode_path
from ironlink.runtime import compile_ahead, compile_records

from _archs import CAPABILITIES  # tests/, beside this file
from _nvshmem_wheel import ironlinks_part  # tests/, beside this file
from _compile import fresh_triton_cache  # noqa: F401 - the fixture applies here

ARCH = 90 if 90 in CAPABILITIES else CAPABILITIES[0]


def _launch_compile(monkeypatch: pytest.MonkeyPatch, kernel: Any = _barrier_kernel) -> Any:
    """What a launch of `kernel` (ctx, out: int32) compiles (a warmup: the launch's path up to the
    kernel's run), from empty in-memory caches, so only Triton's on-disk cache can spare the compile."""
    monkeypatch.setattr(kernel.fn, "device_caches", defaultdict(kernel.fn.create_binder))
    monkeypatch.setattr(kernel, "_paths", {})
    return kernel.warmup(2**40, MockTensor(tl.int32), grid=(1,))


def _files(cache: Path) -> dict[Path, int]:
    """What Triton's on-disk cache holds, with each file's time: a compile adds or rewrites one."""
    return {p: p.stat().st_mtime_ns for p in cache.rglob("*")}


def _libraries(specialization: str) -> dict[str, str]:
    return dict(json.loads(specialization)["options"]["extern_libs"])


def _moved_libraries(specialization: str, folder: str) -> str:
    data = json.loads(specialization)
    data["options"]["extern_libs"] = [[n, f"{folder}/{Path(p).name}"] for n, p in data["options"]["extern_libs"]]
    return json.dumps(data)


def test_a_library_missing_where_recorded_is_the_file_of_that_name_here() -> None:
    here = {"ironlink": bitcode_path(ARCH), "libdevice": compile_ahead._library_here(
        "libdevice", "/elsewhere/libdevice.10.bc", ARCH)}
    assert Path(here["libdevice"]).is_file()
    recorded = json.dumps({"options": {"extern_libs": [[n, f"/elsewhere/{Path(p).name}"] for n, p in here.items()]
                                       + [["other", "/elsewhere/no_such.bc"]], "num_warps": 4}})
    relocated = json.loads(compile_ahead._for_here(recorded, _barrier_kernel.fn, ARCH))
    assert relocated["options"]["num_warps"] == 4
    assert relocated["options"]["extern_libs"] == [*map(list, here.items()), ["other", "/elsewhere/no_such.bc"]]
    again = compile_ahead._for_here(json.dumps(relocated), _barrier_kernel.fn, ARCH)
    assert again == json.dumps(relocated)  # found: kept


def test_a_kernel_of_a_script_run_as_main_is_compiled_ahead_under_its_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script's kernels compile as __main__'s, and the record names the script's module
    (collectives_worker's): compiled ahead under that module, the script's launch still finds it."""
    script = Path(__file__).with_name("_script_kernel.py")
    cache = tmp_path / "cache"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "PYTHONPATH": os.pathsep.join(sys.path)}

    def run(mode: str, *rest: str) -> None:
        subprocess.run([sys.executable, str(script), mode, str(ARCH), *rest], env=env, check=True)

    record = tmp_path / "record.jsonl.gz"
    run("record", str(record))
    (entry,) = compile_ahead.read(record)
    assert (entry.module, entry.qualname) == ("_script_kernel", "script_kernel")
    assert json.loads(entry.specialization)["name"] == "__main__.script_kernel"

    shutil.rmtree(cache)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    monkeypatch.syspath_prepend(str(script.parent))
    done = compile_ahead.compile_ahead([entry], ARCH, processes=1)
    assert (done.compiled, done.failures) == (1, [])
    ahead = _files(cache)
    run("launch")
    assert _files(cache) == ahead  # a hit: nothing written


def test_a_recorded_kernel_compiled_ahead_is_what_the_launch_loads(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "_active", compile_ahead._TargetOnly(ARCH))
    seen: list[str] = []  # a hook set before the recorder still runs

    def earlier_hook(**kw: Any) -> None:
        seen.append(kw["fn"].name)

    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", earlier_hook)
    recorder = compile_ahead.Recorder()
    recorder.case = "a barrier"
    recorder.start()
    _launch_compile(monkeypatch)
    recorder.stop()
    assert knobs.runtime.jit_post_compile_hook is earlier_hook and seen == ["_barrier_kernel"]
    (entry,) = recorder.entries.values()
    assert (entry.module, entry.qualname, entry.case) == ("ironlink.fused.barrier", "_barrier_kernel", "a barrier")

    # As recorded in another checkout and environment: the libraries' files are not where it
    # found them, but the same files are here.
    entry = entry._replace(specialization=_moved_libraries(entry.specialization, "/elsewhere"))
    record = tmp_path / "record.jsonl.gz"
    missing = compile_ahead.Entry("ironlink.fused.barrier", "no_such_kernel", entry.specialization)
    compile_ahead.write(record, [entry, entry, missing])
    assert compile_ahead.read(record) == [entry, missing]  # repeats dropped, sorted
    compile_ahead.append(record, [missing._replace(case="later"), entry._replace(qualname="appended")])
    assert compile_ahead.read(record) == [entry, missing, entry._replace(qualname="appended")]
    compile_ahead.write(record, [entry, missing])
    assert compile_ahead.read(tmp_path / "absent.jsonl.gz") == []

    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    done = compile_ahead.compile_ahead(compile_ahead.read(record), ARCH, processes=2)
    assert done.compiled == 1
    assert len(done.failures) == 1 and "no_such_kernel" in done.failures[0]
    ahead = _files(cache)
    assert any(p.suffix == ".cubin" for p in ahead)

    compiled = _launch_compile(monkeypatch)
    # A compile would have written a directory of its own (another key); a hit only reads.
    assert _files(cache) == ahead
    assert compiled.asm["cubin"]


def test_a_program_records_each_ranks_compiles_and_its_next_run_compiles_them_ahead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `init_distributed` does with $IRONLINK_COMPILE_RECORD, then $IRONLINK_COMPILE_AHEAD."""
    monkeypatch.setattr(driver, "_active", compile_ahead._TargetOnly(ARCH))
    monkeypatch.setattr(compile_records, "program_name", lambda: "prog")
    records = tmp_path / "records"

    def start(rank: int, env: str, cache: str) -> Any:
        monkeypatch.setattr(compile_records, "_started", False)
        for name in (compile_records.ENV_AHEAD, compile_records.ENV_RECORD):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv(env, str(records))
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / cache))
        return compile_records.start_program(rank, 2, 2, False, ARCH)

    assert start(1, compile_records.ENV_RECORD, "first") is None
    assert compile_records.start_program(1, 2, 2, False, ARCH) is None  # once a process
    try:
        _launch_compile(monkeypatch)
    finally:
        assert compile_records._recorder is not None
        compile_records._recorder.stop()
    assert [p.name for p in records.iterdir()] == [f"prog-w2-sm{ARCH}.rank1.jsonl.gz"]
    (entry,) = compile_records.records_of(records, compile_records.record_name("prog", 2, False, ARCH))
    assert entry.qualname == "_barrier_kernel"

    assert start(1, compile_records.ENV_AHEAD, "second") == compile_ahead.Summary(0, mock.ANY, [])  # rank 0's
    done = start(0, compile_records.ENV_AHEAD, "second")
    assert done is not None and (done.compiled, done.failures) == (1, [])
    cache = tmp_path / "second"
    ahead = _files(cache)
    _launch_compile(monkeypatch)
    assert _files(cache) == ahead


def test_a_program_on_its_own_gpus_compiles_ahead_what_shared_gpus_recorded(tmp_path: Path) -> None:
    """A world's first run on its own GPUs (no record of that setting yet) takes the record that
    a run on shared GPUs left, and the other way; its own setting's record where there is one."""
    def entry(name: str) -> compile_ahead.Entry:
        return compile_ahead.Entry("m", name, "{}")

    shared = compile_records.record_name("prog", 4, True, ARCH).removesuffix(".jsonl.gz")
    compile_ahead.write(tmp_path / f"{shared}.rank0.jsonl.gz", [entry("a")])
    compile_ahead.write(tmp_path / f"{shared}.rank1.jsonl.gz", [entry("b")])
    for here in (False, True):
        name = compile_records.nearest_record(tmp_path, "prog", 4, here, ARCH)
        assert name == f"{shared}.jsonl.gz"
        assert [e.qualname for e in compile_records.records_of(tmp_path, name)] == ["a", "b"]
    own = compile_records.record_name("prog", 4, False, ARCH)
    compile_ahead.write(tmp_path / own, [entry("c")])
    assert compile_records.nearest_record(tmp_path, "prog", 4, False, ARCH) == own
    assert compile_records.records_of(tmp_path, own) == [entry("c")]
    no_record = compile_records.nearest_record(tmp_path, "prog", 2, False, ARCH)
    assert no_record == compile_records.record_name("prog", 2, False, ARCH)  # no world 2 record: nothing
    assert compile_records.records_of(tmp_path, no_record) == []


def test_a_programs_name_is_its_script_or_the_module_run(monkeypatch: pytest.MonkeyPatch) -> None:
    main = types.ModuleType("__main__")
    main.__spec__ = None  # a script: `python bench/fused.py`
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", ["/somewhere/bench/fused.py", "--ops", "x"])
    assert compile_records.program_name() == "fused"
    main.__spec__ = importlib.machinery.ModuleSpec("ironlink.tune.__main__", None)  # python -m ironlink.tune
    assert compile_records.program_name() == "ironlink.tune"
    assert compile_records.record_name("fused", 4, True, 90) == "fused-w4-shared-sm90.jsonl.gz"
    assert compile_records.record_name("ironlink.tune", 2, False, 100) == "ironlink.tune-w2-sm100.jsonl.gz"


@ironlink.jit(nvshmem=True)
def nvshmem_pe_kernel(ctx, out):
    tl.store(out, il.symm_nvshmem_my_pe(0) + il.symm_rank(ctx))


def test_an_nvshmem_linked_kernel_recorded_elsewhere_compiles_ahead_into_what_the_launch_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three libraries (ironlink's NVSHMEM bitcode, NVSHMEM's, libdevice), each recorded where
    another machine had it: the nvshmem suite's records (its several-node kernels) are such."""
    monkeypatch.setattr(driver, "_active", compile_ahead._TargetOnly(ARCH))
    monkeypatch.setenv(_nvshmem.ENV_NVSHMEM_BITCODE, str(ironlinks_part()))
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    # A launch registers the kernel with NVSHMEM's module-init hook: in a registry of this test's,
    # the hook off Triton's chain afterwards (test_nvshmem_link checks the chain).
    for name, value in (("_kernel_names", set()), ("_hook_added", False)):
        monkeypatch.setattr(_nvshmem, name, value)
    monkeypatch.setattr(nvshmem_pe_kernel, "_registered", False)
    try:
        _compile_nvshmem_kernel_ahead(tmp_path, monkeypatch)
    finally:
        if _nvshmem._on_load in knobs.runtime.kernel_load_end_hook.calls:
            knobs.runtime.kernel_load_end_hook.remove(_nvshmem._on_load)


def _compile_nvshmem_kernel_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "first"))
    recorder = compile_ahead.Recorder()
    recorder.start()
    try:
        _launch_compile(monkeypatch, nvshmem_pe_kernel)
    finally:
        recorder.stop()
    (entry,) = recorder.entries.values()
    assert [n for n in _libraries(entry.specialization)] == ["ironlink", _nvshmem.LIB_NAME, "libdevice"]
    moved = entry._replace(specialization=_moved_libraries(entry.specialization, "/elsewhere"))

    cache = tmp_path / "second"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    done = compile_ahead.compile_ahead([moved], ARCH, processes=1)
    assert (done.compiled, done.failures) == (1, [])
    ahead = _files(cache)
    assert _launch_compile(monkeypatch, nvshmem_pe_kernel).asm["cubin"]
    assert _files(cache) == ahead
