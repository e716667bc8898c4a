"""The host-level collectives' kernels (`ironlink.ops`: all_reduce, all_gather, reduce_scatter,
all_to_all_v) compile for sm_90 against the built bitcode, no GPU: each makes its one device call
with the dtype code of its tensors' type. Their plans and launches are tests/cpu/test_ops.py.
"""

from __future__ import annotations

import pytest

from ironlink.language import _abi
from ironlink.ops import collectives as ops
from ironlink.ops import variable_all_to_all as a2av

from _compile import compile_for, extern_calls, fresh_triton_cache  # noqa: F401 - the fixture applies here


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter"])
def test_kernels_compile(collective: str) -> None:
    kernel = getattr(ops, f"_{collective}_kernel")
    types = {"ctx": "i64", "buf": "*bf16", "inp": "*bf16", "out": "*bf16", "n": "i64", "op": "i32", "status": "*i32",
             "PDL": "constexpr"}
    sig = {name: types[name] for name in kernel.arg_names}
    ttir = compile_for(90, kernel.fn, sig, {"PDL": False} if "PDL" in sig else {}).asm["ttir"]
    symbol = f"symm_{collective}"
    (call,) = extern_calls(ttir)[symbol]
    assert call["dtype"] == _abi.DTYPE["BFLOAT16"]


def test_all_to_all_v_kernel_compiles_with_the_inputs_dtype() -> None:
    kernel = a2av._all_to_all_v_kernel
    types = {"ctx": "i64", "inp": "*fp16", "in_rows": "i64", "send_counts": "*i64", "out": "*fp16",
             "out_rows": "i64", "recv_counts": "*i64", "recv_offsets": "*i64", "row": "i64", "status": "*i32"}
    sig = {name: types[name] for name in kernel.arg_names}
    (call,) = extern_calls(compile_for(90, kernel.fn, sig, {}).asm["ttir"])["symm_all_to_all_v"]
    assert call["dtype"] == _abi.DTYPE["FLOAT16"]
