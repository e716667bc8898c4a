"""The float8 format the fused ops and MoeExchange quantize to: one definition of its range."""

from __future__ import annotations

import triton.language as tl

# The largest finite float8_e4m3fn: a scale of max|x| / FP8_MAX maps a row or group onto the
# format's range. A constexpr, so kernels read it; `.value` is the host's float.
FP8_MAX = tl.constexpr(448.0)

__all__ = ["FP8_MAX"]
