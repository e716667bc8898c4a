"""Shared by the fused ops' CPU tests (test_fused.py, test_fused_rmsnorm.py): the ops' host
modules, and TensorSpec stand-ins for the tensors their plans check, without torch or a GPU."""

from __future__ import annotations

import importlib

from ironlink.runtime.tensor_spec import TensorSpec

# The fused host modules named after their ops (the package's attributes of those names are the ops).
arn = importlib.import_module("ironlink.fused.all_reduce_rmsnorm")
agm = importlib.import_module("ironlink.fused.all_gather_matmul")
mar = importlib.import_module("ironlink.fused.matmul_all_reduce")
mrs = importlib.import_module("ironlink.fused.matmul_reduce_scatter")

DEV = "cuda:0"


def spec(name: str, shape: tuple[int, ...], dtype: str = "bfloat16", ptr: int = 0, contiguous: bool = True) -> TensorSpec:
    size = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "float8_e4m3fn": 1}[dtype]
    return TensorSpec(name, shape, dtype, size, contiguous, DEV, ptr)


def rms_specs(tokens: int, hidden: int = 8192) -> tuple[TensorSpec, TensorSpec, TensorSpec, TensorSpec]:
    """all_reduce_rmsnorm's x, residual, weight and out for `tokens` rows of `hidden` (bf16, apart)."""
    return (spec("x", (tokens, hidden), ptr=1 << 20), spec("residual", (tokens, hidden), ptr=2 << 30),
            spec("weight", (hidden,), ptr=3 << 30), spec("out", (tokens, hidden), ptr=4 << 30))


def rms(tokens: int = 8, hidden: int = 8192, **kw: object) -> arn.Plan:
    args: dict[str, object] = dict(zip(("x", "residual", "weight", "out"), rms_specs(tokens, hidden)))
    args.update(kw)
    return arn.plan(args["x"], args["residual"], args["weight"], args["out"], DEV, 4, 132)  # type: ignore[arg-type]
