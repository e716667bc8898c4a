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

Six ways to run it, each one launch (`mode`, chosen by `ironlink.tuning.rmsnorm_mode`):
- "rows": each CTA owns a block of rows, all-reduces it with `symm_tile_all_reduce` (tile index
  = CTA index) and normalizes it at once; nothing waits for other CTAs. Where a CTA's block is
  small (one row of up to 16 KiB at world 2, `tuning.tile_all_reduce_takes_ll`) the tile
  all-reduce runs one-shot over LL packets, with no barrier: the mode chosen for the few tokens
  of decode, one row per CTA.
- "whole": the whole tensor is all-reduced by every CTA with `symm_all_reduce` (its LL one-shot
  for small sizes), `symm_grid_barrier` makes every row visible to every CTA, then each CTA
  normalizes rows. For many tokens, and for rows too large for the LL tile all-reduce.
- "push": each CTA owns a block of rows, as in "rows", but exchanges them by plain stores into
  its slots at every peer (a workspace in the heap, alternate halves in alternate launches as
  matmul_all_reduce's push method), in chunks of `rows_at_once` rows, pipelined: it stores
  chunk c, waits for the peers' chunk c - 1 (`symm_tile_wait_others`, tile = CTA index), sums it
  over the ranks in rank order in fp32 and normalizes it, then signals chunk c
  (`symm_tile_signal_others`, one counted signal a chunk). The bytes cross NVLink once, where LL
  packets carry each 8 data bytes in 16, and the sums overlap the link. One node only.
- "split": each row is cut into `parts` column slices, one CTA each (grid tokens x parts): a CTA
  all-reduces its slice over LL packets (`symm_tile_all_reduce`, tile = CTA index), adds the
  residual, and publishes its slice's sum of squares (and, with an FP8 out, its largest
  |residual x weight|) as an 8-byte word tagged with the launch count; it reads its row's other
  slices' words (this rank's memory, no barrier) and normalizes its slice. For the few tokens of
  decode: a CTA alone moves a 16 KiB row's packets in about 4.3 us, a slice of 2 KiB in about 2
  (2 H100s, bench/probes/rmsnorm_timeline.py at hidden 8192 and 1024). Bitwise identical on every rank
  (every CTA of a row reduces its slices' sums the same way); not bitwise the same as "rows",
  whose row sum runs in another order. One node only; its words and launch counters are a
  workspace made at the first call (before a CUDA graph capture, as for "push").
- "lamport": as "push" (each CTA's rows stored into its slots at every peer, the same
  workspace layout), but the data is its own flag: the slots hold -0.0 ("empty") until a peer's
  rows land, senders store -0.0 as +0.0, and the receiver polls the rows themselves until no
  element is empty (`language._flags.wait_written`, bounded by the context's timeout), sums
  them, and stores empty back (the workspace, filled with -0.0 when made, is all empty between
  calls). No signal and no fence: the round trip of push's signal is gone, and the bytes still
  cross NVLink once. TensorRT-LLM's and FlashInfer's one-shot all-reduce use this scheme. One
  node only; workspace made at the first call (before a CUDA graph capture).
- "two_shot": the rows are owned by the ranks in blocks (rank j the j-th of `world` blocks of
  ceil(T / world) rows); each CTA takes rows pid, pid + grid, ... and sends those another rank owns
  to its owner's lamport slots (a reduce-scatter), sums the rows this rank owns as the peers' land
  (fixed order, fp32, rounded to x's dtype), sends each sum to every peer (an all-gather into one
  lamport slot a row: a row has one sender), and normalizes every row from its sum: the rows it
  summed at once, the others as they land. A rank sends 2 (world - 1) / world of x where "lamport"
  sends (world - 1) copies: at world 4 half the bytes, for a second hop's latency. Every rank
  normalizes the same bits of the sum with the same code, so results are bitwise identical. Each
  CTA waits only for the same CTA index of its peers (no residency needed). One node only; its
  workspace (two halves, alternate launches, each (world - 1) owned blocks and T rows) made at the
  first call (before a CUDA graph capture).
All launch with programmatic dependent launch where the GPU has it (`ironlink.language.pdl`, `pdl=`): the
kernel starts while the previous one finishes and waits for it before touching memory.
On a heap of several nodes "rows" and "whole" run over `symm_all_reduce_hierarchical` and
`symm_tile_all_reduce_hierarchical` (a kernel linked with the NVSHMEM bitcode); "whole" by
default there, as no measurement has chosen between them yet.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import triton
import triton.language as tl

from ..language import _abi
from ..language._flags import tagged, unempty, wait_tagged
from .. import language as il
from ..runtime import eager, tuning
from ..runtime.decode_table import RMSNORM_MODES
from ..language import typed as ilt
from ..runtime.distributed import sm_share
from ..language.jit import jit
from ..language.pdl import allow_next_kernel, wait_for_previous_kernel
from ..runtime.pdl import choose_pdl, pdl_launch_options
from ..runtime.launch import launch_with_status
from ..runtime.tensor_spec import TensorSpec, check_tensor
from ..runtime.workspaces import epoch_counters, lamport_workspace
from ..runtime.registry import heap_for, in_heap
from ..runtime.handles import compiling
from ..language.slots import (PEERS, add_in_rank_order, advance_epochs, at_peer, lamport_receive, lamport_reduce,
                              lamport_reduce_values, lamport_send, lamport_store, launch_slots, peer_distances, slot_of,
                              store_to_peer_slots)
from .trace import stamp

MAX_HIDDEN = 16384
MODES = RMSNORM_MODES  # the names the decode tables choose from (runtime/decode_table.py)
# The modes whose slots and counters are one node's (refused on a heap of several nodes).
ONE_NODE_MODES = ("push", "split", "lamport", "two_shot")
# What an error of each mode names as the failing call (`{suffix}`: "_hierarchical" on several nodes).
MODE_CALLS = {"rows": "symm_tile_all_reduce{suffix}", "whole": "symm_all_reduce{suffix}/symm_grid_barrier",
              "push": "symm_tile_signal_others/symm_tile_wait_others",
              "split": "symm_tile_all_reduce/the wait for the row's other slices",
              "lamport": "the wait for the peers' rows (symm_tile_wait)",
              "two_shot": "the wait for the peers' rows (symm_tile_wait)"}
# "split": a slice's partial sums (two int64 words per CTA: sum of squares, FP8 peak), the high
# half the launch count + 1 (never 0, which the zeroed words hold), the low half the f32's bits.
SPLIT_WORDS = tl.constexpr(2 * _abi.MAX_CTAS)
# Where a split CTA's timed-out wait for its row's slices is recorded: the detail names
# symm_tile_all_reduce, the call the mode is built on.
_TILE_ALL_REDUCE = tl.constexpr(list(_abi.FUNCTIONS).index("symm_tile_all_reduce"))
FP8_MAX = tl.constexpr(448.0)  # the largest finite float8_e4m3fn (kernels read it)


class Plan(NamedTuple):
    tokens: int
    hidden: int
    block_h: int  # next power of two >= hidden
    mode: str
    ctas: int
    warps: int
    fp8: bool  # out is float8_e4m3fn, quantized per token
    rows_at_once: int  # rows, push: rows a CTA normalizes at a time
    workspace_bytes: int  # push, lamport, two_shot: the rows' slots at this rank (`two_shot_slots` for two_shot)
    parts: int = 1  # split: CTAs per row (the slices of a row)
    slice_cols: int = 0  # split: columns of a slice (the last one may have fewer)
    lamport: bool = False  # lamport, split, two_shot: the rows exchanged through lamport slots (split: not LL packets)


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
         scale: Optional[TensorSpec] = None) -> Plan:
    """Checks the tensors (pure: testable without a GPU) and chooses the launch. A heap of several
    nodes (`multi_node`) runs "whole" unless `mode` asks for "rows" (see the module docs)."""
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
                          tuning.RMSNORM_SPLIT_LAMPORT)
    if mode == "two_shot":
        return Plan(tokens, hidden, block_h, mode, max(1, min(tokens, sms, _abi.MAX_CTAS)), warps, fp8, 1,
                    2 * two_shot_slots(tokens, hidden, world) * x.itemsize, lamport=True)
    if mode == "whole":
        ctas, _ = tuning.choose("all_reduce", x.nbytes, world)
        ctas = min(ctas, sms)  # the grid barrier needs every CTA resident
    else:
        ctas = max(1, min(tokens, sms, _abi.MAX_TILES))
    slots = mode in ("push", "lamport")
    workspace = 2 * (world - 1) * x.nbytes if slots else 0
    # "lamport" one row at a time: its wait loop keeps a second row live and spills (440 bytes on
    # sm_90 at two rows of hidden 8192).
    rows = 1 if mode == "lamport" else tuning.rmsnorm_rows_at_once(tokens, ctas, world if slots else 0)
    return Plan(tokens, hidden, block_h, mode, ctas, warps, fp8, rows, workspace, lamport=mode == "lamport")


def two_shot_slots(tokens: int, hidden: int, world: int) -> int:
    """Elements of one half of mode "two_shot"'s workspace: a slot of the rows this rank owns
    (ceil(tokens / world)) for each peer, then one of every row for the gathered sums."""
    return ((world - 1) * -(-tokens // world) + tokens) * hidden


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


@triton.jit
def _norm_row(x, residual, residual_out, weight, out, scale, row, H, eps, BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """Row `row`: residual_out = x + residual (rounded), out = its RMS norm times weight; with FP8
    quantized by the row's own scale, stored into scale[row]."""
    rows = row.to(tl.int64) + tl.arange(0, 1)
    cols = tl.arange(0, BLOCK_H)
    m = cols < H
    res = tl.load(residual + rows[:, None] * H + cols[None, :], mask=m[None, :], other=0.0)
    _norm_values(x, res, tl.load(weight + cols, mask=m, other=0.0), residual_out, out, scale, rows, rows == rows, H,
                 eps, BLOCK_H, FP8)


@triton.jit
def _norm_values(x, res, w, residual_out, out, scale, rows, valid, H, eps, BLOCK_H: tl.constexpr,
                 FP8: tl.constexpr):
    """`_norm_row` for the rows `rows` ([R] int64, those where `valid`) at once, their residual
    rows `res` ([R, BLOCK_H]) and the weight `w` already loaded: R rows' loads in flight and their
    reductions side by side, where one row at a time waits for each in turn."""
    cols = tl.arange(0, BLOCK_H)
    m = valid[:, None] & (cols < H)[None, :]
    _norm_sums(tl.load(x + rows[:, None] * H + cols[None, :], mask=m, other=0.0), res, w, residual_out, out, scale,
               rows, valid, H, eps, BLOCK_H, FP8)


@triton.jit
def _norm_sums(sums, res, w, residual_out, out, scale, rows, valid, H, eps, BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """`_norm_values` with the rows' all-reduced sums `sums` ([R, BLOCK_H], x's dtype) in
    registers: a CTA that has just stored them into x must not load them back (another thread of
    the CTA may have stored an element, and nothing orders a thread's load after another's store:
    push's FP8-out cases read stale sums that way on 2 H100s)."""
    cols = tl.arange(0, BLOCK_H)
    m = valid[:, None] & (cols < H)[None, :]
    at = rows[:, None] * H + cols[None, :]
    v = sums.to(tl.float32) + res.to(tl.float32)
    r = v.to(residual_out.dtype.element_ty)
    tl.store(residual_out + at, r, mask=m)
    rf = r.to(tl.float32)
    wf = w.to(tl.float32)[None, :]
    if FP8:
        # max |y| = inv * max |r * w| (inv > 0), as split mode takes it: both row reductions in one
        # pass over the CTA, not the peak's after the norm's.
        sumsq, peak = tl.reduce((rf * rf, tl.abs(rf * wf)), 1, _sum_and_max)
        inv = tl.rsqrt(sumsq / H + eps)
        s = tl.maximum(peak * inv, 1e-12) / FP8_MAX
        tl.store(scale + rows, s, mask=valid)
        y = rf * inv[:, None] * wf / s[:, None]
    else:
        inv = tl.rsqrt(tl.sum(rf * rf, axis=1) / H + eps)
        y = rf * inv[:, None] * wf
    if FP8:
        # 8 FP8 bytes a thread, the bf16 stores' layout: stored 16 a thread (16 bytes, what Triton
        # picks for a byte type), the row took that layout and the bf16 stores of x and
        # residual_out went back to 8 a thread through shared memory, two bar.sync each.
        at = tl.max_contiguous(at, [1, 8])
    tl.store(out + at, y.to(out.dtype.element_ty), mask=m)


@triton.jit
def _sum_and_max(sum_a, max_a, sum_b, max_b):
    """The combine of a (sum, max) pair reduction."""
    return sum_a + sum_b, tl.maximum(max_a, max_b)


@triton.jit
def _norm_after_grid_barrier(s, ctx, x, residual, residual_out, weight, out, scale, T, H, eps,
                             BLOCK_H: tl.constexpr, FP8: tl.constexpr):
    """"whole" after its all-reduce (status `s`): every CTA's part of the sum visible to every CTA,
    then rows normalized grid-stride. Returns the first bad status."""
    b = il.symm_grid_barrier(ctx)
    s = ilt.failure_or(s, b)
    for row in range(tl.program_id(0), T, tl.num_programs(0)):
        _norm_row(x, residual, residual_out, weight, out, scale, row, H, eps, BLOCK_H, FP8)
    return s


@triton.jit
def _rows_prologue(slots_ws, epochs, weight, residual, r0, r1, T, H, BLOCK_H: tl.constexpr, ROWS: tl.constexpr,
                   WORLD: tl.constexpr):
    """What "push" and "lamport" set up for a CTA's rows r0..r1 over the slots of `slots_ws`:
    (this launch's count, this launch's slots, columns, their mask, the weight, elements a slot,
    chunks of ROWS rows, the first row's residual). With one row at a time (decode: a row a
    CTA) that residual is loaded before any store, as rows mode does ("PRELOAD"), so its latency
    hides behind the exchange; two rows kept live through the loop spill on sm_90 (with more rows
    at a time it is not loaded)."""
    epoch, _, slots = launch_slots(slots_ws, epochs, T, H, WORLD)
    cols = tl.arange(0, BLOCK_H)
    m = cols < H
    w = tl.load(weight + cols, mask=m, other=0.0)
    first = tl.load(residual + r0.to(tl.int64) * H + cols[None, :], mask=(r0 < r1) & m[None, :] & (ROWS == 1),
                    other=0.0)
    return epoch, slots, cols, m, w, tl.cast(T, tl.int64) * H, tl.cdiv(tl.maximum(r1 - r0, 0), ROWS), first


@triton.jit
def _chunk(r0, r1, c, H, cols, m, ROWS: tl.constexpr):
    """Chunk c of a CTA's rows r0..r1, ROWS rows: (the rows, which of them are real, the mask of
    their elements, the elements' offsets)."""
    block = r0 + c * ROWS + tl.arange(0, ROWS).to(tl.int64)
    valid = block < r1
    return block, valid, valid[:, None] & m[None, :], block[:, None] * H + cols[None, :]


@triton.jit
def _chunk_residual(residual, first, at, mk, is_first, ROWS: tl.constexpr):
    """A chunk's residual rows: the preloaded `first` for the first of one row at a time."""
    if ROWS == 1:
        if is_first:
            res = first
        else:
            res = tl.load(residual + at, mask=mk, other=0.0)
    else:
        res = tl.load(residual + at, mask=mk, other=0.0)
    return res


@triton.jit
def _push_pipelined(ctx, x, residual, residual_out, weight, out, scale, ws, epochs, r0, r1, T, H, eps, rank,
                    BLOCK_H: tl.constexpr, ROWS: tl.constexpr, WORLD: tl.constexpr, FP8: tl.constexpr):
    """"push": this CTA's rows r0..r1 in chunks of ROWS rows, pipelined: chunk c is stored into
    this rank's slot at every peer, then chunk c - 1 is waited for, summed over the ranks in rank
    order (fp32, rounded to x's dtype, into x) and normalized, then chunk c is signalled (tile =
    CTA index, one counted signal a chunk). The sums run while the link carries the chunk just
    stored, and the signal's fence finds its stores drained. Pushing every row before the first
    sum left NVLink idle during the sums and HBM nearly idle during the pushes; signalling each
    chunk before the sums kept every CTA in step (all fencing, then all summing). Returns the
    status: after a failed signal or wait the CTA stops (its rows not yet summed keep this rank's
    x)."""
    pid = tl.program_id(0)
    epoch, slots, cols, m, w, slot, chunks, first = _rows_prologue(ws, epochs, weight, residual, r0, r1, T, H, BLOCK_H,
                                                                   ROWS, WORLD)
    s = tl.zeros((), dtype=tl.int32)
    for c in range(0, chunks + 1):
        if (c < chunks) & (s == 0):
            _, _, mk, at = _chunk(r0, r1, c, H, cols, m, ROWS)
            store_to_peer_slots(ctx, slots, slot, at, tl.load(x + at, mask=mk), mk, rank, WORLD)
        if (c > 0) & (s == 0):
            block, valid, mk, at = _chunk(r0, r1, c - 1, H, cols, m, ROWS)
            s = il.symm_tile_wait_others(ctx, pid)
            if s == 0:
                res = _chunk_residual(residual, first, at, mk, c == 1, ROWS)  # in flight with the slots' loads
                total = add_in_rank_order(tl.zeros((ROWS, BLOCK_H), dtype=tl.float32), x, slots, slot, at, mk, rank,
                                          WORLD).to(x.dtype.element_ty)
                tl.store(x + at, total, mask=mk)
                _norm_sums(total, res, w, residual_out, out, scale, block, valid, H, eps, BLOCK_H, FP8)
        if (c < chunks) & (s == 0):  # chunk c's stores drained during chunk c - 1's sums
            s = il.symm_tile_signal_others(ctx, pid)
    advance_epochs(epochs, epoch + 1)
    return s


@triton.jit
def _lamport_rows(ctx, x, residual, residual_out, weight, out, scale, inbox, epochs, r0, r1, T, H, eps, rank, dists,
                  BLOCK_H: tl.constexpr, ROWS: tl.constexpr, WORLD: tl.constexpr, FP8: tl.constexpr):
    """"lamport": this CTA's rows r0..r1 are stored into this rank's slot at every peer (as push
    lays them out, in `inbox`), every chunk of ROWS rows at once, then chunk by chunk the peers'
    rows are polled in this rank's slots until no element is empty (`wait_written`), summed over
    the ranks in rank order (fp32, into x), the slots set back to empty, and the rows normalized.
    No signal and no fence: the rows are read as they land. Between calls every slot of the
    workspace is empty (its creator fills it; each call empties what it read), so the layout may
    change with T. Returns the status: after a failed wait the CTA stops (its rows not yet summed
    keep this rank's x, and the slots are no longer all empty: heap.check() raises)."""
    epoch, slots, cols, m, w, slot, chunks, first = _rows_prologue(inbox, epochs, weight, residual, r0, r1, T, H,
                                                                   BLOCK_H, ROWS, WORLD)
    for c in range(0, chunks):
        _, _, mk, at = _chunk(r0, r1, c, H, cols, m, ROWS)
        lamport_send(x, slots, slot, at, mk, rank, dists, WORLD)
    s = tl.zeros((), dtype=tl.int32)
    for c in range(0, chunks):
        if s == 0:
            block, valid, mk, at = _chunk(r0, r1, c, H, cols, m, ROWS)
            res = _chunk_residual(residual, first, at, mk, c == 0, ROWS)
            total, s = lamport_reduce(ctx, x, slots, slot, at, mk, rank, WORLD)
            if s == 0:
                summed = total.to(x.dtype.element_ty)
                tl.store(x + at, summed, mask=mk)
                _norm_sums(summed, res, w, residual_out, out, scale, block, valid, H, eps, BLOCK_H, FP8)
    advance_epochs(epochs, epoch + 1)
    return s


@triton.jit
def _split_sums(ctx, words, flag, sumsq, peak, PARTS: tl.constexpr, FP8: tl.constexpr):
    """"split": publishes this CTA's slice sums (`sumsq`, and `peak` with FP8) tagged with `flag`,
    waits until its row's PARTS slices have published theirs (a bounded wait: the context's
    timeout, then TIMEOUT recorded in the context) and returns (the row's sum of squares, its
    peak, status), reduced over the slices the same way on every rank and in every slice's CTA."""
    pid = tl.program_id(0)
    tl.store(words + pid, tagged(flag, sumsq))
    if FP8:
        tl.store(words + SPLIT_WORDS // 2 + pid, tagged(flag, peak))
    at = (pid // PARTS) * PARTS + tl.arange(0, PARTS)
    if FP8:
        at = tl.join(at, at + SPLIT_WORDS // 2)
    got, s = wait_tagged(ctx, words + at, flag, _TILE_ALL_REDUCE)
    values = (got & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    if FP8:
        sq, pk = tl.split(values)
        return tl.sum(sq), tl.max(pk), s
    return tl.sum(values), 0.0, s


@triton.jit
def _split_row(ctx, x, residual, residual_out, weight, out, scale, T, H, eps, words, epochs, inbox, W, trace, rank,
               dists, BLOCK: tl.constexpr, PARTS: tl.constexpr, FP8: tl.constexpr, TRACE: tl.constexpr,
               LAMPORT: tl.constexpr, WORLD: tl.constexpr):
    """"split": CTA pid all-reduces and normalizes slice pid % PARTS (W columns) of row pid // PARTS:
    over LL packets (`symm_tile_all_reduce`), or with LAMPORT through the slots of `inbox` as mode
    "lamport" exchanges rows. Returns the status. TRACE: stamps 2 after the slice's all-reduce,
    4 after the row's sums."""
    pid = tl.program_id(0)
    row = (pid // PARTS).to(tl.int64)
    c0 = (pid % PARTS) * W
    width = tl.minimum(W, H - c0)
    cols = c0 + tl.arange(0, BLOCK)
    m = cols < c0 + width
    at = row * H + cols
    w = tl.load(weight + cols, mask=m, other=0.0).to(tl.float32)
    res = tl.load(residual + at, mask=m, other=0.0)
    flag = tl.load(epochs + pid) + 1
    if LAMPORT:
        _, _, slots = launch_slots(inbox, epochs, T, H, WORLD)
        slot = tl.cast(T, tl.int64) * H
        lamport_send(x, slots, slot, at, m, rank, dists, WORLD)
        total, s = lamport_reduce(ctx, x, slots, slot, at, m, rank, WORLD)
        summed = total.to(x.dtype.element_ty)
        tl.store(x + at, summed, mask=m)
    else:
        s = ilt.tile_all_reduce(ctx, x + row * H + c0, 1, width, H, pid)
        summed = tl.load(x + at, mask=m, other=0.0)
    stamp(trace, 2, TRACE)
    r = (summed.to(tl.float32) + res.to(tl.float32)).to(residual_out.dtype.element_ty)
    tl.store(residual_out + at, r, mask=m)
    rf = r.to(tl.float32)
    sumsq, peak, waited = _split_sums(ctx, words, flag, tl.sum(rf * rf), tl.max(tl.abs(rf * w)), PARTS, FP8)
    stamp(trace, 4, TRACE)
    inv = tl.rsqrt(sumsq / H + eps)
    y = rf * inv * w
    if FP8:
        q = tl.maximum(peak * inv, 1e-12) / FP8_MAX
        if pid % PARTS == 0:
            tl.store(scale + row, q)
        y = y / q
    tl.store(out + at, y.to(out.dtype.element_ty), mask=m)
    advance_epochs(epochs, flag)
    return ilt.failure_or(s, waited)


@triton.jit
def _two_shot_rows(ctx, x, residual, residual_out, weight, out, scale, inbox, epochs, T, H, eps, rank, dists,
                   BLOCK_H: tl.constexpr, WORLD: tl.constexpr, FP8: tl.constexpr):
    """"two_shot" (module docs): this CTA's rows pid, pid + grid, ... Slots of this launch's half
    of `inbox`: for each peer, a slot of the rows this rank owns (`slot_of`: the reduce-scatter),
    then one slot of every row (the gathered sums; a row's owner is its only sender). Returns the
    status: after a failed wait the CTA stops (heap.check() raises)."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    epoch = tl.load(epochs + pid)
    per = tl.cdiv(T, WORLD)  # rows a rank owns (the last ranks may own fewer, or none)
    owned = per.to(tl.int64) * H  # elements of a reduce-scatter slot
    half = inbox + (epoch % 2).to(tl.int64) * ((WORLD - 1) * owned + tl.cast(T, tl.int64) * H)
    gathered = half + (WORLD - 1) * owned
    cols = tl.arange(0, BLOCK_H)
    m = cols < H
    mk = m[None, :]
    w = tl.load(weight + cols, mask=m, other=0.0)
    # 1. Reduce-scatter: each row another rank owns to this rank's slot there (no wait).
    for i in range(pid, T, grid):
        owner = i // per
        if owner != rank:
            local = tl.cast(i - owner * per, tl.int64) * H + cols[None, :]
            there = at_peer(half, dists, (owner - rank + WORLD) % WORLD)
            v = unempty(tl.load(x + tl.cast(i, tl.int64) * H + cols[None, :], mask=mk))
            tl.store(there + slot_of(rank, owner, WORLD).to(tl.int64) * owned + local, v, mask=mk)
    # 2. The rows this rank owns: summed as the peers' land, the sum to every peer, normalized.
    s = tl.zeros((), dtype=tl.int32)
    for i in range(pid, T, grid):
        if (i // per == rank) & (s == 0):
            row = tl.cast(i, tl.int64) + tl.arange(0, 1)
            at = row[:, None] * H + cols[None, :]
            res = tl.load(residual + at, mask=mk, other=0.0)
            local = tl.cast(i - rank * per, tl.int64) * H + cols[None, :]
            total, s = lamport_reduce_values(ctx, tl.load(x + at, mask=mk, other=0.0), half, owned, local, mk, rank,
                                             WORLD)
            if s == 0:
                summed = unempty(total.to(x.dtype.element_ty))  # as the peers will get it
                lamport_store(summed, gathered, 0, at, mk, rank, dists, WORLD)
                tl.store(x + at, summed, mask=mk)
                _norm_sums(summed, res, w, residual_out, out, scale, row, row == row, H, eps, BLOCK_H, FP8)
    # 3. The other rows: their sums polled as they land, the slot set back to empty, normalized.
    for i in range(pid, T, grid):
        if (i // per != rank) & (s == 0):
            row = tl.cast(i, tl.int64) + tl.arange(0, 1)
            at = row[:, None] * H + cols[None, :]
            res = tl.load(residual + at, mask=mk, other=0.0)
            summed, s = lamport_receive(ctx, gathered + at, mk)
            if s == 0:
                tl.store(x + at, summed, mask=mk)
                _norm_sums(summed, res, w, residual_out, out, scale, row, row == row, H, eps, BLOCK_H, FP8)
    advance_epochs(epochs, epoch + 1)
    return s


@jit(do_not_specialize=["ctx", "T", "eps"])
def allreduce_rmsnorm_kernel(ctx, x, residual, residual_out, weight, out, scale, T, H, eps, status, trace, ws, epochs,
                             inbox,
                             WHOLE: tl.constexpr, BLOCK_H: tl.constexpr, FP8: tl.constexpr = False,
                             PDL: tl.constexpr = False, PRELOAD: tl.constexpr = True, TRACE: tl.constexpr = False,
                             ROWS: tl.constexpr = 1, PUSH: tl.constexpr = False, WORLD: tl.constexpr = 2,
                             SPLIT: tl.constexpr = False, PARTS: tl.constexpr = 1, W=0,
                             LAMPORT: tl.constexpr = False, TWO_SHOT: tl.constexpr = False):
    """The fused op on a [T, H] heap tensor `x` (see the module docs); each CTA writes its status.
    residual_out may be residual (in place); scale is read only with FP8. With PDL (launched with
    `launch_pdl=True`, sm_90+) it starts while the previous kernel runs and waits for it before
    touching memory (`ironlink.language.pdl`). Rows mode normalizes ROWS rows at a time
    (`tuning.rmsnorm_rows_at_once`). PUSH: mode "push" (module docs) instead of the tile
    all-reduce, over `ws` (the rows' slots, heap) and `epochs` (one launch counter per CTA,
    MAX_CTAS int32, zeroed at creation); WORLD the ranks (else unused). SPLIT: mode "split"
    (module docs), PARTS slices a row of W columns, BLOCK_H a power of two >= W, `ws` the slices'
    words (SPLIT_WORDS int64, zeroed at creation), `epochs` as for PUSH. LAMPORT: mode "lamport"
    (module docs), `ws` and `epochs` as for PUSH, every slot empty (-0.0) between calls. TWO_SHOT
    (with LAMPORT): mode "two_shot" (module docs), `inbox` its slots. PRELOAD (rows, push): the
    weight and the CTA's first residual rows are loaded before the all-reduce, so their latency
    hides behind it. TRACE: the global timer
    at the start, after the wait for the previous kernel, after the all-reduce and at the end
    (`fused/trace.py`; bench/probes/rmsnorm_timeline.py)."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    stamp(trace, 0, TRACE)
    # The rank and the peers' addresses come from the context, which no kernel writes: read
    # before the wait, their chain of dependent loads overlaps the previous kernel.
    rank = pid * 0
    dists = tl.zeros([PEERS], dtype=tl.int64)
    if PUSH or LAMPORT:
        rank = il.symm_rank(ctx)
    if LAMPORT:
        dists = peer_distances(ctx, inbox, rank, WORLD)
    # Anything else we read may be the previous kernel's output (x, the residual, the weight, the
    # heap's counters and LL boxes, the status buffer): wait first. The next kernel waits for our
    # completion before it touches memory, so it may start at once.
    wait_for_previous_kernel(PDL)
    allow_next_kernel(PDL)
    stamp(trace, 1, TRACE)
    per = tl.cdiv(T, grid)  # rows, push, lamport: this CTA's block of rows
    r0 = pid * per
    r1 = tl.minimum(T, r0 + per)
    if SPLIT:
        s = _split_row(ctx, x, residual, residual_out, weight, out, scale, T, H, eps, ws, epochs, inbox, W, trace,
                       rank, dists, BLOCK_H, PARTS, FP8, TRACE, LAMPORT, WORLD)
    elif WHOLE:
        s = ilt.all_reduce(ctx, x, T * H)
        stamp(trace, 2, TRACE)
        s = _norm_after_grid_barrier(s, ctx, x, residual, residual_out, weight, out, scale, T, H, eps, BLOCK_H, FP8)
    elif TWO_SHOT:
        s = _two_shot_rows(ctx, x, residual, residual_out, weight, out, scale, inbox, epochs, T, H, eps, rank, dists,
                           BLOCK_H, WORLD, FP8)
        stamp(trace, 2, TRACE)
    elif LAMPORT:
        s = _lamport_rows(ctx, x, residual, residual_out, weight, out, scale, inbox, epochs, r0, r1, T, H, eps,
                          rank, dists, BLOCK_H, ROWS, WORLD, FP8)
        stamp(trace, 2, TRACE)
    elif PUSH:
        s = _push_pipelined(ctx, x, residual, residual_out, weight, out, scale, ws, epochs, r0, r1, T, H, eps,
                            rank, BLOCK_H, ROWS, WORLD, FP8)
        stamp(trace, 2, TRACE)
    else:
        rows = tl.maximum(r1 - r0, 0)
        cols = tl.arange(0, BLOCK_H)
        m = cols < H
        lanes = tl.arange(0, ROWS).to(tl.int64)
        if PRELOAD:
            w = tl.load(weight + cols, mask=m, other=0.0)
            at = (r0 + lanes)[:, None] * H + cols[None, :]
            first = tl.load(residual + at, mask=(r0 + lanes < r1)[:, None] & m[None, :], other=0.0)
        s = ilt.tile_all_reduce(ctx, x + r0.to(tl.int64) * H, rows, H, H, pid)
        stamp(trace, 2, TRACE)
        if not PRELOAD:
            w = tl.load(weight + cols, mask=m, other=0.0)
        for row in range(r0, r1, ROWS):
            block = row + lanes
            valid = block < r1
            at = block[:, None] * H + cols[None, :]
            if PRELOAD:
                if row == r0:
                    res = first
                else:
                    res = tl.load(residual + at, mask=valid[:, None] & m[None, :], other=0.0)
            else:
                res = tl.load(residual + at, mask=valid[:, None] & m[None, :], other=0.0)
            _norm_values(x, res, w, residual_out, out, scale, block, valid, H, eps, BLOCK_H, FP8)
    stamp(trace, 3, TRACE)
    tl.store(status + pid, s)


# A heap of several nodes: the same over the hierarchical all-reduces, linked with the NVSHMEM bitcode.
@jit(do_not_specialize=["ctx", "T", "eps"], nvshmem=True, several_nodes=True)
def allreduce_rmsnorm_hierarchical_kernel(ctx, x, residual, residual_out, weight, out, scale, T, H, eps, status,
                                          WHOLE: tl.constexpr, BLOCK_H: tl.constexpr, FP8: tl.constexpr = False):
    pid, grid = tl.program_id(0), tl.num_programs(0)
    if WHOLE:
        s = ilt.all_reduce(ctx, x, T * H)
        s = _norm_after_grid_barrier(s, ctx, x, residual, residual_out, weight, out, scale, T, H, eps, BLOCK_H, FP8)
    else:
        per = tl.cdiv(T, grid)
        r0 = pid * per
        r1 = tl.minimum(T, r0 + per)
        s = ilt.tile_all_reduce(ctx, x + r0.to(tl.int64) * H, tl.maximum(r1 - r0, 0), H, H, pid)
        for row in range(r0, r1):
            _norm_row(x, residual, residual_out, weight, out, scale, row, H, eps, BLOCK_H, FP8)
    tl.store(status + pid, s)


@eager.register  # what the operators all_reduce_rmsnorm(_out) run (fused/torch_library.py finds it there)
def all_reduce_rmsnorm(x: Any, residual: Any, weight: Any, eps: float = 1e-6, out: Any = None,
                       heap: Any = None, mode: Optional[str] = None, check: bool = False,
                       residual_out: Any = None, scale: Any = None, pdl: Optional[bool] = None) -> tuple[Any, ...]:
    """All-reduce `x` (a [tokens, hidden] heap tensor, overwritten with the sum), add it into
    `residual` (in place, or into `residual_out` leaving `residual` as it is) and RMS-normalize
    the result with `weight`; returns (out, residual or residual_out). `out` (default: a new
    tensor like x) may be x itself. An `out` of dtype torch.float8_e4m3fn gets the normalized rows
    quantized per token (module docs; Hopper and later), with the scales in `scale` (fp32
    [tokens]; allocated when None), and the call returns (out, residual, scale). `pdl`: launch
    with programmatic dependent launch (`ironlink.language.pdl`; None: `tuning.DECODE_PDL` where the GPU
    has it, compute capability 9.0+; one-node heaps). Collective; CUDA-graph capturable."""
    if compiling():  # torch.compile: the registered operator (fused/torch_library.py)
        from .torch_library import all_reduce_rmsnorm as traced
        return traced(x, residual, weight, eps, out, heap, mode, check, residual_out, scale, pdl)
    import torch

    h = heap_for(x, "x", heap, "all_reduce_rmsnorm")
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
             spec(scale, "scale") if scale is not None else None)
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
           eps: float, status: Any, pdl: bool, trace: Any = None, preload: bool = True) -> None:
    """Launches plan `p` (no checks: `all_reduce_rmsnorm` made them; `scale` is any tensor
    without FP8). bench/probes/rmsnorm_timeline.py calls it directly: `trace` (int64 [ctas,
    TRACE_SLOTS], zeroed) records the phases of each CTA, `preload=False` loads the residual and
    the weight after the all-reduce (rows)."""
    if heap.multi_node:
        allreduce_rmsnorm_hierarchical_kernel[(p.ctas,)](
            heap.ctx, x, residual, residual_out, weight, out, scale, p.tokens, p.hidden, float(eps), status,
            WHOLE=p.mode == "whole", BLOCK_H=p.block_h, FP8=p.fp8, num_warps=p.warps)
        return
    ws, epochs, inbox = workspaces(heap, p, x, status)
    allreduce_rmsnorm_kernel[(p.ctas,)](
        heap.ctx, x, residual, residual_out, weight, out, scale, p.tokens, p.hidden, float(eps), status,
        trace if trace is not None else status, ws, epochs, inbox, WHOLE=p.mode == "whole", BLOCK_H=p.block_h,
        FP8=p.fp8, PRELOAD=preload, TRACE=trace is not None, ROWS=p.rows_at_once, PUSH=p.mode == "push",
        LAMPORT=p.lamport, TWO_SHOT=p.mode == "two_shot", WORLD=heap.world_size, SPLIT=p.mode == "split",
        PARTS=p.parts, W=p.slice_cols,
        num_warps=p.warps, **pdl_launch_options(pdl))


def workspaces(heap: Any, p: Plan, x: Any, status: Any) -> tuple[Any, Any, Any]:
    """The kernel's `ws`, `epochs` and `inbox` for plan `p`, kept in the heap between calls
    (`heap.workspace`; x or `status` where the mode reads none): `ws` mode "push"'s slots (x's dtype)
    or mode "split"'s words (int64 [SPLIT_WORDS], zeroed when made); `epochs` the per-CTA launch
    counters push, split and lamport keep (int32 [MAX_CTAS], zeroed when made: equal on every
    rank); `inbox` the lamport slots (x's dtype, every element -0.0 when made: "empty")."""
    import torch

    ws, epochs, inbox = x, status, x
    if p.mode in ONE_NODE_MODES:
        epochs = epoch_counters(heap, "all_reduce_rmsnorm")
    if p.mode == "split":
        nbytes = 8 * SPLIT_WORDS.value
        ws = heap.workspace("all_reduce_rmsnorm/split", nbytes, zeroed_prefix=nbytes).view(torch.int64)
    elif p.mode == "push":
        ws = heap.workspace("all_reduce_rmsnorm", p.workspace_bytes).view(x.dtype)
    if p.lamport:
        inbox = lamport_workspace(heap, "all_reduce_rmsnorm", p.workspace_bytes, x.dtype)
    return ws, epochs, inbox


__all__ = ["MAX_HIDDEN", "MODES", "ONE_NODE_MODES", "all_reduce_rmsnorm", "launch",
           "allreduce_rmsnorm_hierarchical_kernel", "allreduce_rmsnorm_kernel", "plan", "split_into", "two_shot_slots"]
