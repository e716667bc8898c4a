"""All-reduce + residual add + RMSNorm in one kernel: the op after every row-parallel layer of a
tensor-parallel transformer (vLLM's and TensorRT-LLM's fused_add_rms_norm after an all-reduce).

    out, residual = ironlink.all_reduce_rmsnorm(x, residual, weight, eps=1e-6)

with x [T, H] this rank's partial sums (a heap tensor; it is overwritten with the all-reduced
sum), residual [T, H] (updated in place to residual + sum, or written to `residual_out`),
weight [H]:

    residual = round(sum_over_ranks(x) + residual)
    out      = round(residual * rsqrt(mean(residual^2) + eps) * weight)

in fp32, rounded to the tensors' dtype where stored (the norm reads the stored residual, so `out`
equals an unfused rms_norm of it). With an FP8 `out` (torch.float8_e4m3fn, the input of an FP8
GEMM) each token's row y is quantized with its own scale: scale = max|y| / 448 (e4m3's largest
value), out = fp8(y / scale), and the scales go to `scale` [T] (fp32). Results are bitwise
identical on every rank.

Seven modes, each one launch, chosen by bytes from the decode table of the world size
(`ironlink.runtime.tuning.decode_table`; `mode=` overrides): "rows" and "whole" over the device
library's tile and whole-tensor all-reduces; "push", "lamport", "split", "two_shot" and
"push_two_shot" over slots in the heap, one node only. What each mode does is in
`all_reduce_rmsnorm_exchanges` (the one-shot modes' exchanges, and what every mode does),
`all_reduce_rmsnorm_two_shot` (the two-shot modes') and `all_reduce_rmsnorm_kernels` (the
kernel); the norm of a row is `all_reduce_rmsnorm_norm`.
All launch with programmatic dependent launch where the GPU has it (`ironlink.language.pdl`, `pdl=`): the
kernel starts while the previous one finishes and waits for it before touching memory.
On a heap of several nodes "rows" and "whole" run over `symm_all_reduce_hierarchical` and
`symm_tile_all_reduce_hierarchical` (a kernel linked with the NVSHMEM bitcode); "whole" by
default there, as no measurement has chosen between them yet.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import triton

from ..language import _abi
from .operators import torch_operators
from ..runtime import eager, tuning
from ..runtime.tuning.decode_table import RMSNORM_MODES
from ..runtime.distributed import sm_share
from ..runtime.launch import launch_with_status
from ..runtime.pdl import choose_pdl, pdl_launch_options
from ..runtime.registry import heap_for, in_heap
from ..runtime.staging import copy_back, needs_staging, on_heap, staging_name
from ..runtime.tensor_spec import TensorSpec, check_tensor
from ..runtime.workspaces import (EPOCH_COUNTER_BYTES, epoch_counters, epochs_name, lamport_name, lamport_workspace,
                                  slot_half, workspaces_heap_bytes)
from .all_reduce_rmsnorm_exchanges import SPLIT_WORDS
from .all_reduce_rmsnorm_kernels import allreduce_rmsnorm_hierarchical_kernel, allreduce_rmsnorm_kernel
from .diagnostics import NO_DIAGNOSTICS, Diagnostics

MAX_HIDDEN = 16384
MODES = RMSNORM_MODES  # the names the decode tables choose from (runtime/tuning/decode_table.py)
# The modes whose slots and counters are one node's (refused on a heap of several nodes).
ONE_NODE_MODES = ("push", "split", "lamport", "two_shot", "push_two_shot")
# What an error of each mode names as the failing call (`{suffix}`: "_hierarchical" on several nodes).
MODE_CALLS = {"rows": "symm_tile_all_reduce{suffix}", "whole": "symm_all_reduce{suffix}/symm_grid_barrier",
              "push": "symm_tile_signal_others/symm_tile_wait_others",
              "split": "symm_tile_all_reduce/the wait for the row's other slices",
              "lamport": "the wait for the peers' rows (symm_tile_wait)",
              "two_shot": "the wait for the peers' rows (symm_tile_wait)",
              "push_two_shot": "symm_tile_signal_others/symm_tile_wait_others"}


class Plan(NamedTuple):
    tokens: int
    hidden: int
    block_h: int  # next power of two >= hidden
    mode: str
    ctas: int
    warps: int
    fp8: bool  # out is float8_e4m3fn, quantized per token
    rows_at_once: int  # rows, the push modes: rows a CTA normalizes at a time
    workspace_bytes: int  # the slot modes: the rows' slots at this rank (`two_shot_slots` for the two-shot ones)
    parts: int = 1  # split, two_shot: CTAs per row (the slices of a row)
    slice_cols: int = 0  # split: columns of a slice (the last one may have fewer); two-shot modes: a rank's chunk
    lamport: bool = False  # lamport, split, two_shot: the rows exchanged through lamport slots (split: not LL packets)
    preload: bool = True  # rows: the weight and first residual rows loaded before the all-reduce (a probe: False)


def check_outputs(x: TensorSpec, residual_out: Optional[TensorSpec], out: TensorSpec, scale: Optional[TensorSpec],
                  device: str) -> bool:
    """Checks the optional outputs against x; returns whether `out` is FP8 (then `scale` must be
    an fp32 [tokens] tensor)."""
    if residual_out is not None:
        if check_tensor(residual_out, device) != check_tensor(x, device) or residual_out.shape != x.shape:
            raise ValueError(f"residual_out must be like x ({x.dtype}, {x.shape}), got {residual_out.dtype}, "
                             f"{residual_out.shape}")
        if residual_out.data_ptr == x.data_ptr and x.numel:
            raise ValueError("residual_out must not be x (x holds the all-reduced sum)")
    if out.dtype != "float8_e4m3fn":
        return False
    if out.shape != x.shape or not out.contiguous or out.device != device:
        raise ValueError(f"out must be a contiguous {x.shape} tensor on {device}, got {out.shape} on {out.device}")
    if scale is None or scale.dtype != "float32" or scale.shape != (x.shape[0],) or scale.device != device:
        raise ValueError(f"an FP8 out needs scale= an fp32 [{x.shape[0]}] tensor on {device} (per-token scales)")
    return True


def plan(x: TensorSpec, residual: TensorSpec, weight: TensorSpec, out: TensorSpec, device: str, world: int,
         sms: int, mode: Optional[str] = None, multi_node: bool = False, residual_out: Optional[TensorSpec] = None,
         scale: Optional[TensorSpec] = None, config: Optional[tuning.RmsnormConfig] = None) -> Plan:
    """Checks the tensors (pure: testable without a GPU) and chooses the launch, with `config`'s
    choices (None: `tuning.RmsnormConfig()`). A heap of several nodes (`multi_node`) runs "whole"
    unless `mode` asks for "rows" (see the module docs)."""
    config = config or tuning.RmsnormConfig()
    if len(x.shape) != 2:
        raise ValueError(f"x must be 2-D [tokens, hidden], got shape {x.shape}")
    tokens, hidden = x.shape
    code = check_tensor(x, device)
    fp8 = check_outputs(x, residual_out, out, scale, device)
    for t in (residual,) if fp8 else (residual, out):
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
    if mode in ONE_NODE_MODES and multi_node:
        raise ValueError(f"mode {mode!r} runs on one node only (use 'rows' or 'whole')")
    block_h = triton.next_power_of_2(hidden)
    warps = tuning.rmsnorm_warps(block_h)
    if mode == "split":
        parts = tuning.rmsnorm_split_parts(tokens, hidden * x.itemsize, world, sms)
        if parts < 2:
            raise ValueError(f"mode 'split' needs rows of at least {2 * tuning.RMSNORM_SPLIT_MIN_SLICE_BYTES} bytes "
                             f"and at most {sms // 2} tokens here, got {tokens} rows of {hidden * x.itemsize}")
        return split_into(Plan(tokens, hidden, block_h, mode, tokens, warps, fp8, 1, 0), parts, x.itemsize, world,
                          config.split_lamport)
    if mode == "two_shot":  # blocks of a chunk; the warps of a slice ([world, chunk]), which step 3 holds
        if world & (world - 1):
            raise ValueError(f"mode 'two_shot' needs a power-of-two world (its rows are [world, chunk] blocks), "
                             f"got {world}")
        return two_shot_into(Plan(tokens, hidden, block_h, mode, tokens, warps, fp8, 1, 0),
                             tuning.rmsnorm_two_shot_parts(tokens, hidden * x.itemsize, world, sms), x.itemsize, world,
                             sms)
    if mode == "whole":
        ctas, _ = tuning.choose("all_reduce", x.nbytes, world)
        ctas = min(ctas, sms)  # the grid barrier needs every CTA resident
    else:
        ctas = max(1, min(tokens, sms, _abi.MAX_TILES))
    rows = tuning.rmsnorm_rows_at_once(tokens, ctas, mode, world)
    if mode == "push_two_shot":  # a CTA a block of rows, as "push"; two_shot's chunks and layout
        return Plan(tokens, hidden, block_h, mode, ctas, warps, fp8, rows,
                    2 * two_shot_slots(tokens, hidden, world) * x.itemsize, slice_cols=two_shot_chunk(hidden, world))
    workspace = 2 * (world - 1) * x.nbytes if mode in ("push", "lamport") else 0
    return Plan(tokens, hidden, block_h, mode, ctas, warps, fp8, rows, workspace, lamport=mode == "lamport")


def two_shot_chunk(hidden: int, world: int, parts: int = 1) -> int:
    """Columns of each rank's chunk of a slice in mode "two_shot" (a row cut into `parts` slices of
    `world` chunks): hidden / (parts x world) rounded up to a multiple of 16 (every chunk starts
    16-byte aligned, as the row does; the last chunks may be narrower, or empty)."""
    return -(-hidden // (16 * world * parts)) * 16


def two_shot_slots(tokens: int, hidden: int, world: int, parts: int = 1) -> int:
    """Elements of one half of mode "two_shot"'s workspace: for each peer a slot of this rank's
    chunk (`two_shot_chunk`) of every slice of every row, then one of every row whole for the
    gathered sums."""
    return ((world - 1) * parts * two_shot_chunk(hidden, world, parts) + hidden) * tokens


def two_shot_into(p: Plan, parts: int, itemsize: int, world: int, sms: int) -> Plan:
    """Plan `p` in mode "two_shot" with `parts` slices a row (a CTA each; 1: a CTA a row, rows
    strided over at most `sms` CTAs), chunks of `two_shot_chunk` columns, the warps of a slice
    held as [world, chunk]. bench/probes/rmsnorm_timeline.py --two-shot-parts compares slice counts
    with it."""
    chunk = two_shot_chunk(p.hidden, world, parts)
    block = triton.next_power_of_2(chunk)
    return p._replace(mode="two_shot", block_h=block,
                      ctas=p.tokens * parts if parts > 1 else max(1, min(p.tokens, sms, _abi.MAX_CTAS)),
                      warps=tuning.rmsnorm_warps(world * block), rows_at_once=1,
                      workspace_bytes=2 * two_shot_slots(p.tokens, p.hidden, world, parts) * itemsize, parts=parts,
                      slice_cols=chunk, lamport=True)


def split_into(p: Plan, parts: int, itemsize: int, world: int, lamport: bool) -> Plan:
    """Plan `p` in mode "split" with `parts` slices a row (elements of `itemsize` bytes), sized by
    `tuning.rmsnorm_split_slice_bytes`; a CTA each, of `tuning.rmsnorm_split_warps`; the slices
    exchanged through lamport slots (`lamport`, over `world` ranks) or LL packets.
    bench/probes/rmsnorm_timeline.py --split-parts compares slice counts with it."""
    cols = tuning.rmsnorm_split_slice_bytes(p.hidden * itemsize, parts) // itemsize
    block = triton.next_power_of_2(cols)
    return p._replace(mode="split", block_h=block, ctas=p.tokens * parts, warps=tuning.rmsnorm_split_warps(block),
                      rows_at_once=1, workspace_bytes=2 * (world - 1) * p.tokens * p.hidden * itemsize if lamport
                      else 0, parts=parts, slice_cols=cols, lamport=lamport)


@eager.routed(torch_operators)  # the operators of its name run it; a traced call goes to them
def all_reduce_rmsnorm(x: Any, residual: Any, weight: Any, eps: float = 1e-6, out: Any = None,
                       heap: Any = None, mode: Optional[str] = None, check: bool = False,
                       residual_out: Any = None, scale: Any = None, pdl: Optional[bool] = None,
                       config: Optional[tuning.RmsnormConfig] = None) -> tuple[Any, ...]:
    """All-reduce `x` ([tokens, hidden], overwritten with the sum), add it into
    `residual` (in place, or into `residual_out` leaving `residual` as it is) and RMS-normalize
    the result with `weight`; returns (out, residual or residual_out). `out` (default: a new
    tensor like x) may be x itself. An `out` of dtype torch.float8_e4m3fn gets the normalized rows
    quantized per token (module docs; Hopper and later), with the scales in `scale` (fp32
    [tokens]; allocated when None), and the call returns (out, residual, scale). `pdl`: launch
    with programmatic dependent launch (`ironlink.language.pdl`; None: `tuning.DECODE_PDL` where the GPU
    has it, compute capability 9.0+; one-node heaps). `config`: choices beyond the decode table
    and `mode` (`tuning.RmsnormConfig`; None: its defaults). `x` outside the heap (pass `heap=`;
    every rank alike) runs through a heap workspace: copied in, then the sum copied back.
    Collective; CUDA-graph capturable."""
    import torch

    h = heap_for(x, "x", heap, "all_reduce_rmsnorm")
    if needs_staging(h, x):  # peers read and write x at its heap offset: a workspace at one offset everywhere
        (sx,) = on_heap(h, "all_reduce_rmsnorm", (x,))
        done = all_reduce_rmsnorm(sx, residual, weight, eps, sx if out is x else out, h, mode, check, residual_out,
                                  scale, pdl, config)
        copy_back((x,), (sx,))
        return (x, *done[1:]) if out is x else done
    if check:  # every rank's call the same, or IronlinkError before anything launches
        h.compare_call("all_reduce_rmsnorm", x=tuple(x.shape), dtype=str(x.dtype), mode=mode,
                       out=None if out is None else str(out.dtype), residual_out=residual_out is not None)
    if out is None:
        out = torch.empty_like(x)
    fp8_out = out.dtype == getattr(torch, "float8_e4m3fn", None)
    if fp8_out and scale is None:
        scale = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    major = torch.cuda.get_device_capability(h.device)[0]
    if fp8_out and major < 9:
        raise ValueError("all_reduce_rmsnorm: an FP8 out needs a GPU of compute capability 9.0 or later")
    use_pdl = choose_pdl(pdl, major, "all_reduce_rmsnorm", h.multi_node)
    res_out = residual if residual_out is None else residual_out
    spec = TensorSpec.from_tensor
    sms = sm_share(h.device)  # the grid barrier needs every CTA of every rank resident
    p = plan(spec(x, "x"), spec(residual, "residual"), spec(weight, "weight"), spec(out, "out"), str(h.device),
             h.world_size, sms, mode, h.multi_node, spec(res_out, "residual_out") if residual_out is not None else None,
             spec(scale, "scale") if scale is not None else None, config)
    done = (out, res_out, scale) if p.fp8 else (out, res_out)
    if p.tokens == 0:
        return done
    in_heap(h, "all_reduce_rmsnorm", (x, "x"))
    function = MODE_CALLS[p.mode].format(suffix="_hierarchical" if h.multi_node else "")
    scales = scale if p.fp8 else out  # unread without FP8
    launch_with_status(
        "all_reduce_rmsnorm", h, p.ctas,
        lambda status: launch(h, p, x, residual, res_out, weight, out, scales, eps, status, use_pdl), check,
        function=function)
    return done


def launch(heap: Any, p: Plan, x: Any, residual: Any, residual_out: Any, weight: Any, out: Any, scale: Any,
           eps: float, status: Any, pdl: bool, diagnostics: Diagnostics = NO_DIAGNOSTICS) -> None:
    """Launches plan `p` (no checks: `all_reduce_rmsnorm` made them; `scale` is any tensor
    without FP8). bench/probes/rmsnorm_timeline.py calls it directly: `diagnostics.trace` records
    the phases of each CTA (the exchange always runs here); a plan with `preload=False` loads the
    residual and the weight after the all-reduce (rows)."""
    if not diagnostics.communicate:
        raise ValueError("all_reduce_rmsnorm is its exchange: Diagnostics(communicate=False) does not apply")
    trace = diagnostics.trace
    if heap.multi_node:
        allreduce_rmsnorm_hierarchical_kernel[(p.ctas,)](
            heap.ctx, x, residual, residual_out, weight, out, scale, p.tokens, p.hidden, float(eps), status,
            WHOLE=p.mode == "whole", BLOCK_H=p.block_h, FP8=p.fp8, num_warps=p.warps)
        return
    ws, epochs, inbox, half = workspaces(heap, p, x, status)
    allreduce_rmsnorm_kernel[(p.ctas,)](
        heap.ctx, x, residual, residual_out, weight, out, scale, p.tokens, p.hidden, float(eps), status,
        trace if trace is not None else status, ws, epochs, inbox, half, WHOLE=p.mode == "whole", BLOCK_H=p.block_h,
        FP8=p.fp8, PRELOAD=p.preload, TRACE=trace is not None, ROWS=p.rows_at_once, PUSH=p.mode == "push",
        LAMPORT=p.lamport, TWO_SHOT=p.mode == "two_shot", WORLD=heap.world_size, SPLIT=p.mode == "split",
        PARTS=p.parts, W=p.slice_cols, PUSH_TWO_SHOT=p.mode == "push_two_shot",
        BLOCK_C=triton.next_power_of_2(max(16, p.slice_cols)) if p.mode == "push_two_shot" else 16,
        num_warps=p.warps, **pdl_launch_options(pdl))


_NAME = "all_reduce_rmsnorm"  # the op's workspaces are named after it
_WORDS = f"{_NAME}/split"  # the slices' words of "split" and of "two_shot" over slices


def workspace_requests(p: Plan, itemsize: int) -> dict[str, int]:
    """The heap workspaces plan `p` (x of elements of `itemsize` bytes) takes, name -> bytes: what
    `workspaces` asks `heap.workspace` for, and what `heap_bytes` adds up."""
    need: dict[str, int] = {}
    if p.mode in ONE_NODE_MODES:
        need[epochs_name(_NAME)] = EPOCH_COUNTER_BYTES
    if p.mode == "split" or (p.mode == "two_shot" and p.parts > 1):
        need[_WORDS] = 8 * SPLIT_WORDS.value
    elif p.mode in ("push", "push_two_shot"):
        need[_NAME] = p.workspace_bytes
    if p.lamport:
        need[lamport_name(_NAME, itemsize)] = p.workspace_bytes
    return need


def workspaces(heap: Any, p: Plan, x: Any, status: Any) -> tuple[Any, Any, Any, int]:
    """The kernel's `ws`, `epochs`, `inbox` and `half` for plan `p`, kept in the heap between calls
    (`heap.workspace`, of the sizes `workspace_requests` gives; x or `status` where the mode reads
    none): `ws` the push modes' slots (x's dtype) or the slices' words of "split" and of "two_shot"
    over slices (int64 [SPLIT_WORDS], zeroed when made); `epochs` the per-CTA launch counters of the
    one-node modes (int32 [MAX_CTAS], zeroed when made: equal on every rank); `inbox` the lamport
    slots (x's dtype, every element -0.0 when made: "empty"); `half` the elements of one half of
    the mode's slots (the push modes' `ws`, the lamport modes' `inbox`; 0 where it has none,
    `slot_half`)."""
    import torch

    need = workspace_requests(p, x.element_size())
    ws, epochs, inbox = x, status, x
    if epochs_name(_NAME) in need:
        epochs = epoch_counters(heap, _NAME)
    if _WORDS in need:
        ws = heap.workspace(_WORDS, need[_WORDS], zeroed_prefix=need[_WORDS]).view(torch.int64)
    elif _NAME in need:
        ws = heap.workspace(_NAME, need[_NAME]).view(x.dtype)
    if p.lamport:
        inbox = lamport_workspace(heap, _NAME, p.workspace_bytes, x.dtype)
    half = slot_half(inbox) if p.lamport else slot_half(ws) if _NAME in need else 0
    return ws, epochs, inbox, half


def heap_bytes(tokens: int, hidden: int, world: int, dtype: str = "bfloat16", fp8: bool = False,
               sms: int = 132, outside_heap: bool = False, mode: Optional[str] = None) -> int:
    """The symmetric-heap bytes all_reduce_rmsnorm's workspaces may take for calls of up to
    `tokens` rows of `hidden` elements of `dtype` ("bfloat16", "float16", "float32") over `world`
    ranks of one node with `sms` SMs, in any order (`fp8`: with an FP8 out), beside x itself
    (`outside_heap`: x is not the heap's, and its staging workspace counts too), in the mode the
    decode table chooses for each shape, or in `mode` where the calls pass one (the shapes it
    cannot run take nothing: those calls raise): size the heap with it (`SymmetricHeap(x bytes +
    this + the rest)`). Pure: no GPU needed."""
    itemsize = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    weight = TensorSpec("weight", (hidden,), dtype, itemsize, True, "cuda:0", 2 << 40)

    def plan_of(t: int) -> Plan:
        x = TensorSpec("x", (t, hidden), dtype, itemsize, True, "cuda:0", 1 << 20)
        out = x._replace(name="out", dtype="float8_e4m3fn", itemsize=1, data_ptr=3 << 40) if fp8 else \
            x._replace(name="out", data_ptr=3 << 40)
        scale = TensorSpec("scale", (t,), "float32", 4, True, "cuda:0", 4 << 40) if fp8 else None
        return plan(x, x._replace(name="residual", data_ptr=1 << 40), weight, out, "cuda:0", world, sms, mode,
                    scale=scale)

    shapes = [t for t in range(1, tokens + 1)
              if mode is None or tuning.rmsnorm_mode_runs(mode, t, hidden * itemsize, world, sms)]
    staged = {staging_name("all_reduce_rmsnorm", 0): tokens * hidden * itemsize} if outside_heap and tokens else {}
    return workspaces_heap_bytes([*(workspace_requests(plan_of(t), itemsize) for t in shapes), staged])


all_reduce_rmsnorm.heap_bytes = heap_bytes  # type: ignore[attr-defined]  # the op says what it needs


__all__ = ["MAX_HIDDEN", "MODES", "ONE_NODE_MODES", "all_reduce_rmsnorm", "heap_bytes", "launch", "plan", "split_into",
           "two_shot_chunk", "two_shot_into", "two_shot_slots", "workspace_requests"]
