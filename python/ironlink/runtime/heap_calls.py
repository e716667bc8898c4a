"""What a SymmetricHeap's allocator calls leave behind: a log of the recent ones, the digest of all
of them that the device context carries (`heap_digest`: a collective's ranks compare theirs and
report HEAP_ASYMMETRIC when they differ), and the report that names the call that differs."""

from __future__ import annotations

from typing import Any

from ..language import _abi
from .errors import IronlinkError
from .heap_log import HeapLog, asymmetry_report
from .store_exchange import exchange
from .native import cuda_tensor, load_torch
from .streams import StreamOrder



class HeapCalls:
    """One heap's log of `empty`/`free` calls and the context's digest of them."""

    def __init__(self) -> None:
        self.log = HeapLog()  # recent empty/free calls, to name one that differs between ranks
        self._digest_word: Any = None  # the context's heap_digest, as a 1-element int64 tensor
        self.stale = False  # heap calls made since the context's digest was last written
        self._reports = 0  # HEAP_ASYMMETRIC reports so far (their logs meet under this number)

    def record(self, op: str, offset: int, nbytes: int, reserved: int, what: str) -> None:
        """Notes an allocator call in the log; the context's digest follows at the next `ctx`."""
        self.log.record(op, offset, nbytes, reserved, what)
        self.stale = True

    def publish(self, native: Any, device: Any, owner: Any, stream_order: StreamOrder) -> None:
        """Writes the allocator's digest into the context's `heap_digest`, on the current stream,
        before the launch that reads `ctx`: it sees the digest of every heap call made before it,
        as the peers' launches of the same call do. Written once for any number of heap calls
        between two launches: a one-element fill (a tiny kernel; captured into a CUDA graph like
        any other), never a host synchronization. Ordered like a heap call (`stream_order`): after
        the last call if that ran on another stream, and before the next call on any stream."""
        torch = load_torch()
        if self._digest_word is None:
            offset, size = _abi.CONTEXT_FIELDS["heap_digest"]
            self._digest_word = cuda_tensor(int(native.ctx) + offset, size, device.index, owner).view(torch.int64)
        digest = int(native.digest)
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream(device)
            capturing = torch.cuda.is_current_stream_capturing()
            stream_order.before_call(stream, capturing)
            self._digest_word.fill_(digest - (1 << 64) if digest >= 1 << 63 else digest)
        # A fill captured into a graph runs only at replay: the next launch outside writes again.
        self.stale = capturing

    def forget_context(self) -> None:
        """Drops the view of the context, which goes with the heap."""
        self._digest_word = None

    def explain(self, e: IronlinkError, digest: int, uid: str, rank: int, world: int) -> IronlinkError:
        """`e` with the first heap call that differs between the ranks appended (the ranks' recent
        calls meet in torch.distributed's store under the heap's `uid`; a rank that does not
        report within a few seconds is left out)."""
        self._reports += 1
        mine = (digest, self.log.events())
        peers = None
        try:
            import torch.distributed as dist

            store = dist.distributed_c10d._get_default_store()
            peers = exchange(store, f"ironlink/heap-calls/{uid}/{self._reports}", rank, world, mine)
        except Exception:  # noqa: BLE001 - no store: report this rank's calls alone
            peers = None
        report = asymmetry_report(rank, mine[0], self.log, peers)
        return IronlinkError(f"{e}. {report}", status=e.status, function=e.function)


__all__ = ["HeapCalls"]
