"""The argument checks of SymmetricHeap and of the contexts over PyTorch's memory: pure functions,
testable without torch or a GPU."""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence, Union


def check_size(name: str, value: Any, minimum: int) -> int:
    """`value` as an int >= minimum, or a ValueError/TypeError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int number of bytes, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_algorithm_limits(ar_one_shot_max_bytes: Any, ar_ll_max_bytes: Any, gather_ll_max_bytes: Any) -> tuple[int, int, int]:
    """The three algorithm size limits, checked (non-negative ints below 2^63)."""
    named = (("ar_one_shot_max_bytes", ar_one_shot_max_bytes), ("ar_ll_max_bytes", ar_ll_max_bytes),
             ("gather_ll_max_bytes", gather_ll_max_bytes))
    for name, v in named:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int number of bytes, got {type(v).__name__}")
        if not 0 <= v < 1 << 63:
            raise ValueError(f"{name} must be in [0, 2**63), got {v}")
    return ar_one_shot_max_bytes, ar_ll_max_bytes, gather_ll_max_bytes


def check_timeout(timeout_s: Any) -> int:
    """Seconds -> nanoseconds, validated."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"timeout_s must be positive and finite, got {timeout_s}")
    return max(1, int(timeout_s * 1e9))


def normalize_shape(shape: Union[int, Iterable[int]]) -> tuple[int, ...]:
    """`5` or `(2, 3)` or `torch.Size` -> a tuple of non-negative ints."""
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise ValueError(f"shape must be non-negative ints, got {shape!r}")
    return dims


def span_bytes(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> int:
    """Bytes from a strided tensor's first element to just past its last one."""
    if any(s == 0 for s in shape):
        return 0
    if any(st < 0 for st in strides):
        raise ValueError("tensors with negative strides are not supported")
    return (sum((n - 1) * st for n, st in zip(shape, strides)) + 1) * itemsize


__all__ = ["check_algorithm_limits", "check_size", "check_timeout", "normalize_shape", "span_bytes"]
