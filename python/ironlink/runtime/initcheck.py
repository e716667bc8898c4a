"""Peers' heaps made visible to compute-sanitizer's initcheck (a diagnostic mode, off by default).

initcheck tracks what this process initialized: a peer's writes to its own heap (and its zeroing
of the whole heap at creation) do not reach it, so it reports every load from a peer's heap as
uninitialized (`bench/probes/initcheck_peer_reads.py`: one per 16-byte load of a 1 MiB two-shot
all-reduce, every sum right). With `IRONLINK_INITCHECK_PEERS=1` (tests/gpu/sanitize_rank.sh sets
it for initcheck) a new heap copies each peer's whole region out and back by the CUDA API: torch's
copy of contiguous bytes is a cudaMemcpyAsync, whose source initcheck leaves unchecked under
`--check-api-memory-access no` and whose destination it counts as written by this process. The
copies run between two barriers, while no rank writes a heap, so they change no byte. initcheck
then checks this rank's loads of its own memory, and takes its peers' as initialized.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

ENV = "IRONLINK_INITCHECK_PEERS"


def wanted() -> bool:
    """Whether new heaps mark their peers' regions initialized (`ENV` is "1")."""
    return os.environ.get(ENV) == "1"


def mark_peers_initialized(barrier: Callable[[], None], peer_regions: Sequence[Any]) -> None:
    """Copies each of `peer_regions` (uint8 tensors over the peers' whole regions, mapped here)
    out to a stage and back, between two calls of `barrier` (collective: every rank of the heap
    calls it, with its own peers). The first barrier: every rank has finished writing its heap
    (its context, its peers' addresses); the second: no rank starts writing before every copy
    is done (`barrier` waits for this GPU's work first)."""
    barrier()
    stage: Any = None
    for region in peer_regions:
        if stage is None or stage.numel() < region.numel():
            stage = region.new_empty(region.numel())
        part = stage[: region.numel()]
        part.copy_(region)
        region.copy_(part)
    barrier()


__all__ = ["ENV", "mark_peers_initialized", "wanted"]
