"""Whose memory a SymmetricHeap lives in, and opening it there.

- "p2p": ironlink's own allocation on each GPU (the compiled extension), mapped into the peers with
  CUDA IPC: one node;
- "nvshmem": PyTorch's NVSHMEM symmetric memory (nvshmem_memory.py): one node or several.

`open_backend` returns the open native heap configured with `NativeSettings`, and what keeps its
memory alive under the heap's tensors. Every step is agreed over the heap's `Rendezvous`, so a
failure on one rank raises on every rank instead of leaving the others waiting.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from ..language import _abi
from .distributed import shared_gpu_allowed
from .errors import IronlinkError
from .nvshmem_memory import open_heap
from .rendezvous import Rendezvous, gather_failures, same_requests

# The memory a SymmetricHeap can be built on, by the name its `backend` argument takes.
BACKENDS: dict[str, int] = {"p2p": _abi.BACKEND["P2P"], "nvshmem": _abi.BACKEND["NVSHMEM"]}


def check_backend(backend: Any) -> str:
    """`backend` as one of BACKENDS' names (case-insensitive), or a TypeError/ValueError."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str ({' or '.join(map(repr, BACKENDS))}), got {type(backend).__name__}")
    name = backend.lower()
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    return name


def check_node_size(node_size: Optional[int], backend: str, world: int, local_world: Optional[str]) -> int:
    """Ranks per node: `node_size`, else `local_world` ($LOCAL_WORLD_SIZE, when it divides the
    world), else the world. Several nodes need backend "nvshmem" (ironlink's own heap maps one
    node), at most MAX_RANKS ranks per node, MAX_NODES nodes, and a size dividing the world."""
    if node_size is None:
        if backend != "nvshmem" or not local_world or not local_world.isdigit():
            return world
        local = int(local_world)
        return local if 0 < local <= world and world % local == 0 else world
    if isinstance(node_size, bool) or not isinstance(node_size, int):
        raise TypeError(f"node_size must be an int, got {type(node_size).__name__}")
    if node_size == world:
        return world
    if backend != "nvshmem":
        raise ValueError(f"node_size={node_size} < the group's {world} ranks needs backend='nvshmem' "
                         "(ironlink's own 'p2p' heap maps the GPUs of one node)")
    max_node, max_nodes = _abi.MAX_RANKS, _abi.MAX_NODES
    if not 1 <= node_size <= max_node or world % node_size:
        raise ValueError(f"node_size must be 1..{max_node} and divide the group's {world} ranks, got {node_size}")
    if world // node_size > max_nodes:
        raise ValueError(f"{world} ranks as nodes of {node_size} are {world // node_size} nodes; at most {max_nodes}")
    return node_size


class NativeSettings(NamedTuple):
    """What a freshly opened native heap is set to."""

    timeout_ns: int  # device-side waits on peers spin this long before recording TIMEOUT
    limits: Optional[tuple[int, int, int]]  # the all-reduce crossovers (tuning_table.py); None: the device defaults


class OpenedHeap(NamedTuple):
    native: Any  # the open native heap
    owner: Any  # what keeps the heap's memory alive under its tensors (DLPack)


def configure(heap: Any, settings: NativeSettings) -> None:
    """Sets the wait timeout and the algorithm limits of a freshly opened native heap."""
    heap.set_timeout_ns(settings.timeout_ns)
    if settings.limits is not None:
        heap.set_algorithm_limits(*settings.limits)


def open_p2p(native: Any, rendezvous: Rendezvous, device: Any, nbytes: int, scratch_bytes: int,
             settings: NativeSettings) -> Any:
    """Backend "p2p": allocate, exchange handles, map peers (every step agreed by all ranks)."""
    rank, world = rendezvous.rank, rendezvous.world
    local = None
    try:
        local = native.LocalHeap.create(device.index, nbytes, scratch_bytes, rank, world)
        mine: tuple[str, Any] = ("ok", ((nbytes, scratch_bytes), local.handle_bytes()))
    except Exception as e:
        mine = ("error", str(e))
    gathered = rendezvous.all_gather(mine)
    failed = gather_failures(gathered)
    mismatch = None if failed else same_requests([g[1][0] for g in gathered])
    if failed or mismatch:
        if local is not None:
            local.close()
        raise IronlinkError(mismatch or f"creating the symmetric heap failed on {failed}")

    assert local is not None  # no rank failed, this one included
    # Opening can fail on one rank only (peer access, mapping): agree on the outcome.
    heap = None
    try:
        heap = local.open_peers([g[1][1] for g in gathered], shared_gpu_allowed())
        configure(heap, settings)
        mine = ("ok", None)
    except Exception as e:
        mine = ("error", str(e))
    failed = gather_failures(rendezvous.all_gather(mine))
    if failed:
        if heap is not None:
            heap.close()
        raise IronlinkError(f"mapping the symmetric heap failed on {failed}")
    return heap


def open_nvshmem(native: Any, rendezvous: Rendezvous, device: Any, nbytes: int, scratch_bytes: int, node_size: int,
                 settings: NativeSettings) -> OpenedHeap:
    """Backend "nvshmem": the heap's buffer from PyTorch's NVSHMEM symmetric memory, after every
    rank agreed on the sizes (the allocation is collective)."""
    import torch

    mismatch = same_requests(rendezvous.all_gather((nbytes, scratch_bytes)))
    if mismatch:
        raise IronlinkError(mismatch)
    heap, buffer = open_heap(native, torch, rendezvous, device, nbytes, scratch_bytes, node_size)
    try:
        rendezvous.agree(lambda: configure(heap, settings), "configuring the NVSHMEM symmetric heap")
    except BaseException:
        heap.close()
        raise
    # PyTorch's buffer goes back to PyTorch once no tensor of this heap holds it any more.
    return OpenedHeap(heap, (heap, buffer))


def open_backend(backend: str, native: Any, rendezvous: Rendezvous, device: Any, nbytes: int, scratch_bytes: int,
                 node_size: int, settings: NativeSettings) -> OpenedHeap:
    """The native heap of `backend` (one of BACKENDS), opened on every rank of `rendezvous`."""
    if backend == "nvshmem":
        return open_nvshmem(native, rendezvous, device, nbytes, scratch_bytes, node_size, settings)
    heap = open_p2p(native, rendezvous, device, nbytes, scratch_bytes, settings)
    return OpenedHeap(heap, heap)


__all__ = ["BACKENDS", "NativeSettings", "OpenedHeap", "check_backend", "check_node_size", "configure",
           "open_backend", "open_nvshmem", "open_p2p"]
