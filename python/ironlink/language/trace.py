"""Timestamps for the kernels' diagnostic launches (the fused ops', MoeExchange's low-latency
ones): where each CTA's time goes.

A kernel built with TRACE=True stores the GPU's global timer (ns) at the points it names into
`trace` [grid, TRACE_SLOTS] (int64, zero-filled by the caller; slot 0 is the CTA's start);
bench/probes/fused_timeline.py launches them and summarizes. With TRACE=False (every library launch)
`stamp` compiles to nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

# Stamps per CTA: the start, then 2 or 3 per tile (up to 21 tiles), then one at the end (a constexpr:
# kernels read it).
TRACE_SLOTS = tl.constexpr(64)


@triton.jit
def stamp(trace, slot, TRACE: tl.constexpr):
    """Stores the global timer into this CTA's `slot` (if TRACE and the slot exists)."""
    if TRACE:
        if slot < TRACE_SLOTS:
            tl.store(trace + tl.program_id(0) * TRACE_SLOTS + slot, tl_cuda.globaltimer())


__all__ = ["TRACE_SLOTS", "stamp"]
