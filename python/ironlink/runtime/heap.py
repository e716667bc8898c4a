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

torch is imported lazily (this module imports without it); the compiled extension
``ironlink._native`` is needed to create a heap.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Optional, Sequence, Union

from . import _abi
from .errors import IronlinkError, device_error
from .heap_log import HeapLog, asymmetry_report, exchange
from .nvshmem_memory import check_backend, check_node_size, check_spans_world
from .stream_order import StreamOrder

DEFAULT_SCRATCH_BYTES: int = _abi.THRESHOLDS["DEFAULT_SCRATCH_BYTES"]
# The context's default wait timeout (abi.rs DEFAULT_TIMEOUT_NS), in seconds.
DEFAULT_TIMEOUT_S: float = _abi.DEFAULT_TIMEOUT_NS / 1e9
# Set to 1, lets ranks share a GPU: for running multi-rank tests on fewer GPUs under CUDA MPS
# (`tests/gpu/run.sh --shared-gpu`; docs/gpu-testing.md). Results are checked the same; times mean
# nothing there. Without it, two ranks on one GPU is an error (it is a launcher mistake).
ENV_SHARED_GPU = "IRONLINK_SHARED_GPU"
_KDL_CUDA = 2


def shared_gpu_allowed() -> bool:
    """Whether $IRONLINK_SHARED_GPU lets ranks share a GPU."""
    return os.environ.get(ENV_SHARED_GPU, "0") == "1"


def load_native() -> Any:
    """The compiled extension, or an IronlinkError saying how to build it."""
    try:
        from . import _native  # type: ignore[attr-defined]
    except ImportError as e:
        raise IronlinkError(
            "ironlink's compiled extension (ironlink._native) is not available: install the "
            "package (`pip install .` or `make wheel` and install build/dist/*.whl) or build it "
            f"in place with `maturin develop` ({e})"
        ) from e
    return _native


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise IronlinkError("ironlink.SymmetricHeap needs PyTorch (import torch failed)") from e
    return torch


def check_size(name: str, value: Any, minimum: int) -> int:
    """`value` as an int >= minimum, or a ValueError/TypeError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int number of bytes, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_algorithm_limits(ar_one_shot_max_bytes: Any, ar_ll_max_bytes: Any, gather_ll_max_bytes: Any) -> tuple[int, int, int]:
    """The three algorithm size limits, checked (non-negative ints below 2^63)."""
    named = (("ar_one_shot_max_bytes", ar_one_shot_max_bytes), ("ar_ll_max_bytes", ar_ll_max_bytes),
             ("gather_ll_max_bytes", gather_ll_max_bytes))
    for name, v in named:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int number of bytes, got {type(v).__name__}")
        if not 0 <= v < 1 << 63:
            raise ValueError(f"{name} must be in [0, 2**63), got {v}")
    return ar_one_shot_max_bytes, ar_ll_max_bytes, gather_ll_max_bytes


def check_timeout(timeout_s: Any) -> int:
    """Seconds -> nanoseconds, validated."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"timeout_s must be a number of seconds, got {type(timeout_s).__name__}")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"timeout_s must be positive and finite, got {timeout_s}")
    return max(1, int(timeout_s * 1e9))


def normalize_shape(shape: Union[int, Iterable[int]]) -> tuple[int, ...]:
    """`5` or `(2, 3)` or `torch.Size` -> a tuple of non-negative ints."""
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise ValueError(f"shape must be non-negative ints, got {shape!r}")
    return dims


def span_bytes(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> int:
    """Bytes from a strided tensor's first element to just past its last one."""
    if any(s == 0 for s in shape):
        return 0
    if any(st < 0 for st in strides):
        raise ValueError("tensors with negative strides are not supported")
    return (sum((n - 1) * st for n, st in zip(shape, strides)) + 1) * itemsize


def same_requests(requests: Sequence[tuple[int, int]]) -> Optional[str]:
    """None if every rank asked for the same (nbytes, scratch_bytes), else a message naming them."""
    groups: dict[tuple[int, int], list[int]] = {}
    for rank, req in enumerate(requests):
        groups.setdefault((req[0], req[1]), []).append(rank)
    if len(groups) <= 1:
        return None
    parts = []
    for (nbytes, scratch), ranks in groups.items():
        who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        parts.append(f"{who}: nbytes={nbytes}, scratch_bytes={scratch}")
    return "ranks asked for different symmetric heap sizes (all must pass the same): " + "; ".join(parts)


def group_alive(dist: Any, group: Any) -> bool:
    """Whether `group` (a ProcessGroup object) is still a live group of torch.distributed: false
    once `destroy_process_group` destroyed it (or the whole default group), also after a new
    `init_process_group` (that makes a new group object)."""
    if not dist.is_initialized():
        return False
    # torch keeps its live groups in _world.pg_map; where a torch version lacks it, only whether
    # torch.distributed is initialized can be checked.
    pg_map = getattr(getattr(getattr(dist, "distributed_c10d", None), "_world", None), "pg_map", None)
    return pg_map is None or group in pg_map


def gather_failures(gathered: Sequence[tuple[str, Any]]) -> Optional[str]:
    """A message naming the ranks that reported ("error", message), grouped by message, or None."""
    by_msg: dict[str, list[int]] = {}
    for r, (kind, m) in enumerate(gathered):
        if kind == "error":
            by_msg.setdefault(str(m), []).append(r)
    if not by_msg:
        return None
    parts = []
    for m, ranks in by_msg.items():
        if len(ranks) == len(gathered) > 1:
            who = "all ranks"
        else:
            who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        parts.append(f"{who}: {m}")
    return "; ".join(parts)


class SymmetricHeap:
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
        self._buffer: Any = None  # backend "nvshmem": PyTorch's buffer and rendezvous handle
        self._closed = True
        self._limits: Optional[tuple[int, int, int]] = None  # None: the device defaults
        self._workspaces: dict[str, list[Any]] = {}  # fused ops' scratch tensors, by op name
        self._stream_order = StreamOrder()  # orders calls issued on different streams
        self._log = HeapLog()  # recent empty/free calls, to name one that differs between ranks
        self._digest_word: Any = None  # the context's heap_digest, as a 1-element int64 tensor
        self._digest_stale = False  # heap calls made since the context's digest was last written
        self._reports = 0  # HEAP_ASYMMETRIC reports so far (their logs meet under this number)
        check_size("nbytes", nbytes, 1)
        check_size("scratch_bytes", scratch_bytes, 0)
        timeout_ns = check_timeout(timeout_s)
        self._backend = check_backend(backend)
        native = load_native()
        torch = _torch()
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise IronlinkError(
                "SymmetricHeap is collective: call torch.distributed.init_process_group first "
                "(e.g. under torchrun)"
            )
        self._group = group
        # The group object itself (not None for the default group), so that a heap outliving its
        # group is recognised even after init_process_group made a new default group.
        self._pg = group if group is not None else dist.group.WORLD
        self._rank = dist.get_rank(group)
        self._world = dist.get_world_size(group)
        if self._backend == "nvshmem":
            check_spans_world(self._world, dist.get_world_size())
        self._node_size = check_node_size(node_size, self._backend, self._world, os.environ.get("LOCAL_WORLD_SIZE"))
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"device must be a CUDA device, got {dev}")
        self._device = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
        self._nccl = "nccl" in str(dist.get_backend(group)).lower()

        # The exchange runs on the caller's current device (the one its NCCL communicator uses),
        # whatever device the heap lives on: the host library does not use torch's current device.
        if self._backend == "nvshmem":
            self._native = self._create_nvshmem(native, nbytes, scratch_bytes, timeout_ns)
            self._owner = (self._native, self._buffer)
        else:
            self._native = self._create(native, nbytes, scratch_bytes, timeout_ns)
            self._owner = self._native
        self._closed = False
        # A name that every rank of this heap shares, for the store keys of its reports.
        self._uid = str(self._all_gather(os.urandom(8).hex())[0])

    def _agree(self, step: Any, what: str) -> Any:
        """Runs `step()` on every rank and returns its result here; if it raised on any rank,
        raises IronlinkError on every rank (naming the ranks), so none waits in a later step."""
        result = None
        try:
            result = step()
            mine: tuple[str, Any] = ("ok", None)
        except Exception as e:
            mine = ("error", str(e))
        failed = gather_failures(self._all_gather(mine))
        if failed:
            raise IronlinkError(f"{what} failed on {failed}")
        return result

    def _configure(self, heap: Any, timeout_ns: int) -> None:
        """Sets the wait timeout and the all-reduce crossovers measured for this world size
        (tuning_table.py) in a freshly opened native heap."""
        heap.set_timeout_ns(timeout_ns)
        from .tuning import algorithm_limits

        limits = algorithm_limits(self._world)
        if limits is not None:
            heap.set_algorithm_limits(*limits)
            self._limits = limits

    def _create_nvshmem(self, native: Any, nbytes: int, scratch_bytes: int, timeout_ns: int) -> Any:
        """Backend "nvshmem": the heap's buffer from PyTorch's NVSHMEM symmetric memory
        (nvshmem_memory.py), after every rank agreed on the sizes (the allocation is collective)."""
        mismatch = same_requests(self._all_gather((nbytes, scratch_bytes)))
        if mismatch:
            raise IronlinkError(mismatch)
        from .nvshmem_memory import open_heap

        torch = _torch()
        group = self._pg
        heap, self._buffer = open_heap(native, torch, self._agree, self._all_gather, group, self._rank,
                                       self._world, self._device, nbytes, scratch_bytes, self._node_size)
        try:
            self._agree(lambda: self._configure(heap, timeout_ns), "configuring the NVSHMEM symmetric heap")
        except BaseException:
            heap.close()
            self._buffer = None
            raise
        return heap

    def _create(self, native: Any, nbytes: int, scratch_bytes: int, timeout_ns: int) -> Any:
        """Allocate, exchange handles, map peers. Every step's outcome is agreed by all ranks, so
        a failure on one rank raises on every rank instead of leaving the others waiting."""
        local = None
        try:
            local = native.LocalHeap.create(self._device.index, nbytes, scratch_bytes, self._rank, self._world)
            mine: tuple[str, Any] = ("ok", ((nbytes, scratch_bytes), local.handle_bytes()))
        except Exception as e:
            mine = ("error", str(e))
        gathered = self._all_gather(mine)
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
            self._configure(heap, timeout_ns)
            mine = ("ok", None)
        except Exception as e:
            mine = ("error", str(e))
        failed = gather_failures(self._all_gather(mine))
        if failed:
            if heap is not None:
                heap.close()
            raise IronlinkError(f"mapping the symmetric heap failed on {failed}")
        return heap

    # -- collectives over the group ---------------------------------------------------------
    def _all_gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self._world
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def _group_barrier(self) -> None:
        import torch.distributed as dist

        if self._nccl:
            import torch

            dist.barrier(group=self._group, device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier(group=self._group)

    # -- state ----------------------------------------------------------------------------
    def _open(self, what: str = "") -> Any:
        """The native heap, or IronlinkError (prefixed with `what`) if it is closed or its process
        group was destroyed (peers may have unmapped their memory: nothing may reach them)."""
        prefix = f"{what}: " if what else ""
        if self._closed or self._native is None:
            raise IronlinkError(f"{prefix}the symmetric heap is closed; it cannot be used any more")
        import torch.distributed as dist

        if not group_alive(dist, self._pg):
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
        """The stream of this heap's last host-level call (see `ironlink.stream_order`)."""
        return self._stream_order

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ctx(self) -> int:
        """Device address of the context: pass it to kernels calling ironlink functions. Read it
        for each launch (every host-level op does): after `empty` or `free` it first brings the
        context's heap digest up to date, on the current stream."""
        native = self._open()
        if self._digest_stale:
            self._publish_digest()
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
        """Whether the heap spans several nodes (only all_reduce serves it so far)."""
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

    def set_algorithm_limits(self, ar_one_shot_max_bytes: int, ar_ll_max_bytes: int, gather_ll_max_bytes: int) -> None:
        """Message sizes up to which all-reduce uses one-shot LL, then two-shot LL (where the
        packets fit the scratch region), then two-shot over the buffers; and up to which
        all_gather (output bytes) and reduce_scatter (input bytes) use LL packets. Every rank
        must set the same values (each rank picks the algorithm on its own). Synchronizes the
        device."""
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
        """Which algorithm `symm_all_reduce` runs for `nbytes` on a grid of `ctas` CTAs on this
        heap: "one_shot_ll", "two_shot_ll" or "two_shot" (the device's own choice)."""
        from . import _native

        one_shot, ll, _ = self.algorithm_limits
        return str(_native.all_reduce_algorithm(self._world, self.scratch_bytes, one_shot, ll, ctas, nbytes))

    # -- tensors --------------------------------------------------------------------------
    def _view(self, rank: int, offset: int, nbytes: int) -> Any:
        """A uint8 tensor over `nbytes` at `offset` of `rank`'s region, on this GPU."""
        torch = _torch()
        native = self._open()
        ptr = native.peer_base(rank) + offset
        from . import _native

        cap = _native.dlpack_capsule(ptr, nbytes, _KDL_CUDA, self._device.index, self._owner)
        return torch.from_dlpack(cap)

    def empty(self, shape: Union[int, Iterable[int]], dtype: Any = None) -> Any:
        """An uninitialized tensor in symmetric memory (collective: same order on all ranks).

        The heap's memory stays valid while the tensor lives, even if the heap object is dropped;
        after an explicit `close()` it must not be used."""
        torch = _torch()
        dtype = torch.float32 if dtype is None else dtype
        dims = normalize_shape(shape)
        nbytes = math.prod(dims) * dtype.itemsize
        native = self._open()
        offset = native.alloc(nbytes)
        try:
            t = self._view(self._rank, offset, nbytes).view(dtype).view(dims)
        except BaseException:
            reserved = native.find(offset)[1]
            native.free(offset)
            self._record("alloc", offset, nbytes, reserved, f"shape {dims}, {dtype}")
            self._record("free", offset, nbytes, reserved, f"shape {dims}, {dtype}")
            raise
        self._record("alloc", offset, nbytes, native.find(offset)[1], f"shape {dims}, {dtype}")
        return t

    def _record(self, op: str, offset: int, nbytes: int, reserved: int, what: str) -> None:
        """Notes an allocator call in the log; the context's digest follows at the next `ctx`."""
        self._log.record(op, offset, nbytes, reserved, what)
        self._digest_stale = True

    def _publish_digest(self) -> None:
        """Writes the allocator's digest into the context's `heap_digest`, on the current stream,
        before the launch that reads `ctx`: it sees the digest of every heap call made before it,
        as the peers' launches of the same call do. Written once for any number of heap calls
        between two launches: a one-element fill (a tiny kernel; captured into a CUDA graph like
        any other), never a host synchronization. Ordered like a heap call (`stream_order`): after
        the last call if that ran on another stream, and before the next call on any stream."""
        torch = _torch()
        native = self._open()
        if self._digest_word is None:
            from . import _native

            offset, size = _abi.CONTEXT_FIELDS["heap_digest"]
            cap = _native.dlpack_capsule(int(native.ctx) + offset, size, _KDL_CUDA, self._device.index, self._owner)
            self._digest_word = torch.from_dlpack(cap).view(torch.int64)
        digest = int(native.digest)
        with torch.cuda.device(self._device):
            stream = torch.cuda.current_stream(self._device)
            capturing = torch.cuda.is_current_stream_capturing()
            self._stream_order.before_call(stream, capturing)
            self._digest_word.fill_(digest - (1 << 64) if digest >= 1 << 63 else digest)
        # A fill captured into a graph runs only at replay: the next launch outside writes again.
        self._digest_stale = capturing

    def workspace(self, name: str, nbytes: int, zeroed_prefix: int = 0) -> Any:
        """A uint8 heap tensor of at least `nbytes` that the fused op `name` keeps between calls
        (collective: every rank makes the same calls). A larger request allocates a larger one
        (a power of two); the smaller ones stay allocated until `close()`, so CUDA graphs captured
        with them stay valid. The first `zeroed_prefix` bytes of a new one are zero-filled (on the
        current stream): counters the op keeps there start equal on every rank. A new one with
        such counters cannot be made while a CUDA graph is captured (the fill would repeat on
        every replay): run the op once before capturing it."""
        torch = _torch()
        kept = self._workspaces.setdefault(name, [])
        if not kept or kept[-1].numel() < nbytes:
            if zeroed_prefix and torch.cuda.is_current_stream_capturing():
                raise IronlinkError(f"ironlink.{name} needs a workspace of {nbytes} bytes, which cannot be made "
                                    "during CUDA graph capture: call it once with these shapes before capturing")
            kept.append(self.empty(1 << max(12, (nbytes - 1).bit_length()), torch.uint8))
            if zeroed_prefix:
                kept[-1][:zeroed_prefix].zero_()
        return kept[-1]

    def zeros(self, shape: Union[int, Iterable[int]], dtype: Any = None) -> Any:
        """Like `empty`, zero-filled (on the current stream)."""
        return self.empty(shape, dtype).zero_()

    def _local_offset(self, t: Any, what: str) -> tuple[int, int]:
        """(offset of t's first byte in our region, byte span), or IronlinkError."""
        torch = _torch()
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
        """Returns `t`'s memory to the heap (collective: same order on all ranks).

        Peers may still be accessing it: put a `barrier()` before reusing the memory if so."""
        offset, _ = self._local_offset(t, "free")
        native = self._open()
        reserved = native.find(offset)[1]
        native.free(offset)
        nbytes = span_bytes(t.shape, t.stride(), t.element_size())
        self._record("free", offset, nbytes, reserved, f"shape {tuple(t.shape)}, {t.dtype}")

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
        torch = _torch()
        self._open()
        torch.cuda.synchronize(self._device)
        self._group_barrier()

    def check(self) -> None:
        """Raises IronlinkError if a device function recorded an error in the context (and
        clears it). Waits for this GPU's work first."""
        native = self._open()
        code, detail = native.read_error()
        if code != 0:
            native.clear_error()
            raise self.explain(device_error(code, detail, self._rank))

    def explain(self, e: IronlinkError) -> IronlinkError:
        """`e` with the first heap call that differs between the ranks appended, if it reports
        HEAP_ASYMMETRIC (the ranks' recent calls meet in torch.distributed's store; a rank that
        does not report within a few seconds is left out); any other error as it is."""
        if e.status != _abi.STATUS["HEAP_ASYMMETRIC"]:
            return e
        self._reports += 1
        mine = (int(self._open().digest), self._log.events())
        peers = None
        try:
            import torch.distributed as dist

            store = dist.distributed_c10d._get_default_store()
            peers = exchange(store, f"ironlink/heap-calls/{self._uid}/{self._reports}", self._rank, self._world, mine)
        except Exception:  # noqa: BLE001 - no store: report this rank's calls alone
            peers = None
        report = asymmetry_report(self._rank, mine[0], self._log, peers)
        return IronlinkError(f"{e}. {report}", status=e.status, function=e.function)

    def close(self) -> None:
        """Frees the heap (collective). Idempotent; tensors from it must not be used after."""
        if self._closed:
            return
        self._closed = True
        native, self._native = self._native, None
        self._digest_word = None  # a view of the context, which goes with the heap
        import torch.distributed as dist

        # Without its group (destroyed) there is no barrier to hold: free our side alone (memory a
        # peer still maps is released only when the peer unmaps it).
        alive = group_alive(dist, self._pg)
        try:
            # No rank may still access our memory, nor we theirs, when mappings go away.
            torch = _torch()
            torch.cuda.synchronize(self._device)
            if alive:
                self._group_barrier()
        finally:
            native.close()
            # PyTorch's buffer (backend "nvshmem") goes back to PyTorch once no tensor of this
            # heap holds it any more (they keep it through `_owner`).
            self._buffer = self._owner = None
        # Memory a peer still maps is released only when the peer unmaps it: after this
        # barrier every rank's close() has unmapped and freed.
        if alive:
            self._group_barrier()

    def __enter__(self) -> "SymmetricHeap":
        self._open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed or self._native is None else f"{int(self._native.heap_size)} bytes"
        backend = getattr(self, "_backend", "p2p")
        return f"SymmetricHeap(rank {self._rank}/{self._world}, {self._device}, {backend}, {state})"
