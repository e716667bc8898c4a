"""MoeExchange's dispatch and combine as PyTorch custom operators (`torch.ops.ironlink.moe_*`),
for torch.compile; the same scheme as the host-level collectives' (`ironlink.ops.torch_library`).

`moe.dispatch` / `moe.combine` route here while Dynamo traces them; the exchange travels as its
int handle (`MoeExchange.op_handle`, `runtime.handles`). dispatch writes the exchange's own
`recv_x` (and `recv_scales`), which it returns: the operator takes them as arguments it mutates,
so the graph knows who wrote them (where Inductor passes a copy instead, the implementation
copies the exchange's buffers into it). Its other results (counts, offsets and the handle's
tensors) are new tensors, as in eager. Keep the MoeExchange an attribute of the nn.Module being
compiled: its buffers are then static inputs, which CUDA graphs need (docs/python.md).

This module imports nothing of `moe.exchange` (which routes here: `runtime.eager.routed`): the
operators call the methods of the exchange their handle names, and a handle is `moe.handle.Handle`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..runtime.torch_ops import LIB
from ..runtime import handles
from .handle import Handle

DispatchOut = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _exchange(handle: int, what: str) -> Any:
    moe = handles.lookup(handle, f"torch.ops.{LIB}.{what}")
    # A MoeExchange, told by the handle it holds (a heap has a `handle`, no `op_handle`).
    assert getattr(moe, "op_handle", None) == handle, f"handle {handle} names a {type(moe).__name__}, not a MoeExchange"
    return moe


@torch.library.custom_op(f"{LIB}::moe_dispatch", mutates_args=("recv_x", "recv_scales"))
def moe_dispatch_op(exchange: int, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                    recv_x: torch.Tensor, recv_scales: torch.Tensor, check: bool) -> DispatchOut:
    """(expert_counts, expert_offsets, send_row, slot, weight, received): dispatch's results
    besides recv_x / recv_scales (written in place) and the token count (x's rows)."""
    moe = _exchange(exchange, "moe_dispatch")
    _, counts, offsets, h = moe.dispatch(x, topk_idx, topk_weights, check)
    for given, own in ((recv_x, moe.recv_x), (recv_scales, moe.recv_scales)):
        if given.data_ptr() != own.data_ptr():  # Inductor's copy of the buffer
            given.copy_(own)
    return counts, offsets, _send_row_out(x, h.send_row), h.slot, h.weight, h.received


def _send_row_out(x: torch.Tensor, send_row: Any) -> torch.Tensor:
    """The handle's send_row as an operator output: the direct path has none (None), which an
    operator cannot return, so it travels as an empty [tokens, 0] tensor (`_send_row_in`)."""
    return x.new_empty((x.shape[0], 0), dtype=torch.int64) if send_row is None else send_row


def _send_row_in(send_row: torch.Tensor) -> Any:
    """`_send_row_out` undone: None for the direct path's empty stand-in."""
    return send_row if send_row.shape[1] else None


@moe_dispatch_op.register_fake
def _dispatch_fake(exchange: int, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                   recv_x: torch.Tensor, recv_scales: torch.Tensor, check: bool) -> DispatchOut:
    moe = _exchange(exchange, "moe_dispatch")
    rows, i64 = moe.world * moe.max_tokens, torch.int64
    return (x.new_empty((moe.local_experts,), dtype=i64), x.new_empty((moe.local_experts,), dtype=i64),
            x.new_empty((x.shape[0], moe.world if moe.path == "relay" else 0), dtype=i64),
            x.new_empty((rows, moe.topk), dtype=i64),
            x.new_empty((rows, moe.topk), dtype=torch.float32), x.new_empty((1,), dtype=i64))


@torch.library.custom_op(f"{LIB}::moe_combine", mutates_args=())
def moe_combine_op(exchange: int, y: torch.Tensor, send_row: torch.Tensor, slot: torch.Tensor, weight: torch.Tensor,
                   received: torch.Tensor, check: bool) -> torch.Tensor:
    moe = _exchange(exchange, "moe_combine")
    handle = Handle(send_row.shape[0], _send_row_in(send_row), slot, weight, received)
    out: torch.Tensor = moe.combine(y, handle, check)
    return out


@moe_combine_op.register_fake
def _combine_fake(exchange: int, y: torch.Tensor, send_row: torch.Tensor, slot: torch.Tensor, weight: torch.Tensor,
                  received: torch.Tensor, check: bool) -> torch.Tensor:
    moe = _exchange(exchange, "moe_combine")
    return y.new_empty((send_row.shape[0], moe.hidden), dtype=moe.dtype)


# --- what MoeExchange.dispatch / combine run while Dynamo traces them ---------------------------


def dispatch(moe: Any, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
             check: bool = False, return_recv_hook: bool = False) -> tuple[Any, torch.Tensor, torch.Tensor, Handle]:
    """`MoeExchange.dispatch` while Dynamo traces it: the operator, whose results are dispatch's."""
    if return_recv_hook:
        raise ValueError("MoeExchange.dispatch(return_recv_hook=True) is not supported under torch.compile")
    counts, offsets, send_row, slot, weight, received = torch.ops.ironlink.moe_dispatch(
        moe.op_handle, x, topk_idx, topk_weights, moe.recv_x, moe.recv_scales, check)
    recv = (moe.recv_x, moe.recv_scales) if moe.fp8 else moe.recv_x
    # send_row stays the operator's tensor (an empty [T, 0] one off the relay path): combine's
    # operator, which this handle reaches under the same trace, takes a tensor.
    return recv, counts, offsets, Handle(x.shape[0], send_row, slot, weight, received)


def combine(moe: Any, y: torch.Tensor, handle: Any, check: bool = False) -> torch.Tensor:
    out: torch.Tensor = torch.ops.ironlink.moe_combine(moe.op_handle, y, handle.send_row, handle.slot, handle.weight,
                                                       handle.received, check)
    return out


__all__ = ["combine", "dispatch"]
