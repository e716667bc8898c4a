"""`SymmetricHeap`: symmetric GPU memory across the ranks of a torch.distributed group.

Every rank allocates one heap of the same size on its GPU; the heaps are mapped into every other
rank's process (CUDA IPC), and a device-side context describes all of them, so Triton kernels can
address any peer's copy of a tensor (``ironlink.language.symm_peer_ptr``). Tensors are carved out
of the heap by a deterministic allocator: the same sequence of ``empty``/``free`` calls on every
rank puts each tensor at the same offset everywhere.

    heap = ironlink.SymmetricHeap(64 << 20)           # collective
    x = heap.empty((1024,), torch.float32)            # collective (same order on all ranks)
    my_kernel[grid](x, heap.ctx, ...)                 # the kernel reaches peers through ctx
    heap.barrier(); heap.check()                      # wait for everyone; raise device errors
    heap.close()                                      # collective

torch is imported lazily (this module imports without it); a heap needs ``ironlink._native``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Optional, Union

from ..language import _abi, topology
from . import initcheck
from .backends import NativeSettings, check_backend, check_node_size, open_backend
from .call_check import CallCheck, default_store
from .errors import IronlinkError, device_error
from .failure_notes import explained
from .heap_args import check_algorithm_limits, check_size, check_timeout, normalize_shape, span_bytes
from .handles import register
from .heap_calls import HeapCalls
from .heap_workspaces import HeapWorkspaces
from .native import cuda_tensor, load_native, load_torch
from .nvshmem_memory import check_spans_world
from .rendezvous import Rendezvous
from .status_buffers import status_buffer
from .streams import StreamOrder
from .tuning import algorithm_limits

DEFAULT_SCRATCH_BYTES: int = _abi.THRESHOLDS["DEFAULT_SCRATCH_BYTES"]
# The context's default wait timeout (abi.rs DEFAULT_TIMEOUT_NS), in seconds.
DEFAULT_TIMEOUT_S: float = _abi.DEFAULT_TIMEOUT_NS / 1e9


class SymmetricHeap(HeapWorkspaces):
    """Symmetric memory across `group` (default: the world group); see the module docstring.

    Args:
        nbytes: bytes of the user region that `empty` allocates from (same on every rank).
        group: torch.distributed process group; one process per GPU, all on one node.
        device: the CUDA device (int, "cuda:N", torch.device); default: the current device.
        scratch_bytes: bytes of the scratch region the collectives use as packet buffers.
        timeout_s: how long device-side waits on peers spin before recording TIMEOUT.
        backend: whose memory the heap lives in: "p2p" (default: ironlink's own allocation,
            mapped into the peers with CUDA IPC) or "nvshmem" (PyTorch's NVSHMEM symmetric
            memory; the group must then span every process: see docs/backends.md).
        node_size: backend "nvshmem" only: ranks per node (consecutive ranks share a node).
            Default: ``$LOCAL_WORLD_SIZE`` (torchrun sets it), else the whole group. Smaller
            than the group, the heap spans several nodes: the host-level ops of
            ``ops.MULTI_NODE_OPS`` (the four fused ops among them) and MoeExchange run over the
            hierarchical collectives (other nodes reached through NVSHMEM); other host-level
            launches raise. On one machine a smaller value simulates nodes (4 GPUs as 2 nodes of 2).
    """

    def __init__(
        self,
        nbytes: int,
        group: Any = None,
        device: Any = None,
        scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        backend: str = "p2p",
        node_size: Optional[int] = None,
    ) -> None:
        self._native: Any = None
        self._owner: Any = None  # what keeps the heap's memory alive under its tensors (DLPack)
        self._closed = True
        self._limits: Optional[tuple[int, int, int]] = None  # None: the device defaults
        self._workspaces: dict[str, list[Any]] = {}  # fused ops' scratch tensors, by op name
        self._stream_order = StreamOrder()  # orders calls issued on different streams
        self._calls = HeapCalls()  # the allocator calls: their log and the context's digest of them
        check_size("nbytes", nbytes, 1)
        check_size("scratch_bytes", scratch_bytes, 0)
        timeout_ns = check_timeout(timeout_s)
        self._checked = CallCheck(timeout_s)  # calls with check=True: compared across ranks before they launch
        self._backend = check_backend(backend)
        native = load_native()
        torch = load_torch()
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise IronlinkError(
                "SymmetricHeap is collective: call torch.distributed.init_process_group first "
                "(e.g. under torchrun)"
            )
        self._rendezvous = Rendezvous.over(group)
        self._rank, self._world = self._rendezvous.rank, self._rendezvous.world
        if self._backend == "nvshmem":
            check_spans_world(self._world, dist.get_world_size())
        self._node_size = check_node_size(node_size, self._backend, self._world, os.environ.get("LOCAL_WORLD_SIZE"))
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"device must be a CUDA device, got {dev}")
        self._device = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)

        # The exchange runs on the caller's current device (the one its NCCL communicator uses),
        # whatever device the heap lives on: the host library does not use torch's current device.
        # The all-reduce crossovers measured for this world size (tuning_table.py), if any.
        self._limits = algorithm_limits(self._world)
        settings = NativeSettings(timeout_ns, self._limits)
        self._native, self._owner = open_backend(self._backend, native, self._rendezvous, self._device, nbytes,
                                                 scratch_bytes, self._node_size, settings)
        self._closed = False
        if self.multi_node:  # kernels launched on this context compile their collectives for several nodes
            topology.mark_several_nodes(int(self._native.ctx))
        # A name that every rank of this heap shares, for the store keys of its reports.
        self._uid = str(self._rendezvous.all_gather(os.urandom(8).hex())[0])
        # What torch.compile graphs carry instead of the heap (runtime/handles.py).
        self._handle = register(self)
        # The device's status buffer (host-level launches write it) is made now, not at the first
        # launch: inside torch.compile's CUDA-graph warm-up that would take it from the graphs' pool.
        status_buffer(torch, self._device, False, "SymmetricHeap")
        if initcheck.wanted():  # under compute-sanitizer's initcheck only (runtime/initcheck.py)
            regions = int(self._native.heap_size) + int(self._native.signal_size) + int(self._native.scratch_size)
            initcheck.mark_peers_initialized(self.barrier, self._view, self._rank, self._node_size, regions)

    # -- state ----------------------------------------------------------------------------
    def _open(self, what: str = "") -> Any:
        """The native heap, or IronlinkError (prefixed with `what`) if it is closed or its process
        group was destroyed (peers may have unmapped their memory: nothing may reach them)."""
        prefix = f"{what}: " if what else ""
        if self._closed or self._native is None:
            raise IronlinkError(f"{prefix}the symmetric heap is closed; it cannot be used any more")
        if not self._rendezvous.alive():
            raise IronlinkError(
                f"{prefix}the symmetric heap's process group was destroyed (torch.distributed."
                "destroy_process_group); its peers may be gone: close() the heap and create a new one "
                "in a live group"
            )
        return self._native

    def usable(self, what: str) -> None:
        """Raises IronlinkError naming `what` if the heap is closed or its group destroyed."""
        self._open(what)

    @property
    def stream_order(self) -> StreamOrder:
        """The stream of this heap's last host-level call (see `ironlink.runtime.streams`)."""
        return self._stream_order

    @property
    def handle(self) -> int:
        """This heap's int handle (`runtime.handles`): how ironlink's PyTorch operators name it."""
        return self._handle

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ctx(self) -> int:
        """Device address of the context: pass it to kernels calling ironlink functions. Read it
        for each launch (every host-level op does): after `empty` or `free` it first brings the
        context's heap digest up to date, on the current stream."""
        native = self._open()
        if self._calls.stale:
            self._calls.publish(native, self._device, self._owner, self._stream_order)
        return int(native.ctx)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def backend(self) -> str:
        """Whose memory the heap lives in: "p2p" or "nvshmem"."""
        return self._backend

    @property
    def world_size(self) -> int:
        return self._world

    @property
    def node_size(self) -> int:
        """Ranks per node (the world size for a heap of one node)."""
        return self._node_size

    @property
    def multi_node(self) -> bool:
        """Whether the heap spans several nodes (`runtime.launch.MULTI_NODE_OPS` serve it)."""
        return self._node_size < self._world

    @property
    def device(self) -> Any:
        return self._device

    @property
    def nbytes(self) -> int:
        """Bytes of the user region (the request rounded up to 4 KiB)."""
        return int(self._open().heap_size)

    @property
    def scratch_bytes(self) -> int:
        return int(self._open().scratch_size)

    @property
    def free_bytes(self) -> int:
        return int(self._open().free_bytes)

    def set_timeout(self, timeout_s: float) -> None:
        """Changes how long device-side waits on peers spin before recording TIMEOUT."""
        self._open().set_timeout_ns(check_timeout(timeout_s))
        self._checked.wait_s = timeout_s

    def set_algorithm_limits(self, ar_one_shot_max_bytes: int, ar_ll_max_bytes: int, gather_ll_max_bytes: int) -> None:
        """Sizes up to which all-reduce uses one-shot LL, then two-shot LL (packets fitting the
        scratch), then two-shot over the buffers, and all_gather (output bytes) / reduce_scatter
        (input bytes) LL packets. The same on every rank (each picks alone). Syncs the device."""
        limits = check_algorithm_limits(ar_one_shot_max_bytes, ar_ll_max_bytes, gather_ll_max_bytes)
        self._open().set_algorithm_limits(*limits)
        self._limits = limits

    @property
    def algorithm_limits(self) -> tuple[int, int, int]:
        """(ar_one_shot_max_bytes, ar_ll_max_bytes, gather_ll_max_bytes) this heap's context carries."""
        self._open()
        if self._limits is not None:
            return self._limits
        t = _abi.THRESHOLDS
        return (t["DEFAULT_AR_ONE_SHOT_MAX_BYTES"], t["DEFAULT_AR_LL_MAX_BYTES"], t["DEFAULT_GATHER_LL_MAX_BYTES"])

    def all_reduce_algorithm(self, nbytes: int, ctas: int) -> str:
        """What `symm_all_reduce` runs for `nbytes` on `ctas` CTAs here: "one_shot_ll", "two_shot_ll", "two_shot"."""
        one_shot, ll, _ = self.algorithm_limits
        return str(load_native().all_reduce_algorithm(self._world, self.scratch_bytes, one_shot, ll, ctas, nbytes))

    # -- tensors --------------------------------------------------------------------------
    def _view(self, rank: int, offset: int, nbytes: int) -> Any:
        """A uint8 tensor over `nbytes` at `offset` of `rank`'s region, on this GPU."""
        ptr = self._open().peer_base(rank) + offset
        return cuda_tensor(ptr, nbytes, self._device.index, self._owner)

    def empty(self, shape: Union[int, Iterable[int]], dtype: Any = None, at_top: bool = False) -> Any:
        """An uninitialized tensor in symmetric memory (collective: same order on all ranks).
        `at_top`: from the stack at the region's end that the workspaces take, at an offset that
        follows from such calls alone, the same on every rank whatever tensors each allocated
        (buffers that peers store into at this rank's offsets: MoeExchange's).

        The heap's memory stays valid while the tensor lives, even if the heap object is dropped;
        after an explicit `close()` it must not be used."""
        torch, native = load_torch(), self._open()
        dtype = torch.float32 if dtype is None else dtype
        dims = normalize_shape(shape)
        nbytes = math.prod(dims) * dtype.itemsize
        return self._tensor_at(native.alloc_top(nbytes) if at_top else native.alloc(nbytes), nbytes, dims, dtype)

    def _tensor_at(self, offset: int, nbytes: int, dims: tuple[int, ...], dtype: Any) -> Any:
        """The tensor over the allocation just made at `offset`, recorded (freed, both recorded, if the view fails)."""
        native = self._open()
        try:
            t = self._view(self._rank, offset, nbytes).view(dtype).view(dims)
        except BaseException:
            reserved = native.find(offset)[1]
            native.free(offset)
            self._calls.record("alloc", offset, nbytes, reserved, f"shape {dims}, {dtype}")
            self._calls.record("free", offset, nbytes, reserved, f"shape {dims}, {dtype}")
            raise
        self._calls.record("alloc", offset, nbytes, native.find(offset)[1], f"shape {dims}, {dtype}")
        return t

    def zeros(self, shape: Union[int, Iterable[int]], dtype: Any = None) -> Any:
        """Like `empty`, zero-filled (on the current stream)."""
        return self.empty(shape, dtype).zero_()

    def _local_offset(self, t: Any, what: str) -> tuple[int, int]:
        """(offset of t's first byte in our region, byte span), or IronlinkError."""
        torch = load_torch()
        native = self._open()
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} takes a torch.Tensor, got {type(t).__name__}")
        base = native.peer_base(self._rank)
        offset = t.data_ptr() - base
        span = span_bytes(t.shape, t.stride(), t.element_size())
        found = native.find(offset) if t.device == self._device and offset >= 0 else None
        if found is None or offset + span > found[0] + found[1]:
            raise IronlinkError(
                f"{what}: the tensor (data_ptr {t.data_ptr():#x} on {t.device}) is not in a live "
                f"allocation of this symmetric heap (rank {self._rank}'s region is "
                f"[{base:#x}, {base + native.heap_size:#x}) on {self._device})"
            )
        return offset, span

    def free(self, t: Any) -> None:
        """Returns `t`'s memory to the heap (collective: same order on all ranks). Peers may
        still be accessing it: put a `barrier()` before reusing the memory if so."""
        offset, _ = self._local_offset(t, "free")
        native = self._open()
        reserved = native.find(offset)[1]
        native.free(offset)
        nbytes = span_bytes(t.shape, t.stride(), t.element_size())
        self._calls.record("free", offset, nbytes, reserved, f"shape {tuple(t.shape)}, {t.dtype}")

    def peer_tensor(self, t: Any, rank: int) -> Any:
        """A view of `rank`'s copy of `t` (same shape, strides, dtype), usable on this GPU."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self._world:
            raise ValueError(f"rank must be an int in [0, {self._world}), got {rank!r}")
        offset, span = self._local_offset(t, "peer_tensor")
        if span == 0:
            return t.new_empty(t.shape)
        raw = self._view(rank, offset, span).view(t.dtype)
        return raw.as_strided(t.shape, t.stride())

    # -- synchronization and errors -------------------------------------------------------
    def barrier(self) -> None:
        """Waits for this GPU's work, then for every rank of the group to get here."""
        torch = load_torch()
        self._open()
        torch.cuda.synchronize(self._device)
        self._rendezvous.barrier()

    def check(self) -> None:
        """Raises IronlinkError if a device function recorded an error in the context (and
        clears it). Waits for this GPU's work first."""
        native = self._open()
        code, detail = native.read_error()
        if code != 0:
            native.clear_error()
            raise self.explain(device_error(code, detail, self._rank))

    def explain(self, e: IronlinkError) -> IronlinkError:
        """`e` with its note (`failure_notes.explained`): for HEAP_ASYMMETRIC the first heap call
        that differs between the ranks (their recent calls meet in torch.distributed's store; a
        rank that does not report within a few seconds is left out)."""
        return explained(e, lambda err: self._calls.explain(err, int(self._open().digest), self._uid, self._rank,
                                                          self._world))

    def compare_call(self, name: str, **fields: Any) -> None:
        """check=True, first: IronlinkError, nothing launched, unless all ranks make this call (`call_check`)."""
        self._checked.compare(default_store(), self._uid, self._rank, self._world, name, fields,
                              record=lambda code, detail: self._open().record_error(code, detail))

    def close(self) -> None:
        """Frees the heap (collective). Idempotent; tensors from it must not be used after."""
        if self._closed:
            return
        self._closed = True
        native, self._native = self._native, None
        self._calls.forget_context()
        topology.forget(int(native.ctx))  # its address may serve another context later
        # Without its group (destroyed) there is no barrier to hold: free our side alone (memory a
        # peer still maps is released only when the peer unmaps it).
        alive = self._rendezvous.alive()
        try:
            # No rank may still access our memory, nor we theirs, when mappings go away.
            torch = load_torch()
            torch.cuda.synchronize(self._device)
            if alive:
                self._rendezvous.barrier()
        finally:
            native.close()
            # PyTorch's buffer (backend "nvshmem") goes back to PyTorch once no tensor of this
            # heap holds it any more (they keep it through `_owner`).
            self._owner = None
        # Memory a peer still maps is released only when the peer unmaps it: after this
        # barrier every rank's close() has unmapped and freed.
        if alive:
            self._rendezvous.barrier()

    def __enter__(self) -> "SymmetricHeap":
        self._open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed or self._native is None else f"{int(self._native.heap_size)} bytes"
        backend = getattr(self, "_backend", "p2p")
        return f"SymmetricHeap(rank {self._rank}/{self._world}, {self._device}, {backend}, {state})"
