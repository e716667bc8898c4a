"""What the host ops check about a tensor argument, as pure functions over `TensorSpec`s (name,
shape, dtype name, pointer), so that every check is testable without torch or a GPU: the dtype
and reduce-op codes the device library takes, contiguity, the heap's device, overlap."""

from __future__ import annotations

from typing import Any, NamedTuple, Union

from ..language import _abi

# torch dtype names (without "torch.") -> ironlink dtype codes.
DTYPES: dict[str, int] = {name: _abi.DTYPE[key] for name, key in
                          (("float32", "FLOAT32"), ("float16", "FLOAT16"), ("bfloat16", "BFLOAT16"))}
REDUCE_OPS: dict[str, int] = {name.lower(): code for name, code in _abi.REDUCE_OP.items()}


class TensorSpec(NamedTuple):
    """What the checks need to know about a tensor; `from_tensor` builds one from torch."""

    name: str  # the argument's name, for messages
    shape: tuple[int, ...]
    dtype: str  # torch's name without "torch.": "bfloat16"
    itemsize: int
    contiguous: bool
    device: str  # "cuda:0"
    data_ptr: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @staticmethod
    def from_tensor(t: Any, name: str) -> "TensorSpec":
        import torch

        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        return TensorSpec(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), t.element_size(),
                          t.is_contiguous(), str(t.device), t.data_ptr())


def dtype_code(t: TensorSpec) -> int:
    code = DTYPES.get(t.dtype)
    if code is None:
        raise TypeError(f"{t.name} has dtype {t.dtype}; ironlink collectives support {', '.join(DTYPES)}")
    return code


def reduce_op_code(op: Union[str, int]) -> int:
    """"sum"/"max"/"min"/"prod"/"avg" (any case) or a REDUCE_OP_* value -> the op code."""
    if isinstance(op, str) and op.lower() in REDUCE_OPS:
        return REDUCE_OPS[op.lower()]
    value = getattr(op, "value", op)  # ironlink.constants are tl.constexpr
    if isinstance(value, int) and not isinstance(value, bool) and value in REDUCE_OPS.values():
        return value
    raise ValueError(f"op must be one of {', '.join(map(repr, REDUCE_OPS))} (or a REDUCE_OP_* code), got {op!r}")


def reduce_op_name(code: int) -> str:
    """A REDUCE_OP_* code -> its name ("sum", ...)."""
    return next(name for name, c in REDUCE_OPS.items() if c == code)


def check_tensor(t: TensorSpec, device: str) -> int:
    """`t`'s dtype code, after checking it is supported, contiguous and on the heap's `device`."""
    code = dtype_code(t)
    if not t.contiguous:
        raise ValueError(f"{t.name} must be contiguous (the device functions take a flat range), shape {t.shape}")
    if t.device != device:
        raise ValueError(f"{t.name} is on {t.device}, but the symmetric heap is on {device}")
    return code


def overlap(a: TensorSpec, b: TensorSpec) -> bool:
    """Whether the byte ranges of `a` and `b` share a byte."""
    return a.nbytes > 0 and b.nbytes > 0 and a.data_ptr < b.data_ptr + b.nbytes and b.data_ptr < a.data_ptr + a.nbytes


__all__ = ["DTYPES", "REDUCE_OPS", "TensorSpec", "check_tensor", "dtype_code", "overlap", "reduce_op_code", "reduce_op_name"]
