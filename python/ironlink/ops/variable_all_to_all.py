"""All-to-all with variable splits whose counts never leave the GPU (MoE token exchange):

    out, recv_counts, recv_offsets = ironlink.all_to_all_v(inp, send_counts, out)

`inp` [in_rows, ...] holds this rank's rows grouped by destination rank in rank order,
`send_counts` (int64 [world], a heap tensor: peers read it) how many go to each rank. Rank p's
`out` [out_rows, ...] gets them in sender rank order; `recv_counts[q]` / `recv_offsets[q]`
(int64 [world], heap) say how many rows came from rank q and where they start. Everything is read
and written on the GPU, so a CUDA graph replays correctly when the counts change between replays.
If some rank would receive more than `out_rows` rows, every rank's call fails with
CAPACITY_EXCEEDED (raised with `check=True`, else by `heap.check()`) and only the receive counts
and offsets are written: read them to see who would have received how many.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import triton.language as tl

from ..language import typed as ilt
from ..language.jit import jit
from ..runtime.launch import launch_with_status
from ..runtime.tensor_spec import TensorSpec, check_tensor
from ..runtime.registry import heap_for, in_heap
from ..runtime.staging import copy_back, empty_for, needs_staging, on_heap
from ..language._abi import MAX_CTAS
from ..runtime.distributed import grid_cap
from ..runtime import eager
from .operators import torch_operators
from ..runtime.tuning import all_to_all_v_launch


class Plan(NamedTuple):
    in_rows: int
    out_rows: int
    row_elements: int
    ctas: int
    warps: int


def plan(inp: TensorSpec, send_counts: TensorSpec, out: TensorSpec, recv_counts: TensorSpec,
         recv_offsets: TensorSpec, device: str, world: int, ctas: Optional[int] = None) -> Plan:
    """Checks the tensors (pure: testable without a GPU) and chooses the launch."""
    code = check_tensor(inp, device)
    if check_tensor(out, device) != code:
        raise TypeError(f"out is {out.dtype} but inp is {inp.dtype}; they must match")
    if len(inp.shape) < 1 or len(out.shape) < 1 or inp.shape[1:] != out.shape[1:]:
        raise ValueError(f"inp {inp.shape} and out {out.shape} must be [rows, ...] with the same row shape")
    for t in (send_counts, recv_counts, recv_offsets):
        if t.dtype != "int64" or t.shape != (world,) or not t.contiguous or t.device != device:
            raise ValueError(f"{t.name} must be a contiguous int64 tensor of shape ({world},) on {device}, "
                             f"got {t.dtype} {t.shape} on {t.device}")
    row = math.prod(inp.shape[1:])
    default, warps = all_to_all_v_launch()
    if ctas is not None and not 1 <= ctas <= MAX_CTAS:
        raise ValueError(f"ctas must be in 1..{MAX_CTAS}, got {ctas}")
    return Plan(inp.shape[0], out.shape[0], row, ctas or default, warps)


@jit(do_not_specialize=["ctx", "in_rows", "out_rows", "row"])
def _all_to_all_v_kernel(ctx, inp, in_rows, send_counts, out, out_rows, recv_counts, recv_offsets, row, status):
    s = ilt.all_to_all_v(ctx, inp, in_rows, send_counts, out, out_rows, recv_counts, recv_offsets, row)
    tl.store(status + tl.program_id(0), s)


@eager.routed(torch_operators)  # what torch.ops.ironlink.all_to_all_v runs, and where a traced call goes
def all_to_all_v(inp: Any, send_counts: Any, out: Any, recv_counts: Any = None, recv_offsets: Any = None,
                 heap: Optional[Any] = None, check: bool = False, ctas: Optional[int] = None) -> tuple[Any, Any, Any]:
    """(out, recv_counts, recv_offsets); see the module docs. `recv_counts` / `recv_offsets` default
    to new heap tensors (the caller frees them with heap.free). `ctas` (the same on every rank)
    overrides the grid, e.g. `tuning.all_to_all_v_launch(bound)[0]` for a bound on the bytes
    moved. Tensors outside the heap (on its GPU, `heap=` given, every rank alike) go through heap
    workspaces, as under torch.compile (`runtime.staging`). Collective; CUDA-graph capturable once
    it has run outside capture (and with recv_counts / recv_offsets given)."""
    import torch

    h = heap_for(inp, "inp", heap, "all_to_all_v")
    given = (inp, send_counts, out, recv_counts, recv_offsets)
    if any(needs_staging(h, t) for t in given):
        s_inp, s_counts, s_out, s_recv, s_offsets = on_heap(h, "all_to_all_v", given)
        got = all_to_all_v(s_inp, s_counts, s_out, s_recv, s_offsets, h, check, ctas)
        copy_back((out, recv_counts, recv_offsets), (s_out, s_recv, s_offsets))
        return out, got[1] if recv_counts is None else recv_counts, got[2] if recv_offsets is None else recv_offsets
    if recv_counts is None:
        recv_counts = empty_for(h, "all_to_all_v", "recv_counts", (h.world_size,), torch.int64)
    if recv_offsets is None:
        recv_offsets = empty_for(h, "all_to_all_v", "recv_offsets", (h.world_size,), torch.int64)
    spec = TensorSpec.from_tensor
    p = plan(spec(inp, "inp"), spec(send_counts, "send_counts"), spec(out, "out"), spec(recv_counts, "recv_counts"),
             spec(recv_offsets, "recv_offsets"), str(h.device), h.world_size, ctas)
    if check:  # the rows each rank sends may differ; their width, dtype and the grid may not
        h.compare_call("all_to_all_v", row_elements=p.row_elements, dtype=str(inp.dtype), grid=p.ctas)
    in_heap(h, "all_to_all_v", (inp, "inp"), (send_counts, "send_counts"), (out, "out"), (recv_counts, "recv_counts"),
            (recv_offsets, "recv_offsets"))
    # On a heap of several nodes the same kernel compiles to the hierarchical version: counts
    # exchanged with the partners first, the rows that cross nodes streamed through the scratch
    # (docs/backends.md).
    function = "symm_all_to_all_v_hierarchical" if h.multi_node else "symm_all_to_all_v"
    ctas = min(p.ctas, grid_cap(h.device))
    launch_with_status(
        "all_to_all_v", h, ctas,
        lambda status: _all_to_all_v_kernel[(ctas,)](h.ctx, inp, p.in_rows, send_counts, out, p.out_rows,
                                                     recv_counts, recv_offsets, p.row_elements, status,
                                                     num_warps=p.warps),
        check, function=function)
    return out, recv_counts, recv_offsets


__all__ = ["all_to_all_v", "plan"]
