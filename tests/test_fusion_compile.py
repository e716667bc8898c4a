"""The fused-kernel GPU tests' kernels (tests/gpu/fusion_kernels.py: a producer, the grid barrier
and a whole-tensor all-reduce in one kernel; a persistent kernel of tiles, each all-reduced as it
is written) compile for sm_80/90/100 with the bitcode linked and inlined, no GPU needed."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ironlink import _lib

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gpu"))
import fusion_kernels as fk  # noqa: E402  (tests/gpu is not a package)

KERNELS: dict[str, tuple[Any, dict[str, str], dict[str, Any]]] = {
    "produce_then_all_reduce": (
        fk.produce_then_all_reduce.fn,
        {"ctx": "i64", "x": "*bf16", "n": "i32", "rank": "i32", "seed": "i32", "dt": "constexpr", "out_dt": "constexpr",
         "status": "*i32", "BLOCK": "constexpr"},
        {"dt": 2, "out_dt": triton.language.bfloat16, "BLOCK": 256},
    ),
    "tiles_then_all_reduce": (
        fk.tiles_then_all_reduce.fn,
        {"ctx": "i64", "x": "*bf16", "rows": "i32", "cols": "i32", "stride": "i32", "rank": "i32", "seed": "i32",
         "dt": "constexpr", "out_dt": "constexpr", "status": "*i32", "TR": "constexpr", "TC": "constexpr"},
        {"dt": 2, "out_dt": triton.language.bfloat16, "TR": 32, "TC": 64},
    ),
}


@pytest.mark.parametrize("cc", (80, 90, 100))
@pytest.mark.parametrize("name", list(KERNELS))
def test_fused_kernel_compiles_and_inlines(name: str, cc: int) -> None:
    fn, signature, constexprs = KERNELS[name]
    bc = REPO / "build" / _lib.bitcode_filename(divmod(cc, 10))
    assert bc.is_file(), f"{bc} is missing: run `make all-archs` (make test does)"
    k = triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", cc, 32),
                       options={"extern_libs": (("ironlink", str(bc)),)})
    ptx = k.asm["ptx"]
    assert k.asm["cubin"]
    for sym in ("symm_grid_barrier", "symm_all_reduce", "symm_tile_all_reduce"):
        assert not re.search(rf"\bcall(\.uni)?\b[^;]*\b{sym}\b", ptx), f"{sym} was not inlined"
    local = [line.strip() for line in ptx.splitlines() if re.search(r"\.local\b", line)]
    assert not local, f"{name} uses local memory on sm_{cc}:\n" + "\n".join(local[:10])
