"""The four fused ops as PyTorch custom operators (`torch.ops.ironlink.*`), for torch.compile;
the same scheme as the host-level collectives' (`ironlink.ops.torch_library`: read its docs).

The public functions route here while Dynamo traces them. Each operator writes its outputs in
place and returns nothing; the routing functions allocate what the public ones allocate, except
heap tensors (`matmul_all_reduce`'s `out`, `all_gather_matmul`'s `a_full`): a heap allocation is
collective and cannot be traced, so under torch.compile those must be given. A tile
configuration (`config=`, a `tuning.MatmulConfig`) travels as its list of ints. The operators run
the public functions, which their modules enter in `runtime.eager` when imported (this module
imports none of them: they import it, to route).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..runtime.staging import copy_back, on_heap
from ..runtime.torch_ops import LIB, handle_of, heap_of, refuse_allocation
from ..runtime import eager, tuning
from ..runtime.tuning import op_config


def _config(config: Optional[list[int]]) -> Optional[tuning.MatmulConfig]:
    return None if config is None else tuning.MatmulConfig(*config)


def _rmsnorm(heap: int, x: torch.Tensor, residual: torch.Tensor, residual_out: Optional[torch.Tensor],
             weight: torch.Tensor, out: Optional[torch.Tensor], scale: Optional[torch.Tensor], eps: float,
             rms_mode: Optional[str], check: bool, pdl: Optional[bool], rms_config: str) -> None:
    """Both operators' implementation; `out` None: the normalized rows go to x (out=x)."""
    h = heap_of(heap, x, "all_reduce_rmsnorm")
    staged = on_heap(h, "all_reduce_rmsnorm", (x,))
    sx = staged[0]
    run = eager.function("all_reduce_rmsnorm")
    run(sx, residual, weight, eps, sx if out is None else out, heap=h, mode=rms_mode, check=check,
        residual_out=residual_out, scale=scale, pdl=pdl,
        config=op_config.from_arg(tuning.RmsnormConfig, rms_config))
    copy_back((x,), staged)


# residual updated in place (residual_out=None). The mode is `rms_mode`, the config `rms_config`
# (`runtime.tuning.op_config`'s string): auto_functionalized takes an argument of its own named `mode`.
@torch.library.custom_op(f"{LIB}::all_reduce_rmsnorm", mutates_args=("x", "residual", "out", "scale"))
def all_reduce_rmsnorm_op(heap: int, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          out: Optional[torch.Tensor], scale: Optional[torch.Tensor], eps: float,
                          rms_mode: Optional[str], check: bool, pdl: Optional[bool], rms_config: str) -> None:
    _rmsnorm(heap, x, residual, None, weight, out, scale, eps, rms_mode, check, pdl, rms_config)


# residual + sum written to residual_out, residual only read.
@torch.library.custom_op(f"{LIB}::all_reduce_rmsnorm_out", mutates_args=("x", "residual_out", "out", "scale"))
def all_reduce_rmsnorm_out_op(heap: int, x: torch.Tensor, residual: torch.Tensor, residual_out: torch.Tensor,
                              weight: torch.Tensor, out: Optional[torch.Tensor], scale: Optional[torch.Tensor],
                              eps: float, rms_mode: Optional[str], check: bool, pdl: Optional[bool],
                              rms_config: str) -> None:
    _rmsnorm(heap, x, residual, residual_out, weight, out, scale, eps, rms_mode, check, pdl, rms_config)


@torch.library.custom_op(f"{LIB}::matmul_all_reduce", mutates_args=("out",))
def matmul_all_reduce_op(heap: int, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                         config: Optional[list[int]], method: Optional[str], check: bool, exchange: str) -> None:
    h = heap_of(heap, out, "matmul_all_reduce")
    staged = on_heap(h, "matmul_all_reduce", (out,), read=False)  # out: written, never read
    eager.function("matmul_all_reduce")(a, b, staged[0], heap=h, config=_config(config), method=method, check=check,
                                        exchange=op_config.from_arg(tuning.PushPacing, exchange))
    copy_back((out,), staged)


@torch.library.custom_op(f"{LIB}::all_gather_matmul", mutates_args=("a_full", "out"))
def all_gather_matmul_op(heap: int, a_shard: torch.Tensor, b: torch.Tensor, a_full: torch.Tensor, out: torch.Tensor,
                         config: Optional[list[int]], check: bool, method: Optional[str], exchange: str) -> None:
    h = heap_of(heap, a_full, "all_gather_matmul")
    staged = on_heap(h, "all_gather_matmul", (a_full,), read=False)  # a_full: written, never read
    run = eager.function("all_gather_matmul")
    run(a_shard, b, h, staged[0], out, config=_config(config), check=check, method=method,
        exchange=op_config.from_arg(tuning.GatherExchange, exchange))
    copy_back((a_full,), staged)


@torch.library.custom_op(f"{LIB}::matmul_reduce_scatter", mutates_args=("out",))
def matmul_reduce_scatter_op(heap: int, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                             config: Optional[list[int]], check: bool, method: Optional[str], exchange: str) -> None:
    h = heap_of(heap, a, "matmul_reduce_scatter")
    eager.function("matmul_reduce_scatter")(a, b, h, out, config=_config(config), check=check, method=method,
                                            exchange=op_config.from_arg(tuning.ScatterExchange, exchange))


# Nothing to compute for a fake tensor: each operator only writes its arguments.
for _op in (all_reduce_rmsnorm_op, all_reduce_rmsnorm_out_op, matmul_all_reduce_op, all_gather_matmul_op,
            matmul_reduce_scatter_op):
    _op.register_fake(lambda *args, **kwargs: None)


# --- what the public functions run while Dynamo traces them --------------------------------------


def all_reduce_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                       out: Any = None, heap: Any = None, mode: Optional[str] = None, check: bool = False,
                       residual_out: Any = None, scale: Any = None, pdl: Optional[bool] = None,
                       config: Optional[tuning.RmsnormConfig] = None) -> tuple[Any, ...]:
    into_x = out is x  # one tensor cannot be two mutated arguments: out=None tells the operator
    if out is None:
        out = torch.empty_like(x)
    fp8 = out.dtype == torch.float8_e4m3fn
    if fp8 and scale is None:
        scale = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    out_arg = None if into_x else out
    if residual_out is None:
        torch.ops.ironlink.all_reduce_rmsnorm(handle_of(heap), x, residual, weight, out_arg, scale, eps, mode, check,
                                              pdl, op_config.as_arg(config))
        res = residual
    else:
        torch.ops.ironlink.all_reduce_rmsnorm_out(handle_of(heap), x, residual, residual_out, weight, out_arg, scale,
                                                  eps, mode, check, pdl, op_config.as_arg(config))
        res = residual_out
    return (out, res, scale) if fp8 else (out, res)


def matmul_all_reduce(a: torch.Tensor, b: torch.Tensor, out: Any = None, heap: Any = None,
                      config: Optional[tuning.MatmulConfig] = None, method: Optional[str] = None,
                      check: bool = False, exchange: Optional[tuning.PushPacing] = None) -> torch.Tensor:
    if out is None:
        refuse_allocation("ironlink.matmul_all_reduce", "out")
    cfg = None if config is None else list(config)
    torch.ops.ironlink.matmul_all_reduce(handle_of(heap), a, b, out, cfg, method, check, op_config.as_arg(exchange))
    return out


def all_gather_matmul(a_shard: torch.Tensor, b: torch.Tensor, heap: Any, a_full: Any = None, out: Any = None,
                      config: Optional[tuning.MatmulConfig] = None, check: bool = False,
                      method: Optional[str] = None,
                      exchange: Optional[tuning.GatherExchange] = None) -> tuple[torch.Tensor, torch.Tensor]:
    if a_full is None:
        refuse_allocation("ironlink.all_gather_matmul", "a_full")
    if out is None:
        out = torch.empty((a_full.shape[0], b.shape[-1]), device=a_shard.device, dtype=a_shard.dtype)
    cfg = None if config is None else list(config)
    torch.ops.ironlink.all_gather_matmul(handle_of(heap), a_shard, b, a_full, out, cfg, check, method,
                                         op_config.as_arg(exchange))
    return a_full, out


def matmul_reduce_scatter(a: torch.Tensor, b: torch.Tensor, heap: Any, out: Any = None,
                          config: Optional[tuning.MatmulConfig] = None, check: bool = False,
                          method: Optional[str] = None, exchange: Optional[tuning.ScatterExchange] = None) -> torch.Tensor:
    if heap is None:
        raise ValueError("matmul_reduce_scatter needs heap= (its workspace lives in the symmetric heap)")
    if out is None:
        out = torch.empty((a.shape[0] // heap.world_size, b.shape[-1]), device=a.device, dtype=a.dtype)
    cfg = None if config is None else list(config)
    torch.ops.ironlink.matmul_reduce_scatter(handle_of(heap), a, b, out, cfg, check, method, op_config.as_arg(exchange))
    return out


__all__ = ["all_gather_matmul", "all_reduce_rmsnorm", "matmul_all_reduce", "matmul_reduce_scatter"]
