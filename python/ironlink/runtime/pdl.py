"""Whether a latency-bound kernel launches with programmatic dependent launch, and the launch
options that say so (the device half, and the rule kernels keep: `ironlink.language.pdl`)."""

from __future__ import annotations

from typing import Optional

from . import tuning
from .distributed import ranks_per_gpu

MIN_MAJOR = 9  # griddepcontrol: sm_90 (Hopper) and later


def choose_pdl(requested: Optional[bool], major: int, op: str, multi_node: bool = False) -> bool:
    """Whether `op` launches with PDL on a GPU of compute capability `major`.x: `requested`, or
    `tuning.DECODE_PDL` where it is None; off where the GPU lacks it or the heap spans several
    nodes (those kernels do not take it), where asking for it raises ValueError.

    Where ranks share a GPU (`ranks_per_gpu` > 1) the default is off too: with PDL a rank's next
    kernel takes SMs while its last still runs, so two grids of one rank can hold the SMs that a
    peer's grid needs to become resident (matmul_all_reduce "lamport", 8 launches back to back, 4
    ranks on one H200: no launch ended within 130 s at a 5 s wait timeout; without PDL the same
    cases took 34 s). Asking for it there is allowed: kernels of a few CTAs an SM still fit."""
    why_not = None
    if multi_node:
        why_not = "the kernels of a heap of several nodes do not take it"
    elif major < MIN_MAJOR:
        why_not = f"it needs compute capability {MIN_MAJOR}.0 or later (griddepcontrol), this GPU is {major}.x"
    if requested is None:
        return tuning.DECODE_PDL and why_not is None and ranks_per_gpu() == 1
    if requested and why_not:
        raise ValueError(f"ironlink.{op}(pdl=True): {why_not}")
    return bool(requested)


def pdl_launch_options(pdl: bool) -> dict[str, bool]:
    """The keyword arguments a launch of a kernel with a `PDL` constexpr takes: the constexpr (the
    griddepcontrol instructions) and Triton's launch attribute go together."""
    return {"PDL": True, "launch_pdl": True} if pdl else {}


__all__ = ["MIN_MAJOR", "choose_pdl", "pdl_launch_options"]
