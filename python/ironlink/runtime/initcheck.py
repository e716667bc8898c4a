"""Peers' heaps made visible to compute-sanitizer's initcheck (a diagnostic mode, off by default).

initcheck tracks what this process initialized: a peer's writes to its own heap (and its zeroing
of the whole heap at creation) do not reach it, so it reports every load from a peer's heap as
uninitialized (`bench/probes/initcheck_peer_reads.py`: one per 16-byte load of a 1 MiB two-shot
all-reduce, every sum right). With `IRONLINK_INITCHECK_PEERS=1` (tests/gpu/sanitize_rank.sh sets
it for initcheck) a new heap zeroes each peer's whole region with a kernel, which initcheck counts
as this process's write. A new heap is all zeros (each rank zeroes its own at creation and nothing
writes it before the first call; the device context lives apart), and the fills run between two
barriers, so they change no byte. initcheck then checks this rank's loads of its own memory, and
takes its peers' as initialized (each peer's loads of its own memory are checked in its process).
"""

from __future__ import annotations

import os
from typing import Any, Callable

ENV = "IRONLINK_INITCHECK_PEERS"


def wanted() -> bool:
    """Whether new heaps mark their peers' regions initialized (`ENV` is "1")."""
    return os.environ.get(ENV) == "1"


def mark_peers_initialized(barrier: Callable[[], None], view: Callable[[int, int, int], Any], rank: int,
                           node_size: int, region_bytes: int) -> None:
    """Zero-fills by a kernel the whole region (`region_bytes`: heap, signals, scratch) of every
    other rank of this node, as `view(rank, offset, nbytes)` maps it here, all zeros as the heap's
    creation ends; between two calls of `barrier` (collective: every rank of the heap calls it).
    The first barrier: every rank's heap is created; the second (`barrier` waits for this GPU's
    work first): no rank's first call starts before every fill is done."""
    first = rank - rank % node_size
    barrier()
    for peer in range(first, first + node_size):
        if peer != rank:
            view(peer, 0, region_bytes).zero_()
    barrier()


__all__ = ["ENV", "mark_peers_initialized", "wanted"]
