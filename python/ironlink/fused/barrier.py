"""A barrier of the heap's ranks enqueued on the current stream, for host code that orders the
ranks without waiting on the host (so it captures into a CUDA graph): the cuBLAS methods between
their transfers (`cublas_methods`), and a new copy-engine flag workspace before any peer sets a
flag in it (`copy_engine.flags_workspace`).
"""

from __future__ import annotations

from typing import Any

import triton.language as tl

from .. import language as il
from ..language.jit import jit
from ..runtime.launch import launch_with_status


@jit(do_not_specialize=["ctx"])
def _barrier_kernel(ctx, status):
    tl.store(status + tl.program_id(0), il.symm_barrier(ctx))


def device_barrier(heap: Any, check: bool) -> None:
    """A barrier of the heap's ranks on the current stream (one CTA; nothing waits on the host)."""
    launch_with_status("barrier", heap, 1, lambda status: _barrier_kernel[(1,)](heap.ctx, status), check,
                       function="symm_barrier")


__all__ = ["device_barrier"]
