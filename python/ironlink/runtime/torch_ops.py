"""What every `torch.ops.ironlink.*` operator shares (the host-level collectives', the fused ops',
MoeExchange's): the library's name, the heap as an int handle (custom operators take no Python
objects) and back, and the staging of a tensor that Inductor handed over as a copy of a heap
tensor: it goes through a heap workspace of its own (`on_heap`), and the results are copied back
(`copy_back`), so the op computes the same bits at the cost of two copies. Staging allocates from
the heap on its first use, identically on every rank, since every rank compiles the same graph."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from . import handles
from .errors import IronlinkError
from .registry import holds

LIB = "ironlink"


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


def on_heap(heap: Any, op: str, tensors: Sequence[Optional[torch.Tensor]]) -> list[Optional[torch.Tensor]]:
    """`tensors` with each one that is not in `heap` replaced by a copy in a heap workspace of its
    own (one per operator and argument position, kept by the heap between calls)."""
    staged: list[Optional[torch.Tensor]] = []
    for i, t in enumerate(tensors):
        if t is None or t.numel() == 0 or holds(heap, t):
            staged.append(t)
            continue
        if t.is_cuda:  # the copy writes heap memory: like a heap call, after the last one on another stream
            heap.stream_order.before_call(torch.cuda.current_stream(t.device), torch.cuda.is_current_stream_capturing())
        nbytes = t.numel() * t.element_size()
        ws = heap.workspace(f"torch.ops.{LIB}.{op}/{i}", nbytes)[:nbytes]
        staged.append(ws.view(t.dtype).view(t.shape).copy_(t))
    return staged


def copy_back(originals: Sequence[Optional[torch.Tensor]], staged: Sequence[Optional[torch.Tensor]]) -> None:
    """Writes the staged copies of the written tensors back to the operator's arguments."""
    for t, s in zip(originals, staged):
        if t is not None and s is not None and s is not t:
            t.copy_(s)


def refuse_allocation(what: str, argument: str) -> None:
    """Raised while tracing: a heap allocation is collective and cannot be part of a graph."""
    raise ValueError(f"{what} under torch.compile needs {argument}= given (allocate it once with "
                     "SymmetricHeap.empty outside the compiled function): a heap allocation cannot be traced")


__all__ = ["LIB", "copy_back", "handle_of", "heap_of", "on_heap", "refuse_allocation"]
