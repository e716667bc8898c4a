"""Using ironlink's device functions on PyTorch's own symmetric memory.

PyTorch (``torch.distributed._symmetric_memory``) allocates symmetric buffers and maps every
peer's; its rendezvous handle knows each rank's buffer and signal pad address. From those we build
an ironlink context, so kernels can call ``ironlink.language.*`` on tensors from
``symm_mem.empty`` exactly as on an ironlink heap:

    import torch.distributed._symmetric_memory as symm_mem
    symm_mem.set_signal_pad_size(ironlink.torch_interop.MIN_SIGNAL_PAD_BYTES)  # before allocating
    t = symm_mem.empty(n, device="cuda")
    with ironlink.torch_interop.context_from_symm_mem(t) as c:
        kernel[grid](t, c.ctx, ...)

Limits: there is no scratch region (collectives that need one require an ironlink heap), and
the signal pad is shared with PyTorch: do not interleave PyTorch's symm_mem barriers/signals
with ironlink functions on the same allocation.
"""

from __future__ import annotations

from typing import Any, Optional

from ..language import _abi
from .errors import IronlinkError, device_error
from .heap_args import check_algorithm_limits, check_timeout
from .native import load_native, load_torch

# The smallest signal pad ironlink can use (abi::signal::MIN_BYTES).
MIN_SIGNAL_PAD_BYTES: int = _abi.SIGNAL_LAYOUT["MIN_BYTES"]
# A signal pad with the LL receive area of small tile all-reduces (abi::signal::FULL_BYTES); with
# a smaller one `symm_tile_all_reduce` runs every tile two-shot.
FULL_SIGNAL_PAD_BYTES: int = _abi.SIGNAL_LAYOUT["FULL_BYTES"]


class SymmMemContext:
    """An ironlink context over a PyTorch symmetric-memory allocation.

    Keeps the PyTorch handle (and tensor, if given) alive while the context exists."""

    def __init__(self, native: Any, handle: Any, tensor: Any = None) -> None:
        self._native = native
        self.handle = handle
        self._tensor = tensor

    def _open(self) -> Any:
        if self._native is None:
            raise IronlinkError("the symmetric-memory context is closed; it cannot be used any more")
        return self._native

    @property
    def ctx(self) -> int:
        return int(self._open().ctx)

    @property
    def rank(self) -> int:
        return int(self._open().rank)

    @property
    def world_size(self) -> int:
        return int(self._open().world)

    @property
    def closed(self) -> bool:
        return self._native is None

    def set_timeout(self, timeout_s: float) -> None:
        self._open().set_timeout_ns(check_timeout(timeout_s))

    def set_algorithm_limits(self, ar_one_shot_max_bytes: int, ar_ll_max_bytes: int, gather_ll_max_bytes: int) -> None:
        """See `SymmetricHeap.set_algorithm_limits`."""
        limits = check_algorithm_limits(ar_one_shot_max_bytes, ar_ll_max_bytes, gather_ll_max_bytes)
        self._open().set_algorithm_limits(*limits)

    def check(self) -> None:
        """Raises IronlinkError for an error a device function recorded (and clears it)."""
        native = self._open()
        code, detail = native.read_error()
        if code != 0:
            native.clear_error()
            raise device_error(code, detail, int(native.rank))

    def close(self) -> None:
        """Frees the context (not PyTorch's memory). Idempotent."""
        native, self._native = self._native, None
        if native is not None:
            native.close()
        self._tensor = None

    def __enter__(self) -> "SymmMemContext":
        self._open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _signal_pad_size(handle: Any) -> int:
    size = getattr(handle, "signal_pad_size", None)
    if size is None:  # some builds expose it only module-wide
        import torch.distributed._symmetric_memory as symm_mem

        size = symm_mem.get_signal_pad_size()
    return int(size)


def context_from_symm_mem(tensor_or_handle: Any, group: Any = None, device: Optional[Any] = None) -> SymmMemContext:
    """Builds an ironlink context over PyTorch symmetric memory.

    Args:
        tensor_or_handle: a tensor from ``symm_mem.empty`` (rendezvous is done here, a collective
            over `group`) or the handle ``symm_mem.rendezvous`` returned.
        group: process group or group name for the rendezvous (default: the world group).
        device: CUDA device of the memory (default: the tensor's, else the current device).
    """
    torch = load_torch()
    native = load_native()
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    tensor = None
    if isinstance(tensor_or_handle, torch.Tensor):
        tensor = tensor_or_handle
        if group is None:
            group = dist.group.WORLD
        name = group if isinstance(group, str) else group.group_name
        handle = symm_mem.rendezvous(tensor, name)
        dev = tensor.device if device is None else torch.device(device)
    else:
        handle = tensor_or_handle
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.type != "cuda" or dev.index is None:
        raise ValueError(f"device must be a CUDA device with an index, got {dev}")
    buffer_ptrs = [int(p) for p in handle.buffer_ptrs]
    signal_ptrs = [int(p) for p in handle.signal_pad_ptrs]
    ctx = native.ExternalContext(
        dev.index,
        int(handle.rank),
        int(handle.world_size),
        buffer_ptrs,
        int(handle.buffer_size),
        signal_ptrs,
        _signal_pad_size(handle),
    )
    return SymmMemContext(ctx, handle, tensor)
