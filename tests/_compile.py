"""What the compile tests share (a helper, no tests of its own): the repository root, a private
Triton cache per test module (`fresh_triton_cache`: import it into a module and it applies there),
the built bitcode of an arch, `compile_for` (a Triton kernel to cubin against it, no GPU),
`ttir_for` (the same, stopped at its TTIR), `ptxas_log` (the `ptxas -v` report of a compile) and `extern_calls` (the device calls a kernel's TTIR makes, with their constant arguments), and the
signature of `allreduce_rmsnorm_kernel` (`RMSNORM_SIGNATURE`) that the compile tests build on."""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ironlink.language import _abi, _lib

REPO = Path(__file__).resolve().parents[1]
# ironlink.fused.allreduce_rmsnorm_kernel's arguments, bf16 tensors (a case overrides what differs).
RMSNORM_SIGNATURE = {"ctx": "i64", "x": "*bf16", "residual": "*bf16", "residual_out": "*bf16", "weight": "*bf16",
                     "out": "*bf16", "scale": "*fp32", "T": "i32", "H": "i32", "eps": "fp32", "status": "*i32",
                     "trace": "*i64", "ws": "*bf16", "epochs": "*i32", "inbox": "*bf16", "half": "i32",
                     "WHOLE": "constexpr", "BLOCK_H": "constexpr", "FP8": "constexpr", "PDL": "constexpr",
                     "PRELOAD": "constexpr", "TRACE": "constexpr", "ROWS": "constexpr", "PUSH": "constexpr",
                     "WORLD": "constexpr", "SPLIT": "constexpr", "PARTS": "constexpr", "W": "i32",
                     "LAMPORT": "constexpr", "TWO_SHOT": "constexpr", "PUSH_TWO_SHOT": "constexpr",
                     "BLOCK_C": "constexpr"}


@pytest.fixture(scope="module", autouse=True)
def fresh_triton_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # Triton's cache key covers the kernel source and the bitcode's hash, not our wrapper code:
    # a private cache makes every run compile from scratch.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        yield


def bitcode(cc: int) -> str:
    path = REPO / "build" / _lib.bitcode_filename(divmod(cc, 10))
    assert path.is_file(), f"{path} is missing: run `make all-archs` (make test does)"
    return str(path)


def compile_for(cc: int, fn: Any, signature: dict[str, Any], constexprs: dict[str, Any], **options: Any) -> Any:
    options.setdefault("extern_libs", (("ironlink", bitcode(cc)),))
    try:
        return triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", cc, 32), options=options)
    except ValueError as e:
        if "Failed to parse library" not in str(e):
            raise
        pytest.fail(
            f"{e}: the LLVM inside Triton {triton.__version__} cannot read this bitcode "
            "(see tests/compile/test_bitcode.py::test_no_attributes_tritons_llvm_cannot_read)",
            pytrace=False,
        )


@contextlib.contextmanager
def ptxas_log() -> Iterator[io.StringIO]:
    """Collects the `ptxas -v` report (registers, spills, stack frame) of what Triton compiles in
    the block. Triton runs ptxas with -v itself and prints the report where TRITON_DUMP_PTXAS_LOG is
    set (3.5 to 3.9), so the report is of the cubin Triton made, flags and all, and ptxas runs once:
    running it again on the PTX took a third of the spill tests' time. A cache of the block's own
    makes sure ptxas does run (a kernel from the cache prints nothing)."""
    report = io.StringIO()
    with tempfile.TemporaryDirectory() as cache, pytest.MonkeyPatch.context() as mp, \
            contextlib.redirect_stdout(report):
        mp.setenv("TRITON_CACHE_DIR", cache)
        mp.setenv("TRITON_DUMP_PTXAS_LOG", "1")
        yield report


class _TtirReady(Exception):
    """Raised by the ttir stage `ttir_for` installs, carrying the module's text."""

    def __init__(self, ttir: str) -> None:
        super().__init__("ttir ready")
        self.ttir = ttir


def ttir_for(cc: int, fn: Any, signature: dict[str, Any], constexprs: dict[str, Any], **options: Any) -> str:
    """`compile_for` stopped after Triton's TTIR stage: the text of the TTIR, which is all a test of
    the device calls a kernel makes needs. Lowering to PTX and ptxas, which it skips, take most of
    a compile (about 15 s of a test that traced every collective). A kernel that Triton's cache
    already holds comes from there whole."""
    from triton.backends.nvidia.compiler import CUDABackend

    shipped = CUDABackend.add_stages

    def add_stages(self: Any, stages: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        shipped(self, stages, *args, **kwargs)
        make_ttir = stages["ttir"]

        def ttir_then_stop(src: Any, metadata: Any) -> Any:
            raise _TtirReady(str(make_ttir(src, metadata)))

        stages["ttir"] = ttir_then_stop

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CUDABackend, "add_stages", add_stages)
        try:
            return str(compile_for(cc, fn, signature, constexprs, **options).asm["ttir"])
        except _TtirReady as ready:
            return ready.ttir


def extern_calls(ttir: str) -> dict[str, list[dict[str, Any]]]:
    """symbol -> for each call, its arguments by C name: the int for integer constants, else the SSA name."""
    consts = {name: int(v) for name, v in re.findall(r"(%[\w.]+) = arith\.constant (-?\d+) : i(?:32|64)", ttir)}
    calls: dict[str, list[dict[str, Any]]] = {}
    for operands, symbol in re.findall(r'tt\.extern_elementwise ([^{]*)\{[^}]*symbol = "(\w+)"', ttir):
        names = [a for a, _ in _abi.FUNCTIONS[symbol][0]]
        values = [consts.get(o.strip(), o.strip()) for o in operands.split(",")]
        calls.setdefault(symbol, []).append(dict(zip(names, values)))
    return calls
