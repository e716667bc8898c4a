"""All-reduce + residual add + RMSNorm in one kernel: the op after every row-parallel layer of a
tensor-parallel transformer (vLLM's and TensorRT-LLM's fused_add_rms_norm after an all-reduce).

    out, residual = ironlink.all_reduce_rmsnorm(x, residual, weight, eps=1e-6)

with x [T, H] this rank's partial sums (a heap tensor; it is overwritten with the all-reduced
sum), residual [T, H] (updated in place to residual + sum), weight [H]:

    residual = round(sum_over_ranks(x) + residual)
    out      = round(residual * rsqrt(mean(residual^2) + eps) * weight)

in fp32, rounded to the tensors' dtype where stored (the norm reads the stored residual, so `out`
equals an unfused rms_norm of it). Results are bitwise identical on every rank.

Two ways to run it, both one launch (`mode`, chosen by `ironlink.tuning.rmsnorm_mode`):
- "rows": each CTA owns a block of rows, all-reduces it with `symm_tile_all_reduce` (tile index
  = CTA index) and normalizes it at once; nothing waits for other CTAs. Where a CTA's block is
  small (one row of up to 16 KiB at world 2, `tuning.tile_all_reduce_takes_ll`) the tile
  all-reduce runs one-shot over LL packets, with no barrier: the mode chosen for the few tokens
  of decode, one row per CTA.
- "whole": the whole tensor is all-reduced by every CTA with `symm_all_reduce` (its LL one-shot
  for small sizes), `symm_grid_barrier` makes every row visible to every CTA, then each CTA
  normalizes rows. For many tokens, and for rows too large for the LL tile all-reduce.
On a heap of several nodes the same two over `symm_all_reduce_hierarchical` and
`symm_tile_all_reduce_hierarchical` (a kernel linked with the NVSHMEM bitcode); "whole" by
default there, as no measurement has chosen between them yet.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import triton
import triton.language as tl

from .. import _abi
from .. import language as il
from .. import tuning
from .. import typed as ilt
from ..distributed import sm_share
from ..jit import jit
from ..ops import TensorSpec, check_tensor, heap_for, in_heap, launch_with_status

MAX_HIDDEN = 16384
MODES = ("rows", "whole")


class Plan(NamedTuple):
    tokens: int
    hidden: int
    block_h: int  # next power of two >= hidden
    mode: str
    ctas: int
    warps: int


def plan(x: TensorSpec, residual: TensorSpec, weight: TensorSpec, out: TensorSpec, device: str, world: int,
         sms: int, mode: Optional[str] = None, multi_node: bool = False) -> Plan:
    """Checks the tensors (pure: testable without a GPU) and chooses the launch. A heap of several
    nodes (`multi_node`) runs "whole" unless `mode` asks for "rows" (see the module docs)."""
    if len(x.shape) != 2:
        raise ValueError(f"x must be 2-D [tokens, hidden], got shape {x.shape}")
    tokens, hidden = x.shape
    code = check_tensor(x, device)
    for t in (residual, out):
        if check_tensor(t, device) != code:
            raise TypeError(f"{t.name} is {t.dtype} but x is {x.dtype}; they must match")
        if t.shape != x.shape:
            raise ValueError(f"{t.name} has shape {t.shape}, x has {x.shape}; they must match")
    check_tensor(weight, device)
    if weight.shape != (hidden,):
        raise ValueError(f"weight must have shape ({hidden},), got {weight.shape}")
    if not 0 < hidden <= MAX_HIDDEN:
        raise ValueError(f"hidden size must be in [1, {MAX_HIDDEN}], got {hidden}")
    if residual.data_ptr == x.data_ptr and tokens:
        raise ValueError("residual must not be x (x holds the all-reduced sum, residual the sum plus residual)")
    mode = mode or ("whole" if multi_node else tuning.rmsnorm_mode(tokens, hidden * x.itemsize, world, sms))
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    block_h = triton.next_power_of_2(hidden)
    warps = max(4, min(16, block_h // 512))
    if mode == "rows":
        ctas = max(1, min(tokens, sms, _abi.MAX_TILES))
    else:
        ctas, _ = tuning.choose("all_reduce", x.nbytes, world)
        ctas = min(ctas, sms)  # the grid barrier needs every CTA resident
    return Plan(tokens, hidden, block_h, mode, ctas, warps)


@triton.jit
def _norm_row(x, residual, weight, out, row, H, eps, BLOCK_H: tl.constexpr):
    cols = tl.arange(0, BLOCK_H)
    m = cols < H
    at = row.to(tl.int64) * H + cols
    v = tl.load(x + at, mask=m, other=0.0).to(tl.float32) + tl.load(residual + at, mask=m, other=0.0).to(tl.float32)
    r = v.to(residual.dtype.element_ty)
    tl.store(residual + at, r, mask=m)
    rf = r.to(tl.float32)
    inv = tl.rsqrt(tl.sum(rf * rf, axis=0) / H + eps)
    w = tl.load(weight + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out + at, (rf * inv * w).to(out.dtype.element_ty), mask=m)


@triton.jit
def _norm_after_grid_barrier(s, ctx, x, residual, weight, out, T, H, eps, BLOCK_H: tl.constexpr):
    """"whole" after its all-reduce (status `s`): every CTA's part of the sum visible to every CTA,
    then rows normalized grid-stride. Returns the first bad status."""
    b = il.symm_grid_barrier(ctx)
    s = ilt.failure_or(s, b)
    for row in range(tl.program_id(0), T, tl.num_programs(0)):
        _norm_row(x, residual, weight, out, row, H, eps, BLOCK_H)
    return s


@jit(do_not_specialize=["ctx", "T", "eps"])
def allreduce_rmsnorm_kernel(ctx, x, residual, weight, out, T, H, eps, status,
                             WHOLE: tl.constexpr, BLOCK_H: tl.constexpr):
    """The fused op on a [T, H] heap tensor `x` (see the module docs); each CTA writes its status."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    if WHOLE:
        s = _norm_after_grid_barrier(ilt.all_reduce(ctx, x, T * H), ctx, x, residual, weight, out, T, H, eps, BLOCK_H)
    else:
        per = tl.cdiv(T, grid)
        r0 = pid * per
        r1 = tl.minimum(T, r0 + per)
        rows = tl.maximum(r1 - r0, 0)
        s = ilt.tile_all_reduce(ctx, x + r0.to(tl.int64) * H, rows, H, H, pid)
        for row in range(r0, r1):
            _norm_row(x, residual, weight, out, row, H, eps, BLOCK_H)
    tl.store(status + pid, s)


# A heap of several nodes: the same over the hierarchical all-reduces, linked with the NVSHMEM bitcode.
@jit(do_not_specialize=["ctx", "T", "eps"], nvshmem=True)
def allreduce_rmsnorm_hierarchical_kernel(ctx, x, residual, weight, out, T, H, eps, status,
                                          WHOLE: tl.constexpr, BLOCK_H: tl.constexpr):
    pid, grid = tl.program_id(0), tl.num_programs(0)
    if WHOLE:
        s = ilt.all_reduce_hierarchical(ctx, x, T * H)
        s = _norm_after_grid_barrier(s, ctx, x, residual, weight, out, T, H, eps, BLOCK_H)
    else:
        per = tl.cdiv(T, grid)
        r0 = pid * per
        r1 = tl.minimum(T, r0 + per)
        s = ilt.tile_all_reduce_hierarchical(ctx, x + r0.to(tl.int64) * H, tl.maximum(r1 - r0, 0), H, H, pid)
        for row in range(r0, r1):
            _norm_row(x, residual, weight, out, row, H, eps, BLOCK_H)
    tl.store(status + pid, s)


def all_reduce_rmsnorm(x: Any, residual: Any, weight: Any, eps: float = 1e-6, out: Any = None,
                       heap: Any = None, mode: Optional[str] = None, check: bool = False) -> tuple[Any, Any]:
    """All-reduce `x` (a [tokens, hidden] heap tensor, overwritten with the sum), add it into
    `residual` (in place) and RMS-normalize the result with `weight`; returns (out, residual).
    `out` (default: a new tensor like x) may be x itself. Collective; CUDA-graph capturable."""
    import torch

    h = heap_for(x, "x", heap, "all_reduce_rmsnorm")
    if out is None:
        out = torch.empty_like(x)
    spec = TensorSpec.from_tensor
    sms = sm_share(h.device)  # the grid barrier needs every CTA of every rank resident
    p = plan(spec(x, "x"), spec(residual, "residual"), spec(weight, "weight"), spec(out, "out"), str(h.device),
             h.world_size, sms, mode, h.multi_node)
    if p.tokens == 0:
        return out, residual
    in_heap(h, "all_reduce_rmsnorm", (x, "x"))
    kernel = allreduce_rmsnorm_hierarchical_kernel if h.multi_node else allreduce_rmsnorm_kernel
    suffix = "_hierarchical" if h.multi_node else ""
    function = f"symm_tile_all_reduce{suffix}" if p.mode == "rows" else f"symm_all_reduce{suffix}/symm_grid_barrier"
    launch_with_status(
        "all_reduce_rmsnorm", h, p.ctas,
        lambda status: kernel[(p.ctas,)](h.ctx, x, residual, weight, out, p.tokens, p.hidden, float(eps), status,
                                         WHOLE=p.mode == "whole", BLOCK_H=p.block_h, num_warps=p.warps),
        check, function=function)
    return out, residual


__all__ = ["MAX_HIDDEN", "MODES", "all_reduce_rmsnorm", "allreduce_rmsnorm_hierarchical_kernel",
           "allreduce_rmsnorm_kernel", "plan"]
