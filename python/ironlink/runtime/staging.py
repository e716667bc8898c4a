"""Ops putting a caller's tensors on the heap: a tensor that is not the heap's goes through a heap
workspace of its own (`on_heap`; Inductor's copy of a heap tensor under torch.compile, or any
tensor given to an op that takes one), and the results are copied back (`copy_back`), so the op
computes the same bits at the cost of two copies; an argument the caller did not pass is
allocated from the heap (`empty_for`). Staging allocates from the heap on its first use,
identically on every rank, since every rank makes the same calls. torch is imported where used."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Union

from .errors import IronlinkError
from .registry import holds

LIB = "ironlink"


def staging_name(op: str, i: int) -> str:
    """The heap workspace that stages argument position `i` of op `op`."""
    return f"torch.ops.{LIB}.{op}/{i}"


def on_heap(heap: Any, op: str, tensors: Sequence[Optional[Any]], read: bool = True) -> list[Optional[Any]]:
    """`tensors` with each one that is not in `heap` replaced by a copy in a heap workspace of its
    own (one per operator and argument position, kept by the heap between calls); `read=False`
    for tensors the op only writes: the workspace stands in for them without the copy in."""
    import torch

    staged: list[Optional[Any]] = []
    for i, t in enumerate(tensors):
        if t is None or t.numel() == 0 or holds(heap, t):
            staged.append(t)
            continue
        if t.is_cuda:  # the copy writes heap memory: like a heap call, after the last one on another stream
            heap.stream_order.before_call(torch.cuda.current_stream(t.device), torch.cuda.is_current_stream_capturing())
        nbytes = t.numel() * t.element_size()
        ws = heap.workspace(staging_name(op, i), nbytes)[:nbytes]
        view = ws.view(t.dtype).view(t.shape)
        staged.append(view.copy_(t) if read else view)
    return staged


def needs_staging(heap: Any, t: Optional[Any]) -> bool:
    """Whether the op argument `t` goes through a heap workspace: a tensor on the heap's GPU but
    outside the heap (any tensor in). One on another device is left to the op's checks, which
    name it."""
    return t is not None and str(t.device) == str(heap.device) and not holds(heap, t)


def copy_back(originals: Sequence[Optional[Any]], staged: Sequence[Optional[Any]]) -> None:
    """Writes the staged copies of the written tensors back to the operator's arguments."""
    for t, s in zip(originals, staged):
        if t is not None and s is not None and s is not t:
            t.copy_(s)


def empty_for(heap: Any, op: str, name: str, shape: Union[int, Iterable[int]], dtype: Any) -> Any:
    """`heap.empty` for the argument `name` that op `op` allocates when the caller passed none
    (collective as `empty`); out of memory names the op and the argument, and says how to avoid
    it."""
    try:
        return heap.empty(shape, dtype)
    except IronlinkError as e:
        raise IronlinkError(f"ironlink.{op}: {name} was not given, and allocating it from the heap failed "
                            f"(pass {name}= to use memory of your own): {e}") from e


__all__ = ["LIB", "copy_back", "empty_for", "needs_staging", "on_heap", "staging_name"]
