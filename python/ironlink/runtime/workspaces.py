"""The heap workspaces of the peer-slot exchanges (`ironlink.language.slots`): lamport slots made
empty before any peer can store into them, and the per-CTA launch counters, each kept in the
heap between calls under the op's name."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from ..language import _abi
from ..language._flags import EMPTY_BITS
from .errors import IronlinkError


def workspace_size(nbytes: int) -> int:
    """The bytes `heap.workspace` allocates for a request of `nbytes`: the next power of two,
    4 KiB at least (a multiple of the heap's allocation alignment)."""
    return 1 << max(12, (nbytes - 1).bit_length())


def kept_workspace(kept: dict[str, list[Any]], name: str, nbytes: int, make: Callable[[str, int], Any],
                   capturing: Callable[[], bool], zeroed_prefix: int = 0,
                   init: Optional[Callable[[Any], None]] = None) -> Any:
    """Op `name`'s workspace of at least `nbytes` among the heap's `kept` ones (name -> the ones
    made, smallest first). A larger request makes a larger one, `make(name, workspace_size(nbytes))`;
    the smaller ones stay allocated until the heap closes, so CUDA graphs captured with them stay
    valid. The first `zeroed_prefix` bytes of a new one are zero-filled (on the current stream):
    counters the op keeps there start equal on every rank; `init` (if given) is called with a new
    one, to fill it otherwise. A new one with such contents cannot be made while a CUDA graph is
    captured (`capturing()`: the fill would repeat on every replay): run the op once before
    capturing it."""
    made = kept.setdefault(name, [])
    if not made or made[-1].numel() < nbytes:
        if (zeroed_prefix or init) and capturing():
            raise IronlinkError(f"ironlink.{name} needs a workspace of {nbytes} bytes, which cannot be made "
                                "during CUDA graph capture: call it once with these shapes before capturing")
        made.append(make(name, workspace_size(nbytes)))
        if zeroed_prefix:
            made[-1][:zeroed_prefix].zero_()
        if init is not None:
            init(made[-1])
    return made[-1]


def slot_half(ws: Any) -> int:
    """The elements of one half of the slot workspace `ws` (as the kernel indexes it: `ws`'s
    dtype), which alternate launches use in turn (`language.slots.launch_slots`): half of `ws`,
    the same for every call that uses it whatever its shape, so that consecutive launches of
    different shapes use disjoint memory. `ws` holds at least two halves of any call given it
    (`kept_workspace` returns the largest made)."""
    return int(ws.numel()) // 2


def slot_halves(ws: Any, rows: int, cols: int) -> Any:
    """[2, rows, cols] of the slot workspace `ws` at world 2 (one slot a half): half p at `ws`'s
    element p x `slot_half(ws)`, as the kernel's `launch_slots` places it (a TMA descriptor's view)."""
    half = slot_half(ws)
    return ws[:2 * half].view(2, half)[:, :rows * cols].unflatten(1, (rows, cols))


def workspaces_heap_bytes(calls: Iterable[dict[str, int]]) -> int:
    """The heap bytes an op's workspaces may take over `calls` (each call's requests, name ->
    bytes), made in any order: a larger request makes a new workspace and the smaller ones stay
    (CUDA graphs captured with them stay valid), so a name may hold every power of two from 4 KiB
    up to its largest request, less than twice that."""
    largest: dict[str, int] = {}
    for requests in calls:
        for name, nbytes in requests.items():
            largest[name] = max(largest.get(name, 0), nbytes)
    return sum(2 * workspace_size(n) - 4096 for n in largest.values() if n > 0)


def lamport_name(name: str, itemsize: int) -> str:
    """The heap workspace that holds op `name`'s lamport slots of elements of `itemsize` bytes:
    one per element width, as the width sets the empty value."""
    return f"{name}/lamport{8 * itemsize}"


def lamport_workspace_name(name: str, dtype: Any) -> str:
    """`lamport_name` for elements of torch `dtype`."""
    import torch

    return lamport_name(name, torch.empty((), dtype=dtype).element_size())


def lamport_bits(t: Any) -> Any:
    """`t` (lamport slots of bf16, fp16 or fp32) as the signed integers of its width, whose
    smallest value is "empty" (the sign bit alone: -0.0)."""
    import torch

    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def lamport_workspace(heap: Any, name: str, nbytes: int, dtype: Any) -> Any:
    """The heap workspace of op `name` (at least `nbytes`) as lamport slots of `dtype`: every
    element -0.0 when made (bf16 and fp16 0x8000, fp32 0x80000000). A peer may store into a new
    one as soon as it has its own, so every rank fills its own, then all meet (`heap.barrier`);
    made outside a CUDA graph capture (`heap.workspace`; `heap.has_workspace(
    lamport_workspace_name(...), nbytes)` says whether one exists)."""

    def empty(t: Any) -> None:
        bits = lamport_bits(t.view(dtype))
        bits.fill_(EMPTY_BITS[8 * bits.element_size()])
        heap.barrier()

    return heap.workspace(lamport_workspace_name(name, dtype), nbytes, init=empty).view(dtype)


EPOCH_COUNTER_BYTES = 4 * _abi.MAX_CTAS  # an op's launch counters: int32 [MAX_CTAS]


def epochs_name(name: str) -> str:
    """The heap workspace of op `name`'s launch counters."""
    return f"{name}/epochs"


def epoch_counters(heap: Any, name: str) -> Any:
    """The op `name`'s per-CTA launch counters (int32 [MAX_CTAS], zeroed when made: equal on every
    rank), kept in the heap between calls."""
    import torch

    nbytes = EPOCH_COUNTER_BYTES
    return heap.workspace(epochs_name(name), nbytes, zeroed_prefix=nbytes).view(torch.int32)


__all__ = ["EPOCH_COUNTER_BYTES", "epoch_counters", "epochs_name", "kept_workspace", "lamport_bits", "lamport_name",
           "lamport_workspace", "lamport_workspace_name", "slot_half", "slot_halves", "workspace_size",
           "workspaces_heap_bytes"]
