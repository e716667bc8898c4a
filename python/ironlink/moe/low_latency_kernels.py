"""The Triton kernels of MoeExchange's low-latency path (one node, few tokens: decode), one launch
for dispatch and one for combine. Host side: moe/low_latency.py.

In both, CTA c of every rank handles the tokens t = c, c + grid, ... of every rank and meets only
the same-index CTA of each peer (`symm_tile_signal_others` / `symm_tile_wait_others` on its own
tile index): no barrier over the grid, no counts read before the rows move.

- `ll_dispatch`: send: each of its tokens' row once to every rank that holds one of its experts,
  and its expert ids and weights to every rank, into slot (this rank, token) of the destination's
  `landing` buffer (peer stores), the token count beside them; signal; wait for the same CTA of
  every peer; receive: each landed token with a choice here takes, per such choice, the next row of
  its expert's block of recv_x (an atomic add on the expert's counter, so the order of rows within
  an expert varies run to run) and its row is copied there. The last CTA to arrive (a counter of
  arrivals) turns the experts' counters into expert_counts and zeroes them for the next call.
- `ll_combine`: send: for each landed token with a choice here, the weighted sum of its outputs
  here (`kernels.weighted_chunk`: fp32, choice order) rounded to the payload dtype, into slot (this
  rank, token) of its source's `back` buffer; signal; wait; sum: each own token's rows from the
  ranks it went to, added in rank order in fp32. The arithmetic of the other paths: the same bits.

`landing` and `back` have two halves, used by alternate calls (each CTA counts its own calls in
`calls`; the counts agree across ranks, which launch the same grid): a rank may start the next
dispatch (or combine) while a peer still reads the last one's half, and the one after that only
once the peer has passed its wait, so after its reads. Dispatch and combine need not alternate.

PHASE 0 (the default) is both halves in one launch with the tile signal and wait between. A
dispatch whose receive is deferred (`MoeExchange.dispatch(..., return_recv_hook=True)`) runs PHASE 1
(send) now and PHASE 2 (receive) in a later launch, other kernels in between; a tile signal
pending across those could be taken by theirs (tile indices are shared), so PHASE 1 announces a
CTA's sends by flag words of its own in every rank's `arrived` (`language._flags`: tagged with
the call, a release at system scope) and PHASE 2 waits for them (bounded by the context's
timeout). Combine always runs PHASE 0 on GPUs.

SIM (tests only): peers are buffers of one process reached by adding `deltas[q]` bytes, and the
test runs PHASE 1 (send) on every rank, then PHASE 2 (receive, or sum): dispatch's flags are
written and waited for as on GPUs (`ctx`: a fake context, for its timeout and error words).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import language as il
from ..language import _abi
from ..language import typed as ilt
from ..language._flags import tagged, wait_tagged
from ..language.jit import jit
from ..fused.trace import stamp
from .direct_kernels import _peer, sum_ranks_chunk
from .kernels import quantize_chunk, weighted_chunk

# Tile indices of the signals: dispatch's CTA c signals and waits on DISPATCH_TILE0 + c, combine's
# on COMBINE_TILE0 + c; the top of the range, away from the fused ops' tiles (numbered from 0).
DISPATCH_TILE0 = tl.constexpr(_abi.MAX_TILES - 2 * _abi.MAX_CTAS)
COMBINE_TILE0 = tl.constexpr(_abi.MAX_TILES - _abi.MAX_CTAS)
# slot of a choice here whose expert's block of recv_x was full (combine skips it as it skips
# -1, another rank's expert, but still sends the token's row: zeros where nothing fit).
NO_ROOM = tl.constexpr(-2)
# The detail a timed-out wait for the senders' flags records (PHASE 2): the wait that PHASE 0 makes.
_WAIT_OTHERS = tl.constexpr(list(_abi.FUNCTIONS).index("symm_tile_wait_others"))
MAX_CTAS = tl.constexpr(_abi.MAX_CTAS)
BLOCK = 8192  # elements of a row moved per step (a whole row of hidden 7168)
WARPS = 8


@triton.jit
def _this_call(calls):
    """(this CTA's calls so far, the half of the buffers this call uses: alternate calls alternate)."""
    call = tl.load(calls + tl.program_id(0))
    return call, (call % 2).to(tl.int64)


@triton.jit
def _meet(ctx, tile, PHASE: tl.constexpr):
    """The signal to every peer's same-index CTA and the wait for theirs (PHASE 0); 0 otherwise."""
    if PHASE == 0:
        s = ilt.failure_or(il.symm_tile_signal_others(ctx, tile), il.symm_tile_wait_others(ctx, tile))
    else:
        s = tl.program_id(0) * 0
    return s


@triton.jit
def _announce(ctx, arrived, half, rank, call, deltas, WORLD: tl.constexpr, WB: tl.constexpr, SIM: tl.constexpr):
    """PHASE 1 of dispatch (its receive comes in a later launch): once every thread's stores are
    issued, word (half, this rank, CTA) of every rank's `arrived` set to this call's flag, a
    release at system scope, so whoever sees the flag sees the stores (one thread per rank)."""
    tl.debug_barrier()
    at = (half * WORLD + rank) * MAX_CTAS + tl.program_id(0)
    w = tl.arange(0, WB)
    words = tl.zeros([WB], dtype=tl.int64)
    for d in tl.static_range(WORLD):
        words = tl.where(w == d, (_peer(ctx, arrived, d, deltas, SIM) + at).to(tl.int64), words)
    flag = tagged(call + 1, tl.zeros([WB], dtype=tl.float32))
    tl.atomic_xchg(words.to(tl.pointer_type(tl.int64)), flag, mask=w < WORLD, sem="release", scope="sys")


@triton.jit
def _await_senders(ctx, arrived, half, call, WORLD: tl.constexpr, WB: tl.constexpr):
    """PHASE 2 of dispatch: waits until the same-index CTA of every rank has announced this call's
    sends (`_announce`; bounded: TIMEOUT recorded in the context), then makes their stores
    visible to every thread of this CTA. Returns the status."""
    w = tl.minimum(tl.arange(0, WB), WORLD - 1)
    ptrs = arrived + (half * WORLD + w) * MAX_CTAS + tl.program_id(0)
    got, s = wait_tagged(ctx, ptrs, call + 1, _WAIT_OTHERS)
    tl.atomic_add(ptrs, 0, sem="acquire", scope="sys")  # the flags' release -> this CTA's loads
    tl.debug_barrier()
    return s


@jit(do_not_specialize=["ctx", "T", "rank"])
def ll_dispatch(ctx, x, idx, wts, T, landing, landing_words, landing8, landing_count, arrived, recv, recv_side, slot,
                weight,
                own_ids, src_counts, received, calls, counters, arrivals, expert_counts, expert_offsets, overflow, bad,
                rank, num_experts, local_experts, max_tokens, hidden, row, meta_col, copy_words, side_col, side_words,
                deltas, status, trace, WORLD: tl.constexpr, WB: tl.constexpr, K: tl.constexpr, KB: tl.constexpr,
                LB: tl.constexpr, BLOCK: tl.constexpr, SIDE_BLOCK: tl.constexpr, FP8: tl.constexpr, GROUP: tl.constexpr,
                QMAX: tl.constexpr, MIN_AMAX: tl.constexpr, PHASE: tl.constexpr, SIM: tl.constexpr,
                TRACE: tl.constexpr = False):
    """Dispatch of this rank's T tokens (x [T, hidden], idx / wts [T, K], contiguous; see the
    module docs). landing [2, WORLD, max_tokens, row] (heap, `row` 2-byte words; landing_words /
    landing8 its int32 / byte views; a row holds the token, its ids and weights from word
    meta_col / 2, and with FP8 its scales from word side_col / 2), landing_count [2, WORLD] int64
    (heap), arrived [2, WORLD, MAX_CTAS] int64 (heap, zeroed when made: PHASE 1 and 2's flags).
    recv [local_experts * WORLD * max_tokens, copy_words]: expert e's rows in its block, in
    landing's element type (bf16 / fp16 rows; FP8: int16 words of the fp8 bytes, and recv_side
    the int16 words of their fp32 scales, side_words a row), their number in expert_counts[e];
    slot / weight [WORLD * max_tokens, K]: row q * max_tokens + t of source q's token t, its recv
    row per choice (-1: not here, NO_ROOM: its block full) and weight; own_ids [max_tokens, K]
    int32: this rank's ids as sent (-1 out of range), for combine; src_counts [WORLD]: the tokens
    of each rank, received [1] their sum; expert_offsets: e * WORLD * max_tokens. counters
    [local_experts] int32 and arrivals [1] int32: zero between calls. overflow (moe.sort.SUMMARY):
    an expert whose rows did not fit; bad [grid]: this CTA's out-of-range ids among its own
    tokens. FP8: each token quantized per GROUP channels on its way out (kernels.quantize_chunk).
    TRACE: the global timer into `trace` [grid, TRACE_SLOTS] at the start (0), once the sends are
    issued (1), after the meeting with the peers (2), after the copies into recv_x (3) and at the
    end (4) (bench/moe_timeline.py)."""
    stamp(trace, 0, TRACE)
    pid, grid = tl.program_id(0), tl.num_programs(0)
    call, half = _this_call(calls)
    kk = tl.arange(0, KB)
    km = kk < K
    offs = tl.arange(0, BLOCK)
    meta = meta_col // 2  # in 4-byte words
    s = pid * 0
    if PHASE != 2:
        nbad = tl.zeros((), dtype=tl.int32)
        for t0 in range(pid, T, grid):
            t = tl.cast(t0, tl.int64)
            e = tl.load(idx + t * K + kk, mask=km, other=-1).to(tl.int32)
            ok = km & (e >= 0) & (e < num_experts)
            nbad += tl.sum((km & ~ok).to(tl.int32), 0)
            e = tl.where(ok, e, -1)
            w = tl.load(wts + t * K + kk, mask=km, other=0.0).to(tl.float32)
            tl.store(own_ids + t * K + kk, e, mask=km)
            dest = tl.where(ok, e // local_experts, -1)
            at = (half * WORLD + rank) * max_tokens + t  # the token's row in every rank's landing
            for d in tl.static_range(WORLD):  # the ids and weights to every rank
                words = _peer(ctx, landing_words, d, deltas, SIM) + at * (row // 2) + meta
                tl.store(words + kk, e, mask=km)
                tl.store(words + K + kk, w.to(tl.int32, bitcast=True), mask=km)
            for c in range(0, hidden, BLOCK):  # the row, loaded (and quantized) once, to its ranks
                m = c + offs < hidden
                v = tl.load(x + t * hidden + c + offs, mask=m, other=0.0)
                if FP8:
                    q, scale = quantize_chunk(v, BLOCK, GROUP, QMAX, MIN_AMAX)
                for d in tl.static_range(WORLD):
                    if tl.sum((dest == d).to(tl.int32), 0) > 0:
                        if FP8:
                            gi = tl.arange(0, BLOCK // GROUP)
                            tl.store(_peer(ctx, landing8, d, deltas, SIM) + at * (2 * row) + c + offs, q, mask=m)
                            scales = _peer(ctx, landing_words, d, deltas, SIM) + at * (row // 2) + side_col // 2
                            tl.store(scales + c // GROUP + gi, scale.to(tl.int32, bitcast=True),
                                     mask=c + gi * GROUP < hidden)
                        else:
                            tl.store(_peer(ctx, landing, d, deltas, SIM) + at * row + c + offs, v, mask=m)
        for d in tl.static_range(WORLD):
            tl.store(_peer(ctx, landing_count, d, deltas, SIM) + half * WORLD + rank, T.to(tl.int64))
        tl.store(bad + pid, nbad.to(tl.int64))
        stamp(trace, 1, TRACE)
        s = _meet(ctx, DISPATCH_TILE0 + pid, PHASE)
        stamp(trace, 2, TRACE)
        if PHASE == 1:
            _announce(ctx, arrived, half, rank, call, deltas, WORLD, WB, SIM)
    if PHASE != 1:
        if PHASE == 2:
            s = _await_senders(ctx, arrived, half, call, WORLD, WB)
        cap = WORLD * max_tokens  # rows of an expert's block
        lo = rank * local_experts
        total = tl.zeros((), dtype=tl.int64)
        for q in tl.static_range(WORLD):
            # Clamped: whatever the word holds, nothing is read or written outside the buffers.
            tq = tl.minimum(tl.maximum(tl.load(landing_count + half * WORLD + q), 0), max_tokens)
            total += tq
            if pid == 0:
                tl.store(src_counts + q, tq)
            for t in range(pid, tq, grid):
                r = q * max_tokens + tl.cast(t, tl.int64)
                at = (half * WORLD + q) * max_tokens + t
                e = tl.load(landing_words + at * (row // 2) + meta + kk, mask=km, other=-1)
                w = tl.load(landing_words + at * (row // 2) + meta + K + kk, mask=km, other=0).to(tl.float32,
                                                                                                   bitcast=True)
                le = e - lo
                here = km & (e >= 0) & (le >= 0) & (le < local_experts)
                pos = tl.atomic_add(counters + tl.where(here, le, 0), 1, mask=here, sem="relaxed")
                fits = here & (pos < cap)
                to = tl.where(fits, le.to(tl.int64) * cap + pos, tl.where(here, NO_ROOM, -1))
                tl.store(slot + r * K + kk, to, mask=km)
                tl.store(weight + r * K + kk, w, mask=km)
                if tl.sum(fits.to(tl.int32), 0) > 0:
                    for c in range(0, copy_words, BLOCK):
                        m = c + offs < copy_words
                        v = tl.load(landing + at * row + c + offs, mask=m)
                        for j in tl.static_range(K):
                            tj = tl.sum(tl.where(kk == j, to, 0), 0)
                            tl.store(recv + tj * copy_words + c + offs, v, mask=m & (tj >= 0))
                    if SIDE_BLOCK > 0:  # an fp8 row's scales, beside it
                        so = tl.arange(0, SIDE_BLOCK)
                        sm = so < side_words
                        sv = tl.load(landing + at * row + side_col + so, mask=sm)
                        for j in tl.static_range(K):
                            tj = tl.sum(tl.where(kk == j, to, 0), 0)
                            tl.store(recv_side + tj * side_words + so, sv, mask=sm & (tj >= 0))
        if pid == 0:
            tl.store(received, total)
        stamp(trace, 3, TRACE)
        tl.store(calls + pid, call + 1)
        # Every CTA's counter adds are done (their results came back) before its arrival; the
        # last to arrive reads the counters, zeroing them, and the arrivals, for the next call.
        tl.debug_barrier()
        if tl.atomic_add(arrivals, 1, sem="acq_rel") == grid - 1:
            ll = tl.arange(0, LB)
            lm = ll < local_experts
            n = tl.atomic_xchg(counters + ll, 0, mask=lm)
            tl.store(expert_counts + ll, tl.minimum(n, cap).to(tl.int64), mask=lm)
            tl.store(expert_offsets + ll, ll.to(tl.int64) * cap, mask=lm)
            full = lm & (n > cap)
            if tl.sum(full.to(tl.int32), 0) > 0:  # the first expert past its block (moe.sort.SUMMARY)
                first = tl.min(tl.where(full, ll, LB), 0)
                tl.store(overflow, 1)
                tl.store(overflow + 1, lo + first)
                tl.store(overflow + 2, tl.sum(tl.where(ll == first, n, 0), 0).to(tl.int64))
                tl.store(overflow + 3, tl.sum(tl.where(lm, n, 0), 0).to(tl.int64))
            tl.atomic_xchg(arrivals, 0)
    stamp(trace, 4, TRACE)
    tl.store(status + pid, s)


@jit(do_not_specialize=["ctx", "T", "rank"])
def ll_combine(ctx, y, slot, weight, src_counts, own_ids, back, calls, out, T, rank, local_experts, max_tokens,
               hidden, deltas, status, trace, WORLD: tl.constexpr, K: tl.constexpr, KB: tl.constexpr,
               BLOCK: tl.constexpr, PHASE: tl.constexpr, SIM: tl.constexpr, TRACE: tl.constexpr = False):
    """Combine of the last dispatch (see the module docs): out [T, hidden] = per own token, in rank
    order, the rows the ranks it went to sent back. y: [local_experts * WORLD * max_tokens, hidden]
    in recv_x's layout; slot, weight, src_counts, own_ids as dispatch left them; back [2, WORLD,
    max_tokens, hidden] (heap). TRACE: stamps at the start (0), once the sums are sent (1), after
    the meeting (2) and at the end (3)."""
    stamp(trace, 0, TRACE)
    pid, grid = tl.program_id(0), tl.num_programs(0)
    call, half = _this_call(calls)
    kk = tl.arange(0, KB)
    km = kk < K
    offs = tl.arange(0, BLOCK)
    s = pid * 0
    if PHASE != 2:
        for q in tl.static_range(WORLD):
            tq = tl.load(src_counts + q)
            for t in range(pid, tq, grid):
                r = q * max_tokens + tl.cast(t, tl.int64)
                # A choice here gets its token a row, zeros if none fit (its source reads one).
                here = tl.load(slot + r * K + kk, mask=km, other=-1) != -1
                if tl.sum(here.to(tl.int32), 0) > 0:
                    dst = _peer(ctx, back, q, deltas, SIM) + ((half * WORLD + rank) * max_tokens + t) * hidden
                    for c in range(0, hidden, BLOCK):
                        acc = weighted_chunk(y, slot, weight, r, c, hidden, K, BLOCK)
                        tl.store(dst + c + offs, acc.to(back.dtype.element_ty), mask=c + offs < hidden)
        stamp(trace, 1, TRACE)
        s = _meet(ctx, COMBINE_TILE0 + pid, PHASE)
        stamp(trace, 2, TRACE)
    if PHASE != 1:
        for t0 in range(pid, T, grid):
            t = tl.cast(t0, tl.int64)
            e = tl.load(own_ids + t * K + kk, mask=km, other=-1)
            dest = tl.where(e >= 0, e // local_experts, -1)
            rows = back + half * WORLD * max_tokens * hidden  # this call's half
            for c in range(0, hidden, BLOCK):
                acc = sum_ranks_chunk(rows, dest, t, max_tokens, hidden, c, BLOCK, WORLD)
                tl.store(out + t * hidden + c + offs, acc.to(out.dtype.element_ty), mask=c + offs < hidden)
        tl.store(calls + pid, call + 1)
    stamp(trace, 3, TRACE)
    tl.store(status + pid, s)


__all__ = ["BLOCK", "COMBINE_TILE0", "DISPATCH_TILE0", "NO_ROOM", "WARPS", "ll_combine", "ll_dispatch"]
