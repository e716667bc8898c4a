"""`check=True` compares the ranks' calls before anything launches: each host-level op names what
every rank's call must share (the op, element counts or shapes, dtype, reduce op, the method or
mode asked for), and the ranks' calls meet in torch.distributed's store under the heap's name. A
call that differs, or that some rank has not made within the heap's timeout, raises IronlinkError
on every rank that made it, naming each rank's call; nothing is launched. Without `check=True` no
rank waits for this, so a mismatch shows only as the device's TIMEOUT, whose message says that
`check=True` compares the calls (`errors.HINTS`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..language import _abi
from .errors import CALL_COMPARISON, CALL_COMPARISON_DETAIL, IronlinkError
from .store_exchange import exchange


@dataclass(frozen=True)
class Call:
    """What one rank's call must share with the others': the op and its fields, in order."""

    op: str
    fields: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        return f"ironlink.{self.op}({', '.join(f'{k}={v}' for k, v in self.fields)})"


def mismatch(calls: Sequence[Optional[Call]], rank: int, waited_s: float) -> Optional[str]:
    """What is wrong with the ranks' `calls` (None: a rank did not make its call within
    `waited_s`), seen from `rank`, or None if every rank made the same call."""
    mine = calls[rank]
    assert mine is not None, "this rank's own call is always there"
    missing = [r for r, c in enumerate(calls) if c is None]
    if missing:
        return (f"rank(s) {missing} did not make this call within {waited_s:g} s (skipped it, made other "
                f"checked ironlink calls before it, or are stuck); rank {rank}'s call: {mine.describe()}")
    if all(c == mine for c in calls):
        return None
    differ = sorted({k for c in calls if c is not None for k, v in c.fields if (k, v) not in mine.fields}
                    | ({"op"} if any(c is not None and c.op != mine.op for c in calls) else set()))
    each = "; ".join(f"rank {r}: {c.describe()}" for r, c in enumerate(calls) if c is not None)
    return f"the ranks' calls differ in {', '.join(differ)}: {each}"


def default_store() -> Any:
    """torch.distributed's default key-value store, or None (no torch, no default group)."""
    try:
        import torch.distributed as dist

        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store: nothing to compare with
        return None


class CallCheck:
    """One heap's checked calls: their count names each call's keys in the store. A rank waits
    for the others' calls as long as the heap's device waits wait for peers (`wait_s`, kept by
    `SymmetricHeap.set_timeout`): within it, where every rank makes the call, the device's waits
    would not have timed out either."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._count = 0

    def compare(self, store: Any, uid: str, rank: int, world: int, op: str, fields: dict[str, Any],
                record: Optional[Callable[[int, int], Any]] = None) -> None:
        """Publishes this rank's call of `op` in `store` under the heap's `uid` and raises
        IronlinkError (status TIMEOUT where a rank did not make it) unless every rank's is the
        same. Nothing is compared without a store (None). A rank that never made the call is a
        lost peer, as a device wait's TIMEOUT is: `record(status, detail)` first records it in the
        heap's context, so `heap.check()` raises it and the device's later waits give up at once
        (calls that differ are not recorded: every rank raised, nothing launched, the heap is
        usable)."""
        if store is None:
            return
        n, self._count = self._count, self._count + 1
        prefix = f"ironlink/calls/{uid}"
        calls = exchange(store, f"{prefix}/{n}", rank, world, Call(op, tuple(fields.items())), self.wait_s)
        if n >= 2:  # every rank has read call n - 2's keys: each published call n - 1 after it
            try:
                store.delete_key(f"{prefix}/{n - 2}/{rank}")
            except Exception:  # noqa: BLE001 - a store without delete_key keeps them
                pass
        problem = mismatch(calls, rank, self.wait_s)
        if problem:
            status = _abi.STATUS["TIMEOUT"] if None in calls else None
            if status is not None and record is not None:
                record(status, CALL_COMPARISON_DETAIL)
            raise IronlinkError(f"ironlink.{op}(check=True) on rank {rank}: {problem}; nothing was launched",
                                status=status, function=CALL_COMPARISON)


__all__ = ["Call", "CallCheck", "default_store", "mismatch"]
