"""What the host adds to a recorded failure's message where it can say more than the device's
code: for HEAP_ASYMMETRIC the first heap call that differs between the ranks (the heap's call
log, `heap_calls`), for TIMEOUT where ranks share a GPU unconfined, that (`unconfined_sharing`).
`SymmetricHeap.explain` applies it to every failure the heap raises (`check`, and the checked
host-level calls through `launch_with_status`)."""

from __future__ import annotations

from typing import Callable

from ..language import _abi
from .distributed import unconfined_sharing
from .errors import IronlinkError


def explained(e: IronlinkError, asymmetry: Callable[[IronlinkError], IronlinkError]) -> IronlinkError:
    """`e` with its note: `asymmetry(e)` for HEAP_ASYMMETRIC (called for nothing else: it meets
    the other ranks), the unconfined sharing for TIMEOUT where it applies; any other error as it is."""
    if e.status == _abi.STATUS["TIMEOUT"]:
        why = unconfined_sharing()
        return e if why is None else IronlinkError(f"{e}. {why}", status=e.status, function=e.function)
    if e.status == _abi.STATUS["HEAP_ASYMMETRIC"]:
        return asymmetry(e)
    return e


__all__ = ["explained"]
