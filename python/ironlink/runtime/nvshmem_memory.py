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

from typing import Any, Callable, NamedTuple, Optional, Sequence

from . import _abi
from .errors import IronlinkError

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


def open_heap(
    native: Any,
    torch: Any,
    agree: Callable[[Callable[[], Any], str], Any],
    all_gather: Callable[[Any], list[Any]],
    group: Any,
    rank: int,
    world: int,
    device: Any,
    nbytes: int,
    scratch_bytes: int,
    node_size: int,
) -> tuple[Any, NvshmemBuffer]:
    """The open native heap over a fresh NVSHMEM buffer, and the buffer. `agree(step, what)`
    runs `step` on every rank and returns its local result, raising on every rank if any rank
    failed (so none is left waiting in a later collective); `all_gather` gathers a picklable
    value from every rank."""
    import torch.distributed._symmetric_memory as symm_mem

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
    bases = peer_bases(list(buf.handle.buffer_ptrs), all_gather(buf.offset))
    backend = BACKENDS["nvshmem"]
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
