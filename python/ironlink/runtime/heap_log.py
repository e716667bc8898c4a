"""A heap's recent allocations and frees on this rank, to name the first one that differs
between ranks when a device call reports ``HEAP_ASYMMETRIC``.

The device compares only a digest of every rank's calls (``SymmContext.heap_digest``, folded by
the host allocator: ``abi::heap_digest``); which call differs is found here, on the host, from
the last ``KEEP`` events of every rank. Events are numbered from the heap's creation, so the
ranks' logs line up by number even after older events have left the window. The ranks' logs
meet through torch.distributed's key-value store with a short timeout
(`store_exchange.exchange`): a report never waits on a rank that did not fail.

Pure Python (no torch): the CPU tests run it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Optional, Sequence

# Events each rank keeps: enough to reach back past a model's worth of buffers.
KEEP = 64


@dataclass(frozen=True)
class HeapEvent:
    """Event number ``seq`` of a heap (0 = its first ``empty``): an "alloc" or a "free" of
    ``reserved`` bytes (as the allocator rounds them) at user-region ``offset``; ``nbytes`` is
    what the tensor spans, ``what`` its shape and dtype ("" if unknown)."""

    seq: int
    op: str
    offset: int
    nbytes: int
    reserved: int
    what: str = ""

    def key(self) -> tuple[str, int, int]:
        """What the digest folds: two events with equal keys leave equal digests."""
        return (self.op, self.offset, self.reserved)

    def describe(self) -> str:
        what = f", {self.what}" if self.what else ""
        return f"{self.op} of {self.nbytes} bytes at offset {self.offset}{what}"


class HeapLog:
    """The last `keep` events of one rank's heap, numbered from its first."""

    def __init__(self, keep: int = KEEP) -> None:
        self._events: deque[HeapEvent] = deque(maxlen=keep)
        self._count = 0

    def record(self, op: str, offset: int, nbytes: int, reserved: int, what: str = "") -> HeapEvent:
        event = HeapEvent(self._count, op, offset, nbytes, reserved, what)
        self._events.append(event)
        self._count += 1
        return event

    @property
    def count(self) -> int:
        """Events recorded since the heap was created (older ones have left the window)."""
        return self._count

    def events(self) -> list[HeapEvent]:
        return list(self._events)


def first_difference(logs: Sequence[Optional[Sequence[HeapEvent]]]) -> Optional[tuple[int, dict[int, Optional[HeapEvent]]]]:
    """The lowest event number at which the ranks' logs (`logs[rank]`, None for a rank whose log
    is unknown) differ, with each known rank's event there (None: that rank has no such event),
    or None if the known logs agree over the numbers all of them still hold. Numbers before some
    rank's window are not compared (they are gone there)."""
    known = {r: {e.seq: e for e in log} for r, log in enumerate(logs) if log is not None}
    if len(known) < 2:
        return None
    # Every rank holds its events from `start` up to its count; compare from the latest start.
    start = max((min(ev) if ev else 0) for ev in known.values())
    end = max((max(ev) + 1 if ev else 0) for ev in known.values())
    for seq in range(start, end):
        at = {r: ev.get(seq) for r, ev in known.items()}
        keys = {e.key() if e is not None else None for e in at.values()}
        if len(keys) > 1:
            return seq, at
    return None


def asymmetry_report(rank: int, digest: int, log: HeapLog, peers: Optional[Sequence[Optional[tuple[int, list[HeapEvent]]]]]) -> str:
    """The text that follows a HEAP_ASYMMETRIC error on `rank`: the first event that differs
    between the ranks whose (digest, events) `peers` holds (`peers[r]`, this rank's included;
    None where unknown), or, without them, this rank's digest and recent events."""
    if peers is not None:
        digests = ", ".join(f"rank {r} {p[0]:#018x}" if p is not None else f"rank {r} unknown" for r, p in enumerate(peers))
        found = first_difference([p[1] if p is not None else None for p in peers])
        if found is not None:
            seq, at = found
            parts = [f"rank {r}: {e.describe() if e is not None else 'no such call'}" for r, e in sorted(at.items())]
            return (f"The first heap call that differs between the ranks is call #{seq} "
                    f"(counted from the heap's creation): {'; '.join(parts)} (heap digests: {digests})")
        missing = [str(r) for r, p in enumerate(peers) if p is None]
        if missing:
            note = f"Rank(s) {', '.join(missing)} did not report their heap calls"
        else:
            note = f"The ranks' last {KEEP} heap calls agree: the difference is older"
        return f"{note} (heap digests: {digests}); this rank's recent heap calls: {recent(log)}"
    return f"Heap digest {digest:#018x} on rank {rank}; this rank's recent heap calls: {recent(log)}"


def recent(log: HeapLog, n: int = 8) -> str:
    """This rank's last `n` events, oldest first, numbered."""
    events = log.events()[-n:]
    if not events:
        return "none"
    return "; ".join(f"#{e.seq} {e.describe()}" for e in events)
