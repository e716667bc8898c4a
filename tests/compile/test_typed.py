"""`ironlink.typed`: the dtype code that reaches each device call comes from the pointer's type.

Kernels are compiled for sm_90 with Triton's own compiler (no GPU), and the TTIR is read: every
`tt.extern_elementwise` call's `dtype` (and `reduce_op`) operand must be the expected constant.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import triton
import triton.language as tl

import ironlink.typed as ilt
from ironlink.language import _abi
from ironlink.constants import REDUCE_OP_MAX

from _compile import compile_for, extern_calls, fresh_triton_cache, ttir_for  # noqa: F401 - the fixture applies here

DTYPES = {"fp32": _abi.DTYPE["FLOAT32"], "fp16": _abi.DTYPE["FLOAT16"], "bf16": _abi.DTYPE["BFLOAT16"]}


@triton.jit
def _every_collective(ctx, x_ptr, y_ptr, n, status):
    tl.store(status + 0, ilt.all_reduce(ctx, x_ptr, n))
    tl.store(status + 1, ilt.all_reduce(ctx, x_ptr, n, op=REDUCE_OP_MAX))
    tl.store(status + 2, ilt.reduce_scatter(ctx, x_ptr, y_ptr, n, REDUCE_OP_MAX))
    tl.store(status + 3, ilt.all_gather(ctx, x_ptr, y_ptr, n))
    tl.store(status + 4, ilt.broadcast(ctx, x_ptr, n, 3))
    tl.store(status + 5, ilt.reduce(ctx, x_ptr, y_ptr, n, REDUCE_OP_MAX, 2))
    tl.store(status + 6, ilt.all_to_all(ctx, x_ptr, y_ptr, n))
    tl.store(status + 7, ilt.dtype_code(y_ptr))


@pytest.mark.parametrize("ty", list(DTYPES))
def test_dtype_code_follows_the_pointer(ty: str) -> None:
    sig = {"ctx": "i64", "x_ptr": f"*{ty}", "y_ptr": f"*{ty}", "n": "i64", "status": "*i32"}
    ttir = ttir_for(90, _every_collective, sig, {})
    calls = extern_calls(ttir)
    want = DTYPES[ty]
    every = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"]
    assert sorted(calls) == sorted(f"symm_{c}" for c in every), ttir
    for symbol, cs in calls.items():
        for c in cs:
            assert c["dtype"] == want, f"{symbol}: dtype operand {c['dtype']!r}, want {want}\n{ttir}"
    first, second = calls["symm_all_reduce"]
    assert first["byte_offset"] == 0
    assert first["reduce_op"] == _abi.REDUCE_OP["SUM"] and second["reduce_op"] == _abi.REDUCE_OP["MAX"]
    assert calls["symm_reduce_scatter"][0]["reduce_op"] == _abi.REDUCE_OP["MAX"]
    assert calls["symm_broadcast"][0]["root"] == 3
    assert calls["symm_reduce"][0]["reduce_op"] == _abi.REDUCE_OP["MAX"] and calls["symm_reduce"][0]["root"] == 2
    # dtype_code is a constexpr: it is stored as a constant, with no call behind it.
    assert re.search(rf"%[\w.]+ = arith\.constant {want} : i32", ttir)


@triton.jit
def _all_reduce_only(ctx, x_ptr, n, status):
    tl.store(status, ilt.all_reduce(ctx, x_ptr, n))


@triton.jit
def _all_gather_only(ctx, x_ptr, y_ptr, n, status):
    tl.store(status, ilt.all_gather(ctx, x_ptr, y_ptr, n))


@triton.jit
def _reduce_only(ctx, x_ptr, y_ptr, n, status):
    tl.store(status, ilt.reduce(ctx, x_ptr, y_ptr, n))


@triton.jit
def _address_not_pointer(ctx, x_ptr, n, status):
    tl.store(status, ilt.all_reduce(ctx, x_ptr.to(tl.int64, bitcast=True), n))


def _compile(kernel: Any, **types: str) -> Any:
    sig = {"ctx": "i64", **types, "n": "i64", "status": "*i32"}
    return compile_for(90, kernel, sig, {})


@pytest.mark.parametrize("ty", ["i32", "fp64", "i8"])
def test_unsupported_element_type_is_a_compile_error(ty: str) -> None:
    name = {"i32": "int32", "fp64": "fp64", "i8": "int8"}[ty]
    with pytest.raises(triton.CompilationError, match=rf"points to {name}.*supported element types: fp32, fp16, bf16"):
        _compile(_all_reduce_only, x_ptr=f"*{ty}")
    with pytest.raises(triton.CompilationError, match=rf"all_gather\(in_ptr\) points to {name}"):
        _compile(_all_gather_only, x_ptr=f"*{ty}", y_ptr=f"*{ty}")


def test_mixed_in_out_types_are_rejected() -> None:
    with pytest.raises(triton.CompilationError, match="in_ptr points to bf16 but out_ptr to fp32; they must match"):
        _compile(_all_gather_only, x_ptr="*bf16", y_ptr="*fp32")
    with pytest.raises(triton.CompilationError, match="reduce: in_ptr points to fp16 but out_ptr to bf16"):
        _compile(_reduce_only, x_ptr="*fp16", y_ptr="*bf16")


def test_an_address_is_not_enough() -> None:
    with pytest.raises(triton.CompilationError, match="must be a tensor pointer.*explicit dtype"):
        _compile(_address_not_pointer, x_ptr="*fp32")
