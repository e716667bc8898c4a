"""The per-device buffers that host-level launches write their per-CTA statuses to.

One int32[MAX_CTAS] per device, shared by every call on it (`check=True` reads it right after
its own launch on the same stream). Allocated outside CUDA graph capture and kept, so a captured
graph's kernels write to memory that outlives the graph's private pool.
"""

from __future__ import annotations

from typing import Any

from ..language import _abi
from .errors import IronlinkError

# device index -> the status buffer.
_STATUS: dict[int, Any] = {}


def status_buffer(torch: Any, device: Any, capturing: bool, collective: str) -> Any:
    """The status buffer of `device`, allocated on first use (which capture forbids)."""
    buf = _STATUS.get(device.index)
    if buf is None:
        if capturing:
            raise IronlinkError(
                f"ironlink.{collective} is being captured into a CUDA graph before any ironlink collective ran "
                f"on {device}: call each one once outside capture first (that compiles its kernel and "
                "allocates the status buffer)"
            )
        buf = _STATUS[device.index] = torch.zeros(_abi.MAX_CTAS, dtype=torch.int32, device=device)
    return buf


__all__ = ["status_buffer"]
