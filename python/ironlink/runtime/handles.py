"""What a torch.compile graph carries in place of ironlink's Python objects, and whether Dynamo
is tracing.

PyTorch custom operators take tensors, numbers and strings, never Python objects: a compiled
graph cannot hold a `SymmetricHeap` or a `MoeExchange`. Each of them registers itself here when
it is created and gets an int handle, which the operators of `ironlink.ops.torch_library`
(and `fused.torch_library`, `moe.torch_library`) take and look up when they run. The table holds
its objects weakly: a handle never keeps a heap alive, and a handle whose object is gone raises.
Handles count up from 0 in creation order, so ranks that create the same objects in the same
order (as collectives require) hold the same handles.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

from .errors import IronlinkError

# handle -> object, weakly; the counter that numbers them.
_OBJECTS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_NEXT = itertools.count()

NO_HANDLE = -1  # "no object given": the operator finds the heap from its tensors when it runs


def register(obj: Any) -> int:
    """A new handle for `obj` (a SymmetricHeap or MoeExchange, at its creation)."""
    handle = next(_NEXT)
    _OBJECTS[handle] = obj
    return handle


def lookup(handle: int, what: str) -> Any:
    """The object behind `handle`, or IronlinkError naming `what` (the operator) if it is gone."""
    obj = _OBJECTS.get(handle)
    if obj is None:
        raise IronlinkError(f"{what}: handle {handle} names no live ironlink object (a heap or MoeExchange "
                            "that was garbage-collected before the compiled graph ran)")
    return obj


def live(kind: type) -> list[Any]:
    """The live registered objects of type `kind`, in creation order."""
    return [obj for _, obj in sorted(_OBJECTS.items()) if isinstance(obj, kind)]


def compiling() -> bool:
    """Whether Dynamo (torch.compile) is tracing the caller: the public functions then route through
    the registered operators, whose checks and launches run when the compiled graph runs. Only
    called by functions that take tensors, so torch is there."""
    import torch

    return bool(torch.compiler.is_compiling())


__all__ = ["NO_HANDLE", "compiling", "live", "lookup", "register"]
