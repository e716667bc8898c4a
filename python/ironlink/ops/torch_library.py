"""The host-level collectives as PyTorch custom operators (`torch.ops.ironlink.*`), so that
torch.compile captures them in its graph, fullgraph and under CUDA graphs (mode="reduce-overhead").

`ironlink.all_reduce(...)` and the others route here while Dynamo traces them (`runtime.eager.routed`);
in eager they run as before, without the dispatcher's cost. The routing functions below take the
public functions' arguments and do only what Dynamo can trace: they turn the heap into its int
handle (custom operators take no Python objects), the reduce op into its code and a config into
its string (`runtime.tuning.op_config`), and call the operator. Everything that reads addresses
(`data_ptr`, heap membership) and launches runs in the operator's implementation, which calls the
public function itself, checks included, when the compiled graph runs. This module imports none
of the public modules (they import it, to route): each of them enters its function in
`runtime.eager` when imported, and the implementation finds it there by name.

Every operator mutates its outputs in place and returns nothing (its fake implementation has
nothing to compute), as the public functions do; the routing functions return the tensors the
public ones return. Inductor may hand an operator a copy of a heap tensor instead of the tensor
(when it cannot write an argument in place, or when the tensor was written by another op of the
graph first, e.g. `torch.mm(..., out=buf)`): the implementation then stages it through the heap
(`runtime.staging.on_heap` and `copy_back`).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from ..runtime import eager, tuning
from ..runtime.tensor_spec import reduce_op_code
from ..runtime.tuning import op_config
from ..runtime.staging import copy_back, on_heap
from ..runtime.torch_ops import LIB, handle_of, heap_of, refuse_allocation


@torch.library.custom_op(f"{LIB}::all_reduce", mutates_args=("t",))
def all_reduce_op(heap: int, t: torch.Tensor, op: int, check: bool, pdl: Optional[bool], config: str) -> None:
    h = heap_of(heap, t, "all_reduce")
    staged = on_heap(h, "all_reduce", (t,))
    eager.function("all_reduce")(staged[0], op, heap=h, check=check, pdl=pdl,
                                 config=op_config.from_arg(tuning.AllReduceConfig, config))
    copy_back((t,), staged)


@torch.library.custom_op(f"{LIB}::all_gather", mutates_args=("out",))
def all_gather_op(heap: int, out: torch.Tensor, inp: torch.Tensor, check: bool) -> None:
    h = heap_of(heap, out, "all_gather")
    s_out, s_inp = on_heap(h, "all_gather", (out, inp))
    eager.function("all_gather")(s_out, s_inp, heap=h, check=check)
    copy_back((out,), (s_out,))


@torch.library.custom_op(f"{LIB}::reduce_scatter", mutates_args=("out",))
def reduce_scatter_op(heap: int, out: torch.Tensor, inp: torch.Tensor, op: int, check: bool) -> None:
    h = heap_of(heap, inp, "reduce_scatter")
    s_out, s_inp = on_heap(h, "reduce_scatter", (out, inp))
    eager.function("reduce_scatter")(s_out, s_inp, op, heap=h, check=check)
    copy_back((out,), (s_out,))


@torch.library.custom_op(f"{LIB}::all_to_all_v", mutates_args=("out", "recv_counts", "recv_offsets"))
def all_to_all_v_op(heap: int, inp: torch.Tensor, send_counts: torch.Tensor, out: torch.Tensor,
                    recv_counts: torch.Tensor, recv_offsets: torch.Tensor, check: bool, ctas: Optional[int]) -> None:
    h = heap_of(heap, inp, "all_to_all_v")
    written = (out, recv_counts, recv_offsets)
    s_inp, s_counts, s_out, s_recv, s_offsets = on_heap(h, "all_to_all_v", (inp, send_counts, *written))
    eager.function("all_to_all_v")(s_inp, s_counts, s_out, s_recv, s_offsets, heap=h, check=check, ctas=ctas)
    copy_back(written, (s_out, s_recv, s_offsets))


# Nothing to compute for a fake tensor: each operator only writes its arguments.
for _op in (all_reduce_op, all_gather_op, reduce_scatter_op, all_to_all_v_op):
    _op.register_fake(lambda *args, **kwargs: None)


# --- what the public functions run while Dynamo traces them --------------------------------------
# Each takes its public function's arguments (`runtime.eager.routed` passes them as given); the
# reduce op goes to the operator as its code (`reduce_op_code`, which raises for a bad op while
# tracing, as in eager).


def all_reduce(t: torch.Tensor, op: Union[str, int] = "sum", heap: Any = None, check: bool = False,
               pdl: Optional[bool] = None, config: Optional[tuning.AllReduceConfig] = None) -> torch.Tensor:
    torch.ops.ironlink.all_reduce(handle_of(heap), t, reduce_op_code(op), check, pdl, op_config.as_arg(config))
    return t


def all_gather(out: torch.Tensor, inp: torch.Tensor, heap: Any = None, check: bool = False) -> torch.Tensor:
    torch.ops.ironlink.all_gather(handle_of(heap), out, inp, check)
    return out


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, op: Union[str, int] = "sum", heap: Any = None,
                   check: bool = False) -> torch.Tensor:
    torch.ops.ironlink.reduce_scatter(handle_of(heap), out, inp, reduce_op_code(op), check)
    return out


def all_to_all_v(inp: torch.Tensor, send_counts: torch.Tensor, out: torch.Tensor, recv_counts: Any = None,
                 recv_offsets: Any = None, heap: Any = None, check: bool = False,
                 ctas: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if recv_counts is None or recv_offsets is None:
        refuse_allocation("ironlink.all_to_all_v", "recv_counts and recv_offsets")
    torch.ops.ironlink.all_to_all_v(handle_of(heap), inp, send_counts, out, recv_counts, recv_offsets, check, ctas)
    return out, recv_counts, recv_offsets


__all__ = ["all_gather", "all_reduce", "all_to_all_v", "reduce_scatter"]
