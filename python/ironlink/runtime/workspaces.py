"""The heap workspaces of the peer-slot exchanges (`ironlink.language.slots`): lamport slots made
empty before any peer can store into them, and the per-CTA launch counters, each kept in the
heap between calls under the op's name."""

from __future__ import annotations

from typing import Any

from ..language import _abi
from ..language._flags import EMPTY_BITS


def lamport_workspace_name(name: str, dtype: Any) -> str:
    """The heap workspace that holds op `name`'s lamport slots of `dtype`: one per element width,
    as the width sets the empty value."""
    import torch

    return f"{name}/lamport{8 * torch.empty((), dtype=dtype).element_size()}"


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


def epoch_counters(heap: Any, name: str) -> Any:
    """The op `name`'s per-CTA launch counters (int32 [MAX_CTAS], zeroed when made: equal on every
    rank), kept in the heap between calls."""
    import torch

    nbytes = 4 * _abi.MAX_CTAS
    return heap.workspace(f"{name}/epochs", nbytes, zeroed_prefix=nbytes).view(torch.int32)


__all__ = ["epoch_counters", "lamport_bits", "lamport_workspace", "lamport_workspace_name"]
