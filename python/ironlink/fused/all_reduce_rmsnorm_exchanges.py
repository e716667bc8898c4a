"""The exchanges of all_reduce_rmsnorm's modes, as device functions its kernel calls
(`all_reduce_rmsnorm_kernels`); the host side chooses the mode (`all_reduce_rmsnorm`). Here
the one-shot modes' ("push", "split", "lamport"); the reduce-scatter + all-gather modes' in
`all_reduce_rmsnorm_two_shot`.

The seven modes, each one launch (`mode`, chosen by the decode table, `tuning.rmsnorm_mode`):
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
- "two_shot" and "push_two_shot": each rank owns a chunk of every row's columns, sums it and
  sends the sum to every peer (`all_reduce_rmsnorm_two_shot` says how each does it).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..language import _abi
from ..language._flags import tagged, wait_tagged
from .. import language as il
from ..language import typed as ilt
from ..language.slots import (add_in_rank_order, advance_epochs, lamport_reduce, lamport_send, launch_slots,
                              store_to_peer_slots)
from ..language.fp8 import FP8_MAX
from ..language.trace import stamp
from .all_reduce_rmsnorm_norm import norm_sums

# "split": a slice's partial sums (two int64 words per CTA: sum of squares, FP8 peak), the high
# half the launch count + 1 (never 0, which the zeroed words hold), the low half the f32's bits.
SPLIT_WORDS = tl.constexpr(2 * _abi.MAX_CTAS)
# Where a split CTA's timed-out wait for its row's slices is recorded: the detail names
# symm_tile_all_reduce, the call the mode is built on.
_TILE_ALL_REDUCE = tl.constexpr(list(_abi.FUNCTIONS).index("symm_tile_all_reduce"))


@triton.jit
def _rows_prologue(slots_ws, half, epochs, weight, residual, r0, r1, T, H, BLOCK_H: tl.constexpr,
                   ROWS: tl.constexpr, WORLD: tl.constexpr):
    """What "push" and "lamport" set up for a CTA's rows r0..r1 over the slots of `slots_ws` (halves
    of `half` elements):
    (this launch's count, this launch's slots, columns, their mask, the weight, elements a slot,
    chunks of ROWS rows, the first row's residual). With one row at a time (decode: a row a
    CTA) that residual is loaded before any store, as rows mode does ("PRELOAD"), so its latency
    hides behind the exchange; two rows kept live through the loop spill on sm_90 (with more rows
    at a time it is not loaded)."""
    epoch, _, slots = launch_slots(slots_ws, epochs, half)
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
def push_pipelined(ctx, x, residual, residual_out, weight, out, scale, ws, half, epochs, r0, r1, T, H, eps, rank,
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
    epoch, slots, cols, m, w, slot, chunks, first = _rows_prologue(ws, half, epochs, weight, residual, r0, r1, T, H,
                                                                   BLOCK_H, ROWS, WORLD)
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
                norm_sums(total, res, w, residual_out, out, scale, block, valid, H, eps, BLOCK_H, FP8)
        if (c < chunks) & (s == 0):  # chunk c's stores drained during chunk c - 1's sums
            s = il.symm_tile_signal_others(ctx, pid)
    advance_epochs(epochs, epoch + 1)
    return s


@triton.jit
def lamport_rows(ctx, x, residual, residual_out, weight, out, scale, inbox, half, epochs, r0, r1, T, H, eps, rank,
                 dists, BLOCK_H: tl.constexpr, ROWS: tl.constexpr, WORLD: tl.constexpr, FP8: tl.constexpr):
    """"lamport": this CTA's rows r0..r1 are stored into this rank's slot at every peer (as push
    lays them out, in `inbox`), every chunk of ROWS rows at once, then chunk by chunk the peers'
    rows are polled in this rank's slots until no element is empty (`wait_written`), summed over
    the ranks in rank order (fp32, into x), the slots set back to empty, and the rows normalized.
    No signal and no fence: the rows are read as they land. Between calls every slot of the workspace is
    empty (its creator fills it; each call empties what it read), so the layout may change with T: a
    launch lays its rows out from the start of its half, and the halves stay apart whatever T (`half`),
    since a slower peer may still read the other half. Returns the status: after a failed wait the CTA
    stops (its rows not yet summed keep this rank's x, and the slots are no longer all empty:
    heap.check() raises)."""
    epoch, slots, cols, m, w, slot, chunks, first = _rows_prologue(inbox, half, epochs, weight, residual, r0, r1, T,
                                                                   H, BLOCK_H, ROWS, WORLD)
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
                norm_sums(summed, res, w, residual_out, out, scale, block, valid, H, eps, BLOCK_H, FP8)
    advance_epochs(epochs, epoch + 1)
    return s


@triton.jit
def share_slice_sums(ctx, words, flag, sumsq, peak, PARTS: tl.constexpr, FP8: tl.constexpr):
    """"split" (and "two_shot" over slices): publishes this CTA's slice sums (`sumsq`, and `peak` with FP8) tagged with `flag`,
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
def split_row(ctx, x, residual, residual_out, weight, out, scale, T, H, eps, words, epochs, inbox, half, W, trace, rank,
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
        _, _, slots = launch_slots(inbox, epochs, half)
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
    sumsq, peak, waited = share_slice_sums(ctx, words, flag, tl.sum(rf * rf), tl.max(tl.abs(rf * w)), PARTS, FP8)
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


__all__ = ["SPLIT_WORDS", "lamport_rows", "push_pipelined", "share_slice_sums", "split_row"]
