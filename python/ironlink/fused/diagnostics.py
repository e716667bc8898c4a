"""What a probe or benchmark may ask of a fused op's launch beyond the op's own choices."""

from __future__ import annotations

from typing import Any, NamedTuple


class Diagnostics(NamedTuple):
    """What a probe or benchmark asks of a fused op's launch beyond the op's own choices (bench/):
    `communicate=False` leaves the exchange out (the GEMM, with its barriers, alone); `trace` an
    int64 [ctas, TRACE_SLOTS] zero-filled tensor that the kernel stamps (TRACE=True). The ops
    launch with `NO_DIAGNOSTICS`."""

    communicate: bool = True
    trace: Any = None

    def untraced(self, op: str) -> bool:
        """`communicate`, for an op whose kernel has no trace stamps: a trace asked of it raises."""
        if self.trace is not None:
            raise ValueError(f"{op}'s kernel takes no trace")
        return self.communicate


NO_DIAGNOSTICS = Diagnostics()


__all__ = ["Diagnostics", "NO_DIAGNOSTICS"]
