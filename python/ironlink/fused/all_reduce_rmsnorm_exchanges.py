"""The exchanges of all_reduce_rmsnorm's modes, as device functions its kernel calls
(`all_reduce_rmsnorm_kernels`); the host side chooses the mode (`all_reduce_rmsnorm`).

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
- "two_shot": each row's columns are owned by the ranks in chunks (rank j the j-th of `world`
  chunks of C columns, a multiple of 16); each CTA takes rows pid, pid + grid, ... and sends every
  chunk another rank owns to its owner's lamport slots (a reduce-scatter), sums this rank's chunk
  of each row as the peers' land (fixed order, fp32, rounded to x's dtype), sends the sum to every
  peer (an all-gather into one lamport slot a row: a chunk has one sender), then reads each row
  whole as the peers' chunks land and normalizes it. A rank sends 2 (world - 1) / world of x where
  "lamport" sends (world - 1) copies: at world 4 half the bytes, for a second hop's latency. Every
  CTA moves the same bytes: owning rows instead (rank j the j-th block of rows) left a quarter of
  the CTAs sending three copies of a row while the rest sent one, and a CTA's stores are slow
  (about 7 GB/s on an H200: one CTA sends 48 KiB in 7.75 us, bench/probes/rmsnorm_timeline.py).
  Every rank normalizes the same bits of the sum with the same code, so results are bitwise
  identical. Each CTA waits only for the same CTA index of its peers (no residency needed). One
  node only; its workspace (two halves, alternate launches, each (world - 1) slots of T chunk rows
  and T whole rows) made at the first call (before a CUDA graph capture).
- "push_two_shot": "two_shot"'s bytes over "push"'s signalled slots, for many tokens: each CTA owns
  a block of rows, as in "push", and walks it in chunks of `rows_at_once` rows, pipelined. In step
  i it sends every column chunk of chunk i's rows that a peer owns to that peer (a
  reduce-scatter, plain stores), waits for its peers' step i - 1 (one tile signal a step, tile =
  CTA index), sums this rank's column chunk of chunk i - 1 over the ranks (rank order, fp32,
  rounded to x's dtype) and stores the sum into every peer's gathered rows (the all-gather),
  normalizes chunk i - 2 (its rows now whole here), then signals step i, which covers both its
  scatter and its gather. A rank sends 2 (world - 1) / world of x, where "push" sends world - 1
  copies (at world 4 half the bytes, at world 8 a quarter), and the norm of chunk i - 2 runs while
  the link carries step i's stores; no slot is emptied after reading, as lamport slots must be. The
  owner of a chunk sums it and sends the same bits to every rank, so results are bitwise
  identical (and equal "push"'s: the same sums in the same order). The workspace is "push"'s,
  each half laid out as "two_shot"'s (`two_shot_slots` at one slice a row). One node only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..language import _abi
from ..language._flags import tagged, unempty, wait_tagged
from .. import language as il
from ..language import typed as ilt
from ..language.slots import (add_in_rank_order, advance_epochs, at_peer, lamport_receive, lamport_reduce,
                              lamport_reduce_values, lamport_send, lamport_store, launch_slots, slot_of,
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
def push_two_shot(ctx, x, residual, residual_out, weight, out, scale, ws, half, epochs, r0, r1, T, H, C, eps, rank,
                  BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr, WORLD: tl.constexpr,
                  FP8: tl.constexpr):
    """"push_two_shot" (module docs): this CTA's rows r0..r1 in chunks of ROWS rows, rank j owning
    columns j C .. (j + 1) C of every row (BLOCK_C a power of two >= C). This launch's half of
    `ws` (`half` elements) holds for each peer a slot of T rows of this rank's chunk (what it
    scatters here), then T whole rows (the owners' sums, gathered here). Step i of chunks + 2:
    scatter chunk i, wait for the peers' step i - 1, sum and gather chunk i - 1, normalize chunk
    i - 2, signal step i. A peer's k-th
    signal of the tile is its step k - 1's, which covers the stores this rank's k-th wait needs
    (its scatter of chunk k - 1, its gather of chunk k - 2), so one counted signal a step
    suffices. Returns the status: after a failed wait or signal the CTA stops (its rows not yet
    normalized keep this rank's x)."""
    pid = tl.program_id(0)
    epoch, _, slots = launch_slots(ws, epochs, half)
    scattered = tl.cast(T, tl.int64) * C  # elements of a peer's reduce-scatter slot
    gathered = slots + (WORLD - 1) * scattered  # [T, H]: the owners' sums of their chunks
    cols = tl.arange(0, BLOCK_H)
    m = cols < H
    mine = (cols >= rank * C) & (cols < rank * C + C)  # this rank's chunk of a row
    w = tl.load(weight + cols, mask=m, other=0.0)
    c = tl.arange(0, BLOCK_C)
    lanes = tl.arange(0, ROWS).to(tl.int64)
    chunks = tl.cdiv(tl.maximum(r1 - r0, 0), ROWS)
    s = tl.zeros((), dtype=tl.int32)
    for i in range(0, tl.where(chunks > 0, chunks + 2, 0)):
        if (i < chunks) & (s == 0):  # 1. chunk i's peer-owned columns, each to its owner's slot
            block = r0 + i * ROWS + lanes
            for k in tl.static_range(1, WORLD):
                dest = (rank + k) % WORLD
                lo = dest * C
                mk = (block < r1)[:, None] & (c < tl.minimum(C, H - lo))[None, :]
                v = tl.load(x + block[:, None] * H + lo + c[None, :], mask=mk)
                there = ilt.peer_pointer(ctx, slots, dest) + slot_of(rank, dest, WORLD).to(tl.int64) * scattered
                tl.store(there + block[:, None] * C + c[None, :], v, mask=mk)
        if (i > 0) & (s == 0):
            s = il.symm_tile_wait_others(ctx, pid)
        if (i > 0) & (i <= chunks) & (s == 0):  # 2. this rank's chunk of chunk i - 1: summed, gathered
            block = r0 + (i - 1) * ROWS + lanes
            lo = rank * C
            mk = (block < r1)[:, None] & (c < tl.minimum(C, H - lo))[None, :]
            at = block[:, None] * H + lo + c[None, :]
            own = tl.load(x + at, mask=mk, other=0.0)
            total = tl.zeros((ROWS, BLOCK_C), dtype=tl.float32)
            for q in tl.static_range(WORLD):  # every load in flight at once; rank order
                there = slots + slot_of(q, rank, WORLD).to(tl.int64) * scattered + block[:, None] * C + c[None, :]
                theirs = tl.load(there, mask=mk & (q != rank), other=0.0)
                total += tl.where(q == rank, own, theirs).to(tl.float32)
            summed = total.to(x.dtype.element_ty)
            tl.store(x + at, summed, mask=mk)
            for k in tl.static_range(1, WORLD):
                tl.store(ilt.peer_pointer(ctx, gathered, (rank + k) % WORLD) + at, summed, mask=mk)
        if (i > 1) & (s == 0):  # 3. chunk i - 2 whole: the peers' sums gathered, this rank's in x
            block = r0 + (i - 2) * ROWS + lanes
            valid = block < r1
            mk = valid[:, None] & m[None, :]
            theirs = mk & ~mine[None, :]
            at = block[:, None] * H + cols[None, :]
            res = tl.load(residual + at, mask=mk, other=0.0)
            sums = tl.where(mine[None, :], tl.load(x + at, mask=mk & mine[None, :], other=0.0),
                            tl.load(gathered + at, mask=theirs, other=0.0))
            tl.store(x + at, sums, mask=theirs)
            norm_sums(sums, res, w, residual_out, out, scale, block, valid, H, eps, BLOCK_H, FP8)
        if (i <= chunks) & (s == 0):  # step i's stores drained during the norm
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
def two_shot_rows(ctx, x, residual, residual_out, weight, out, scale, words, inbox, half, epochs, T, H, C, eps, rank,
                  dists, trace, BLOCK_C: tl.constexpr, PARTS: tl.constexpr, WORLD: tl.constexpr, FP8: tl.constexpr,
                  TRACE: tl.constexpr):
    """"two_shot" (module docs): this CTA's units pid, pid + grid, ..., unit u the slice u % PARTS
    of row u // PARTS (WORLD chunks of C columns; BLOCK_C a power of two >= C), rank j owning chunk
    j of every slice. Slots of this launch's half of `inbox` (`half` elements): for each peer a slot of T x PARTS
    chunks (what it sends for this rank's chunk of each unit: the reduce-scatter), then one of T
    whole rows (the owners' summed chunks: the all-gather, one sender per chunk). With PARTS > 1
    (a unit a CTA, every CTA resident) the slices of a row share their sums of squares through
    `words`, as split does. TRACE: slot 2 of `trace` stamped before each unit's norm (the last
    unit's stays: with a unit a CTA the exchange and the norm apart). Returns the status: after a
    failed wait the CTA stops (heap.check() raises)."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    units = T * PARTS
    scattered = tl.cast(units, tl.int64) * C  # elements of a reduce-scatter slot
    epoch, _, slots = launch_slots(inbox, epochs, half)
    gathered = slots + (WORLD - 1) * scattered
    c = tl.arange(0, BLOCK_C)
    # 1. Reduce-scatter: each unit's chunk that peer k owns, to this rank's slot there (no wait).
    for u in range(pid, units, grid):
        row = tl.cast(u // PARTS, tl.int64) * H
        for k in tl.static_range(1, WORLD):
            dest = (rank + k) % WORLD
            lo = (u % PARTS) * WORLD * C + dest * C  # the chunk's first column
            mk = c < tl.minimum(C, H - lo)
            v = unempty(tl.load(x + row + lo + c, mask=mk))
            there = at_peer(slots, dists, k) + slot_of(rank, dest, WORLD).to(tl.int64) * scattered
            tl.store(there + tl.cast(u, tl.int64) * C + c, v, mask=mk)
    # 2. This rank's chunk of each unit: summed as the peers' land (fixed order, fp32, rounded to
    # x's dtype), stored into x and sent to every peer's gathered row.
    s = tl.zeros((), dtype=tl.int32)
    for u in range(pid, units, grid):
        if s == 0:
            lo = (u % PARTS) * WORLD * C + rank * C
            mine = c < tl.minimum(C, H - lo)
            at = tl.cast(u // PARTS, tl.int64) * H + lo + c
            total, s = lamport_reduce_values(ctx, tl.load(x + at, mask=mine, other=0.0), slots, scattered,
                                             tl.cast(u, tl.int64) * C + c, mine, rank, WORLD)
            if s == 0:
                summed = unempty(total.to(x.dtype.element_ty))  # as the peers will get it
                lamport_store(summed, gathered, 0, at, mine, rank, dists, WORLD)
                tl.store(x + at, summed, mask=mine)
    # 3. Each unit whole: the peers' chunks polled as they land (the slot set back to empty), this
    # rank's read back from x (the barrier orders this CTA's stores of step 2 before the loads),
    # normalized. A unit is [WORLD, BLOCK_C]: chunk j in row j (WORLD a power of two).
    tl.debug_barrier()
    j = tl.arange(0, WORLD)[:, None]
    for u in range(pid, units, grid):
        if s == 0:
            row = tl.cast(u // PARTS, tl.int64) * H  # offsets from the row's start: int32 lanes
            cols = (u % PARTS) * WORLD * C + j * C + c[None, :]
            if FP8:
                # 8 a thread, the bf16 accesses' width. The hint marks the op that made `cols`, so it
                # is set here: set in _norm_unit, on its argument, it was lost, the FP8 store's 16 a
                # thread became the whole block's layout and the exchange took 7 us more at 128
                # tokens (4 H200s, rmsnorm_timeline --fp8, session 44).
                cols = tl.max_contiguous(cols, [1, 8])
            m = (c[None, :] < C) & (cols < H)
            theirs = m & (j != rank)
            res = tl.load(residual + row + cols, mask=m, other=0.0)
            w = tl.load(weight + cols, mask=m, other=0.0)
            got, s = lamport_receive(ctx, gathered + row + cols, theirs)
            if s == 0:
                summed = tl.where(theirs, got, tl.load(x + row + cols, mask=m & (j == rank), other=0.0))
                tl.store(x + row + cols, summed, mask=theirs)
                stamp(trace, 2, TRACE)
                s = _norm_unit(ctx, summed, res, w, residual_out + row, out + row, scale + u // PARTS, words,
                               epoch + 1, cols, m, H, eps, u % PARTS == 0, PARTS, FP8)
    advance_epochs(epochs, epoch + 1)
    return s


@triton.jit
def _norm_unit(ctx, sums, res, w, residual_out, out, scale, words, flag, at, m, H, eps, first, PARTS: tl.constexpr,
               FP8: tl.constexpr):
    """The norm of one "two_shot" unit held as a [world, chunk] block: `sums`, its residual `res`
    and the weight `w` at element offsets `at` (where `m`) of `residual_out` and `out`. The row's
    sum of squares (and with FP8 its peak |residual x weight|) is this block's, or with PARTS > 1
    (the unit a slice of the row) shared with the row's other slices through `words` tagged with
    `flag` (`_split_sums`); the row's scale stored by its `first` unit. Returns the status of the
    wait for the other slices (0 with one slice a row)."""
    r = (sums.to(tl.float32) + res.to(tl.float32)).to(residual_out.dtype.element_ty)
    tl.store(residual_out + at, r, mask=m)
    rf = r.to(tl.float32)
    wf = w.to(tl.float32)
    sumsq = tl.sum(tl.sum(rf * rf, axis=1), axis=0)
    peak = tl.max(tl.max(tl.abs(rf * wf), axis=1), axis=0)  # read with FP8 only
    s = tl.zeros((), dtype=tl.int32)
    if PARTS > 1:
        sumsq, peak, s = _split_sums(ctx, words, flag, sumsq, peak, PARTS, FP8)
    inv = tl.rsqrt(sumsq / H + eps)
    y = rf * inv * wf
    if FP8:
        q = tl.maximum(peak * inv, 1e-12) / FP8_MAX
        if first:
            tl.store(scale, q)
        y = y / q
    tl.store(out + at, y.to(out.dtype.element_ty), mask=m)
    return s


__all__ = ["SPLIT_WORDS", "lamport_rows", "push_pipelined", "push_two_shot", "split_row", "two_shot_rows"]
