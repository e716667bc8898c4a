"""all_reduce_rmsnorm's reduce-scatter + all-gather modes, as device functions its kernel calls
(`all_reduce_rmsnorm_kernels`; the other modes' exchanges are in `all_reduce_rmsnorm_exchanges`).
Each rank owns a chunk of every row's columns, sums it over the ranks and sends the sum to every
peer; the two modes differ in how the chunks travel and how their arrival is known:

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

from .. import language as il
from ..language import typed as ilt
from ..language._flags import unempty
from ..language.slots import (advance_epochs, at_peer, lamport_receive, lamport_reduce_values, lamport_store,
                              launch_slots, slot_of)
from ..language.fp8 import FP8_MAX
from ..language.trace import stamp
from .all_reduce_rmsnorm_exchanges import share_slice_sums
from .all_reduce_rmsnorm_norm import norm_sums


@triton.jit
def push_two_shot(ctx, x, residual, residual_out, weight, out, scale, ws, half, epochs, r0, r1, T, H, C, eps, rank,
                  BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr, WORLD: tl.constexpr,
                  FP8: tl.constexpr):
    """"push_two_shot" (module docs): this CTA's rows r0..r1 in chunks of ROWS rows, rank j owning
    columns j C .. (j + 1) C of every row (BLOCK_C a power of two >= C). This launch's half of
    `ws` (`half` elements) holds for each peer a slot of T rows of this rank's chunk (what it
    scatters here), then T whole rows (the owners' sums, gathered here). Step i of chunks + 2:
    scatter chunk i, wait for the peers' step i - 1, sum and gather chunk i - 1, normalize chunk
    i - 2, signal step i. A peer's k-th signal of the tile is its step k - 1's, which covers the
    stores this rank's k-th wait needs (its scatter of chunk k - 1, its gather of chunk k - 2), so
    one counted signal a step suffices. Returns the status: after a failed wait or signal the CTA stops (its rows not yet
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
    `flag` (`share_slice_sums`); the row's scale stored by its `first` unit. Returns the status
    of the wait for the other slices (0 with one slice a row)."""
    r = (sums.to(tl.float32) + res.to(tl.float32)).to(residual_out.dtype.element_ty)
    tl.store(residual_out + at, r, mask=m)
    rf = r.to(tl.float32)
    wf = w.to(tl.float32)
    sumsq = tl.sum(tl.sum(rf * rf, axis=1), axis=0)
    peak = tl.max(tl.max(tl.abs(rf * wf), axis=1), axis=0)  # read with FP8 only
    s = tl.zeros((), dtype=tl.int32)
    if PARTS > 1:
        sumsq, peak, s = share_slice_sums(ctx, words, flag, sumsq, peak, PARTS, FP8)
    inv = tl.rsqrt(sumsq / H + eps)
    y = rf * inv * wf
    if FP8:
        q = tl.maximum(peak * inv, 1e-12) / FP8_MAX
        if first:
            tl.store(scale, q)
        y = y / q
    tl.store(out + at, y.to(out.dtype.element_ty), mask=m)
    return s


__all__ = ["push_two_shot", "two_shot_rows"]
