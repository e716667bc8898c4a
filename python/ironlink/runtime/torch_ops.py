"""What every `torch.ops.ironlink.*` operator shares (the host-level collectives', the fused ops',
MoeExchange's): the library's name, the heap as an int handle (custom operators take no Python
objects) and back. A tensor that Inductor handed over as a copy of a heap tensor is staged
through a heap workspace (`runtime.staging`)."""

from __future__ import annotations

from typing import Any

import torch

from . import handles
from .errors import IronlinkError
from .registry import holds
from .staging import LIB


def handle_of(heap: Any) -> int:
    """The heap's handle, or NO_HANDLE for None (traced by Dynamo: a property read)."""
    return handles.NO_HANDLE if heap is None else int(heap.handle)


def heap_of(handle: int, t: torch.Tensor, op: str) -> Any:
    """The heap an operator runs on: the one behind `handle`; without one, the heap holding `t`,
    else the only open heap on `t`'s device (`t` may be Inductor's copy of a heap tensor)."""
    what = f"torch.ops.{LIB}.{op}"
    if handle != handles.NO_HANDLE:
        return handles.lookup(handle, what)
    from .heap import SymmetricHeap

    heaps = handles.live(SymmetricHeap)
    found = [h for h in heaps if holds(h, t)]
    if not found:
        found = [h for h in heaps if not h.closed and h.device == t.device]
    if len(found) != 1:
        raise IronlinkError(f"{what}: cannot tell which symmetric heap to use ({len(found)} open heaps on "
                            f"{t.device} hold none of its tensors): pass heap= under torch.compile")
    return found[0]


def refuse_allocation(what: str, argument: str) -> None:
    """Raised while tracing: a heap allocation is collective and cannot be part of a graph."""
    raise ValueError(f"{what} under torch.compile needs {argument}= given (allocate it once with "
                     "SymmetricHeap.empty outside the compiled function): a heap allocation cannot be traced")


__all__ = ["LIB", "handle_of", "heap_of", "refuse_allocation"]
