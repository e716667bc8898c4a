"""Reports of every rank meeting in torch.distributed's key-value store, each rank waiting a
bounded time for the others: the heap's asymmetry reports (`heap_calls`) and the checked calls'
comparison (`call_check`). Pure Python (no torch): the CPU tests run it with a fake store."""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any, Optional, TypeVar

T = TypeVar("T")

# How long a report waits for the peers' by default (they publish theirs when they raise the same
# error, which every rank that ran the call records).
EXCHANGE_TIMEOUT_S = 5.0


def exchange(store: Any, prefix: str, rank: int, world: int, mine: T,
             timeout_s: float = EXCHANGE_TIMEOUT_S) -> list[Optional[T]]:
    """Publishes this rank's report `mine` (picklable) under `prefix` in `store` (torch.distributed's
    key-value store, or anything with its set / get / wait) and returns every rank's, None for a
    rank that did not publish within `timeout_s` (after one has timed out, the others count only
    if they are already there)."""
    store.set(f"{prefix}/{rank}", pickle.dumps(mine))
    out: list[Optional[T]] = []
    waited_out = False  # after one timeout, take only what is already there
    for r in range(world):
        if r == rank:
            out.append(mine)
            continue
        key = f"{prefix}/{r}"
        there = store.check([key])
        if not there and not waited_out:
            try:
                store.wait([key], timedelta(seconds=timeout_s))
                there = True
            except Exception:  # noqa: BLE001 - a store timeout: that rank did not report
                waited_out = True
        out.append(pickle.loads(store.get(key)) if there else None)
    return out


__all__ = ["EXCHANGE_TIMEOUT_S", "exchange"]
