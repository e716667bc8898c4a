"""Which symmetric heap holds a tensor, for the host-level calls that take `heap=None`.

SymmetricHeap keeps no list of its instances: the heaps a call was shown (`heap=`) are remembered
here, weakly, so the registry never keeps a heap alive (its lifetime stays the user's), and a
later call finds the heap from its tensor alone.
"""

from __future__ import annotations

import weakref
from typing import Any

from .errors import IronlinkError

# Heaps seen through `heap=`, held weakly.
_HEAPS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def holds(heap: Any, t: Any) -> bool:
    """Whether `t` lies in one of `heap`'s live allocations (never for a closed heap)."""
    if heap.closed:
        return False
    try:
        heap._local_offset(t, "")  # the heap's own check
    except IronlinkError:
        return False
    return True


def heap_for(first: Any, name: str, heap: Any, collective: str) -> Any:
    """`heap` if given (and remembered), else the remembered heap holding `first`; IronlinkError
    naming the call if that heap is closed or its process group destroyed."""
    if heap is not None:
        heap.usable(f"ironlink.{collective}")
        _HEAPS.add(heap)
        return heap
    found = next((h for h in list(_HEAPS) if holds(h, first)), None)
    if found is None:
        raise IronlinkError(
            f"ironlink.{collective}: {name} is not in a symmetric heap ironlink knows of; allocate it "
            "with SymmetricHeap.empty and pass heap=<that heap> (ironlink remembers heaps passed "
            "before, so once per heap is enough; a closed heap, or one whose process group was "
            "destroyed, holds nothing)"
        )
    return found


def in_heap(heap: Any, collective: str, *tensors: tuple[Any, str]) -> None:
    """IronlinkError naming the call and the argument for the first tensor not in `heap`."""
    for t, name in tensors:
        heap._local_offset(t, f"ironlink.{collective}({name})")


__all__ = ["heap_for", "holds", "in_heap"]
