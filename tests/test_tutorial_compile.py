"""The tutorial (examples/tutorial/): every lesson imports without a GPU, every kernel in it compiles
for sm_90 with the ironlink bitcode linked and inlined, every lesson stays short enough to read,
and the list below covers every kernel the lessons define (a new kernel must be added here)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ironlink import IronlinkKernel, _lib

REPO = Path(__file__).resolve().parents[1]
TUTORIAL = REPO / "examples" / "tutorial"
LESSONS = sorted(TUTORIAL.glob("[0-9][0-9]_*.py"))
MAX_LINES = 130

# (lesson file, kernel name) -> [(signature, constexprs)]: each configuration is compiled.
KERNELS: dict[tuple[str, str], list[tuple[dict[str, str], dict[str, Any]]]] = {
    ("01_peer_store.py", "store_into_peers"): [
        ({"ctx": "i64", "board": "*fp32", "rank": "i32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 2048})],
    ("02_put_signal_wait.py", "ring_shift"): [
        ({"ctx": "i64", "outbox": "*fp32", "inbox": "*fp32", "epochs": "*i32", "rank": "i32", "world": "i32",
          "status": "*i32", "CHUNK": "constexpr"}, {"CHUNK": 16384})],
    ("02_put_signal_wait.py", "library_ring_shift"): [
        ({"ctx": "i64", "outbox": "*fp32", "inbox": "*fp32", "rank": "i32", "world": "i32", "status": "*i32",
          "CHUNK": "constexpr"}, {"CHUNK": 16384})],
    ("03_barrier.py", "all_reduce_by_stores"): [
        ({"ctx": "i64", "board": "*fp32", "out": "*fp32", "counters": "*i32", "epochs": "*i32", "rank": "i32",
          "world": "i32", "n": "i32", "status": "*i32", "BLOCK": "constexpr", "LIBRARY_BARRIER": "constexpr"},
         {"BLOCK": 4096, "LIBRARY_BARRIER": library}) for library in (False, True)],
    ("04_ring_all_gather.py", "ring_all_gather"): [
        ({"ctx": "i64", "out": "*fp32", "epochs": "*i32", "rank": "i32", "world": "i32", "n": "i32", "status": "*i32",
          "CHUNK": "constexpr"}, {"CHUNK": 16384})],
    ("05_ll_packets.py", "ll_all_gather"): [
        ({"ctx": "i64", "inp": "*fp32", "out": "*fp32", "mailbox": "*i64", "epochs": "*i32", "rank": "i32",
          "world": "i32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 1024})],
    ("05_ll_packets.py", "library_all_gather"): [
        ({"ctx": "i64", "inp": "*fp32", "out": "*fp32", "n": "i32", "status": "*i32"}, {})],
    ("06_all_reduce.py", "one_shot_all_reduce"): [
        ({"ctx": "i64", "x": "*fp32", "out": "*fp32", "n": "i32", "world": "i32", "status": "*i32",
          "BLOCK": "constexpr"}, {"BLOCK": 2048})],
    ("06_all_reduce.py", "two_shot_all_reduce"): [
        ({"ctx": "i64", "x": "*fp32", "out": "*fp32", "n": "i32", "rank": "i32", "world": "i32", "status": "*i32",
          "BLOCK": "constexpr"}, {"BLOCK": 2048})],
    ("07_fused_matmul_all_reduce.py", "matmul_all_reduce"): [
        ({"ctx": "i64", "a": "*fp16", "b": "*fp16", "out": "*fp16", "M": "i32", "N": "i32", "K": "i32",
          "status": "*i32", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}, {"BM": 64, "BN": 128, "BK": 64})],
    ("08_all_to_all.py", "all_to_all"): [
        ({"ctx": "i64", "inp": "*fp32", "out": "*fp32", "rank": "i32", "world": "i32", "n": "i32", "status": "*i32",
          "BLOCK": "constexpr"}, {"BLOCK": 4096})],
    ("08_all_to_all.py", "library_all_to_all"): [
        ({"ctx": "i64", "inp": "*fp32", "out": "*fp32", "n": "i32", "status": "*i32"}, {})],
}


def _load(path: Path) -> ModuleType:
    """The lesson as a module, without running main (its `if __name__ == "__main__"` is false)."""
    if str(TUTORIAL) not in sys.path:
        sys.path.insert(0, str(TUTORIAL))  # the lessons import _common as torchrun would find it
    spec = importlib.util.spec_from_file_location(f"tutorial_{path.stem}", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_eight_lessons_each_short() -> None:
    assert [p.name[:2] for p in LESSONS] == [f"{i:02d}" for i in range(1, 9)], [p.name for p in LESSONS]
    for p in LESSONS:
        lines = len(p.read_text().splitlines())
        assert lines <= MAX_LINES, f"{p.name} has {lines} lines; lessons stay under {MAX_LINES} to be read"


@pytest.mark.parametrize("path", LESSONS, ids=[p.name for p in LESSONS])
def test_every_kernel_is_listed(path: Path) -> None:
    mod = _load(path)
    defined = {name for name, v in vars(mod).items() if isinstance(v, IronlinkKernel)}
    listed = {k for f, k in KERNELS if f == path.name}
    assert defined == listed, f"{path.name} defines kernels {sorted(defined)}, the test lists {sorted(listed)}"


@pytest.mark.parametrize("key", list(KERNELS), ids=[f"{f[:2]}-{k}" for f, k in KERNELS])
def test_kernel_compiles_for_sm90(key: tuple[str, str]) -> None:
    kernel = getattr(_load(TUTORIAL / key[0]), key[1])
    bc = REPO / "build" / _lib.bitcode_filename((9, 0))
    assert bc.is_file(), f"{bc} is missing: run `make` (make test does)"
    for signature, given in KERNELS[key]:
        launch = {k: given[k] for k in ("num_warps", "num_stages") if k in given}
        constexprs = {k: v for k, v in given.items() if k not in launch}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(signature) if signature[n].startswith("*")}
        k = triton.compile(ASTSource(kernel.fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                           options={"extern_libs": (("ironlink", str(bc)),), **launch})
        assert k.asm["cubin"]
        calls = re.findall(r"\bcall(?:\.uni)?\b[^;]*\b(symm_\w+)", k.asm["ptx"])
        assert not calls, f"{key[1]}: {sorted(set(calls))} were not inlined"
