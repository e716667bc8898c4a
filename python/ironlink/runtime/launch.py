"""The one launch path of every host-level call (collectives, fused ops, MoE exchange): the heap
is usable, the op runs on the heap's kind of heap (one node or several), the call is ordered after
the heap's last call on another stream, and each CTA's status is checked on the host when asked
(`check=True`) or recorded for `heap.check()`."""

from __future__ import annotations

from typing import Any, Optional

from .errors import IronlinkError, status_name
from .status_buffers import status_buffer


def check_statuses(statuses: list[int], collective: str, rank: int, function: Optional[str] = None) -> None:
    """Raises IronlinkError for the first non-zero per-CTA status (all CTAs see the same arguments,
    so they almost always agree; the message lists every distinct code). `function` names the
    device function(s) behind `collective` (default: symm_<collective>)."""
    bad = sorted({s for s in statuses if s != 0})
    if bad:
        names = ", ".join(f"{status_name(s)} ({s})" for s in bad)
        fn = function or f"symm_{collective}"
        raise IronlinkError(f"ironlink.{collective}: {fn} returned {names} on rank {rank}", status=bad[0], function=fn)


# The host-level calls that serve a heap of several nodes (SymmetricHeap.multi_node).
# The fused ones run their collective hierarchically after a grid barrier (no tile calls there).
MULTI_NODE_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all_v", "all_reduce_rmsnorm",
                            "matmul_all_reduce", "all_gather_matmul", "matmul_reduce_scatter"})


def launch_with_status(name: str, heap: Any, ctas: int, launch: Any, check: bool, function: Optional[str] = None) -> None:
    """Runs `launch(status)` (a kernel launch of `ctas` CTAs, each writing its status to
    `status[pid]`) on the heap's device; with `check`, waits and raises on a bad status. Every
    host-level call launches through here: it refuses a closed heap (or one whose group is gone)
    and orders the call after the heap's last call if that ran on another stream."""
    import torch

    heap.usable(f"ironlink.{name}")  # closed, or its process group destroyed: nothing is launched
    if heap.multi_node and name not in MULTI_NODE_OPS:
        raise IronlinkError(
            f"ironlink.{name} has no multi-node version yet; this heap spans "
            f"{heap.world_size // heap.node_size} nodes of {heap.node_size} ranks, where "
            f"{', '.join(sorted(MULTI_NODE_OPS))} run (docs/backends.md)"
        )
    capturing = torch.cuda.is_current_stream_capturing()
    if check and capturing:
        raise ValueError(f"ironlink.{name}(check=True) reads statuses on the host, which capture forbids; "
                         "call heap.check() after replaying instead")
    device = heap.device
    status = status_buffer(torch, device, capturing, name)
    # Triton launches on the current device's current stream; the heap's device is the one that must run it.
    with torch.cuda.device(device):
        # Two of the heap's calls must never run at once: after a call on another stream, wait for it.
        heap.stream_order.before_call(torch.cuda.current_stream(device), capturing)
        launch(status)
        if check:
            try:
                check_statuses(status[:ctas].tolist(), name, heap.rank, function)
            except IronlinkError as e:
                raise heap.explain(e) from None  # HEAP_ASYMMETRIC: which heap call differs


__all__ = ["MULTI_NODE_OPS", "check_statuses", "launch_with_status"]
