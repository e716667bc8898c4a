"""A symmetric heap's memory from PyTorch's NVSHMEM symmetric memory (``backend="nvshmem"``).

`SymmetricHeap(nbytes, backend="nvshmem")` allocates one buffer per rank with
``torch.distributed._symmetric_memory`` on its NVSHMEM backend (``set_backend("NVSHMEM")``,
``empty``, ``rendezvous``) instead of ironlink's own CUDA-IPC heap. The buffer holds the same
three regions (user heap, signal, scratch) at the same offsets; the rendezvous handle gives every
peer's address of it (``buffer_ptrs``, NVSHMEM's ``nvshmem_ptr``), and the context is written with
backend kind NVSHMEM. Everything above the context (tensors, collectives, fused ops) is unchanged.

On one node every peer must be reachable by loads and stores: a null peer address fails heap
creation, naming the ranks. With `node_size` smaller than the group the heap spans several nodes:
the context maps this rank's node and reaches the others through NVSHMEM (a multi-node context,
served by the hierarchical all-reduce); its own node's addresses must still be non-null.

The helpers here take torch's modules as arguments (no import at module level), so the checks
run without torch.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from ..language import _abi
from .errors import IronlinkError
from .rendezvous import Rendezvous

def check_spans_world(group_world: int, world: int) -> None:
    """NVSHMEM allocates collectively over every process of the job (torch's NVSHMEM allocator
    works on the default group), so a heap on a smaller group would leave the other processes
    out of an allocation they must join."""
    if group_world != world:
        raise ValueError(
            f"backend='nvshmem' needs a group of all {world} processes (NVSHMEM's symmetric "
            f"allocation is collective over the whole job); this group has {group_world}"
        )


def prepare_backend(symm_mem: Any, device: Any) -> None:
    """Makes PyTorch's symmetric memory allocate from NVSHMEM on `device`, or raises
    IronlinkError saying why it cannot."""
    available = getattr(symm_mem, "is_nvshmem_available", None)
    if available is None or not available():
        raise IronlinkError(
            "backend='nvshmem' needs PyTorch's NVSHMEM symmetric memory, which this torch does "
            "not offer (torch.distributed._symmetric_memory.is_nvshmem_available() is false: a "
            "build without NVSHMEM, or libnvshmem_host.so (pip package nvidia-nvshmem-cu12/cu13) "
            "cannot be loaded); use backend='p2p' on one node"
        )
    current = symm_mem.get_backend(device)
    if current == "NVSHMEM":
        return
    try:
        symm_mem.set_backend("NVSHMEM")
    except Exception as e:
        raise IronlinkError(
            f"backend='nvshmem': PyTorch's symmetric memory already allocates from {current!r} in "
            "this process and cannot switch once something was allocated; call "
            "torch.distributed._symmetric_memory.set_backend('NVSHMEM') before any symmetric "
            f"allocation, or use backend='p2p' ({e})"
        ) from e


def buffer_offset(buffer_ptrs: Sequence[int], buffer_size: int, data_ptr: int, rank: int, nbytes: int) -> int:
    """Where our `nbytes` at `data_ptr` start in the rendezvoused buffer whose base on this rank
    is `buffer_ptrs[rank]` (0 unless PyTorch's memory pool placed it inside a larger block)."""
    offset = data_ptr - int(buffer_ptrs[rank])
    if offset < 0 or offset + nbytes > buffer_size:
        raise IronlinkError(
            f"backend='nvshmem': the allocation at {data_ptr:#x} ({nbytes} bytes) is not inside the "
            f"rendezvoused buffer [{int(buffer_ptrs[rank]):#x}, +{buffer_size}) of rank {rank}"
        )
    return offset


def peer_bases(buffer_ptrs: Sequence[int], offsets: Sequence[int]) -> list[int]:
    """Every rank's address (in this process) of the heap's buffer: its buffer base plus the
    offset, which must be the same on every rank (a symmetric allocation); 0 stays 0 (a peer
    this process cannot reach: refused by the host library with a message naming it)."""
    if len(set(offsets)) != 1:
        where = ", ".join(f"rank {r}: {o}" for r, o in enumerate(offsets))
        raise IronlinkError(
            "backend='nvshmem': the heap's buffer sits at different offsets of the symmetric "
            f"allocation on different ranks ({where}): every rank must make the same symmetric "
            "allocations in the same order"
        )
    off = offsets[0]
    return [int(p) + off if int(p) != 0 else 0 for p in buffer_ptrs]


class NvshmemBuffer(NamedTuple):
    """One rank's buffer and the rendezvous handle that maps its peers (kept alive with the heap
    and its tensors: dropping the tensor returns the memory to PyTorch)."""

    tensor: Any
    handle: Any
    offset: int


def allocate(torch: Any, symm_mem: Any, total: int, device: Any, group: Any, rank: int) -> NvshmemBuffer:
    """Collective: allocates `total` bytes of NVSHMEM symmetric memory on `device` and
    rendezvouses it over `group` (a ProcessGroup)."""
    with torch.cuda.device(device):
        tensor = symm_mem.empty(total, dtype=torch.uint8, device=device)
        handle = symm_mem.rendezvous(tensor, group)
    offset = buffer_offset(list(handle.buffer_ptrs), int(handle.buffer_size), tensor.data_ptr(), rank, total)
    return NvshmemBuffer(tensor, handle, offset)


def open_heap(native: Any, torch: Any, rendezvous: Rendezvous, device: Any, nbytes: int, scratch_bytes: int,
              node_size: int) -> tuple[Any, NvshmemBuffer]:
    """The open native heap over a fresh NVSHMEM buffer, and the buffer (which the heap's tensors
    must keep alive). Every step is agreed over `rendezvous`, so a rank that fails raises on every
    rank and none is left waiting in a later collective."""
    import torch.distributed._symmetric_memory as symm_mem

    group, rank, world = rendezvous.pg, rendezvous.rank, rendezvous.world
    agree = rendezvous.agree

    if world < 2:  # torch 2.11 asserts `global_ranks.size() > 1` deep in its NVSHMEM allocator
        raise IronlinkError("backend='nvshmem' needs at least 2 ranks (PyTorch's NVSHMEM symmetric memory "
                            "refuses a group of 1); use the default backend='p2p' for one rank")
    agree(lambda: prepare_backend(symm_mem, device), "selecting PyTorch's NVSHMEM symmetric memory")
    heap_b, signal_b, scratch_b = native.heap_layout(nbytes, scratch_bytes)
    # NVSHMEM's allocation and the rendezvous are collective: once in, a rank that fails leaves
    # the others waiting in NVSHMEM (its own timeout), which no agreement step can prevent.
    buf: NvshmemBuffer = agree(
        lambda: allocate(torch, symm_mem, heap_b + signal_b + scratch_b, device, group, rank),
        "allocating the NVSHMEM symmetric heap",
    )
    bases = peer_bases(list(buf.handle.buffer_ptrs), rendezvous.all_gather(buf.offset))
    backend = _abi.BACKEND["NVSHMEM"]
    heap: Any = None

    def open_native() -> None:
        nonlocal heap
        nodes = 0 if node_size == world else node_size
        heap = native.Heap.over_external(device.index, nbytes, scratch_bytes, rank, world, backend, bases, nodes)

    try:
        agree(open_native, "opening the NVSHMEM symmetric heap")
    except BaseException:
        if heap is not None:  # opened here, failed on another rank
            heap.close()
        raise
    # agree() returned: every rank has zeroed its buffer, so signals may flow from here on.
    return heap, buf
