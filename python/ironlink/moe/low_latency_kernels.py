"""The Triton kernels of MoeExchange's low-latency path (one node, few tokens: decode), one launch
for dispatch and one for combine. Host side: moe/low_latency.py.

In both, CTA c of every rank handles the tokens t = c, c + grid, ... of every rank and exchanges
data only with the same-index CTA of each peer. Everything a peer reads moves as data that is its
own flag (Lamport's scheme, `language._flags`: the receive buffers hold "empty" until a sender
stores into them, and senders never store it, `unempty`; the reader polls the data itself, bounded
by the context's timeout, and stores empty back a call later). No signal, no fence, no barrier: a
row is read as it lands.

- `ll_dispatch`: send: this CTA's token count to every rank (a word per (copy, rank, CTA) of
  `counts`), then each of its tokens' ids and weights to every rank and its row once to every rank
  that holds one of its experts, into slot (this rank, token) of the destination's `landing`.
  Receive: for each rank, its count word, then per token its ids and weights; a token with a choice
  here takes, per such choice, the next row of its expert's block of recv_x (an atomic add on the
  expert's counter, so the order of rows within an expert varies run to run), and its row is
  copied there once it has landed. The last CTA to finish (a counter of arrivals) turns the
  experts' counters into expert_counts and zeroes them for the next call.
- `ll_combine`: send: for each landed token with a choice here, the weighted sum of its outputs
  here (`kernels.weighted_chunk`: fp32, choice order) rounded to the payload dtype, into slot (this
  rank, token) of its source's `back` buffer, then a word per (copy, rank, CTA) of the source's
  `back_counts`; receive: each own token's rows from the ranks it went to, added in rank order in
  fp32 as they land (the arithmetic of the other paths: the same bits, except that a partial sum
  of -0.0 travels as +0.0), then every rank's word.

`landing`, `back` and the count words have COPIES (3) copies, used by calls in turn (each CTA
counts its own calls in `calls`; the counts agree across ranks, which launch the same grid). What a
CTA read in call c is emptied in call c + 1, once it holds the peer's count word of call c + 1:
the peer sent that word after its kernel of call c ended, so none of that call's stores is still
in flight. Emptying right after reading is not safe: on 2 H100s a 128-byte line that the reader
had seen written landed again after its emptying store (weak stores of two GPUs to one address
are not ordered by the reader having seen one), leaving slots non-empty for a later call
(session 34, docs/record.md). A CTA writes copy c mod 3 at a peer in call c + 3 only after it read
the peer's count word of call c + 2, which the peer's same-index CTA wrote after its call c + 1
had emptied what it read in call c: the count words, sent every call whatever the routing, are the
rendezvous. `seen` / `seen_rows` (dispatch) and `seen_tokens` / `seen_back` (combine) hold what
each CTA read in its previous call: the token counts and which rows came.

PHASE 0 (the default) is send and receive in one launch. A dispatch whose receive is deferred
(`MoeExchange.dispatch(..., return_recv_hook=True)`) runs PHASE 1 (send) now and PHASE 2 (receive)
in a later launch, other kernels in between: the receive polls the same data.

SIM (tests only): peers are buffers of one process reached by adding `deltas[q]` bytes, and the
test runs PHASE 1 (send) on every rank, then PHASE 2 (receive, or sum) (`ctx`: a fake context, for
its timeout and error words).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..language import typed as ilt
from ..language._flags import unempty, wait_written
from ..language.jit import jit
from ..language.trace import stamp
from .direct_kernels import _peer
from .kernels import quantize_chunk, weighted_chunk
from .low_latency_copies import (MAX_CTAS, _WAIT_OTHERS, _empty_combine_reads, _empty_dispatch_reads, _send_count,
                                 _take_count, _this_call)

# slot of a choice here whose expert's block of recv_x was full (combine skips it as it skips
# -1, another rank's expert, but still sends the token's row: zeros where nothing fit).
NO_ROOM = tl.constexpr(-2)


@triton.jit
def _to(ctx, ptr, d, rank, deltas, SIM: tl.constexpr):
    """`ptr` as rank d's address, this rank's own for d == rank: rows a CTA leaves for itself are
    stored and loaded at one address (a peer mapping of its own memory would be a second one)."""
    p = ptr
    if d != rank:
        p = _peer(ctx, ptr, d, deltas, SIM)
    return p


@jit(do_not_specialize=["ctx", "T", "rank"])
def ll_dispatch(ctx, x, idx, wts, T, data, words, counts, recv, recv_side, slot, weight, own_ids, src_counts, received,
                calls, seen, seen_rows, counters, arrivals, expert_counts, expert_offsets, overflow, bad, rank,
                num_experts, local_experts, max_tokens, hidden, row, meta_word, side_word, side_words, deltas, status,
                trace, WORLD: tl.constexpr, K: tl.constexpr, KB: tl.constexpr, LB: tl.constexpr, BLOCK: tl.constexpr,
                SIDE_BLOCK: tl.constexpr, FP8: tl.constexpr, GROUP: tl.constexpr, QMAX: tl.constexpr,
                MIN_AMAX: tl.constexpr, PHASE: tl.constexpr, SIM: tl.constexpr, TRACE: tl.constexpr = False):
    """Dispatch of this rank's T tokens (x [T, hidden], idx / wts [T, K], contiguous; see the
    module docs). The heap's `landing` [COPIES, WORLD, max_tokens, row 2-byte words] seen as `data`
    (the payload's elements: bf16 / fp16, or the fp8 bytes, hidden of them from a row's start) and
    `words` (int32: the ids and weights from word meta_word, an fp8 row's side_words fp32 scales from
    word side_word); `counts` [COPIES, WORLD, MAX_CTAS] int64 (heap): the senders' token counts.
    All three hold "empty" where nothing is pending (made so, and emptied again a call after they
    were read); seen [WORLD, MAX_CTAS] and seen_rows [WORLD, max_tokens] int32 (zeroed when made):
    the tokens of each source this CTA read in its previous call, and which of their rows came. recv
    [local_experts * WORLD * max_tokens, hidden]: expert e's rows in its block (`data`'s element
    type), their number in expert_counts[e]; FP8: recv_side [same rows, side_words] int32, the
    scales' bits; slot / weight [WORLD * max_tokens, K]: row q * max_tokens + t of source q's token
    t, its recv row per choice (-1: not here, NO_ROOM: its block full) and weight; own_ids
    [max_tokens, K] int32: this rank's ids as sent (-1 out of range), for combine; src_counts
    [WORLD]: the tokens of each rank, received [1] their sum; expert_offsets: e * WORLD *
    max_tokens. counters [local_experts] int32 and arrivals [1] int32: zero between calls.
    overflow (moe.sort.SUMMARY): an expert whose rows did not fit; bad [grid]: this CTA's
    out-of-range ids among its own tokens. FP8: each token quantized per GROUP channels on its
    way out (kernels.quantize_chunk). TRACE: the global timer into `trace` [grid, TRACE_SLOTS] at
    the start (0), once the sends are issued (1), after the count words (2), after the copies into
    recv_x (3) and at the end (4) (bench/probes/moe_timeline.py)."""
    stamp(trace, 0, TRACE)
    pid, grid = tl.program_id(0), tl.num_programs(0)
    call, copy, prev = _this_call(calls)
    kk = tl.arange(0, KB)
    km = kk < K
    offs = tl.arange(0, BLOCK)
    row_words = row // 2
    row_elems = row  # a landing row in `data`'s elements
    if FP8:
        row_elems = row * 2
    s = pid * 0
    if PHASE != 2:
        _send_count(ctx, counts, copy, rank, T, deltas, WORLD, SIM)  # first: every receiver waits for it
        nbad = tl.zeros((), dtype=tl.int32)
        for t0 in range(pid, T, grid):
            t = tl.cast(t0, tl.int64)
            e = tl.load(idx + t * K + kk, mask=km, other=-1).to(tl.int32)
            ok = km & (e >= 0) & (e < num_experts)
            nbad += tl.sum((km & ~ok).to(tl.int32), 0)
            e = tl.where(ok, e, -1)  # never empty (the smallest int32)
            w = unempty(tl.load(wts + t * K + kk, mask=km, other=0.0).to(tl.float32))
            tl.store(own_ids + t * K + kk, e, mask=km)
            dest = tl.where(ok, e // local_experts, -1)
            at = (copy * WORLD + rank) * max_tokens + t  # the token's row in every rank's landing
            for d in tl.static_range(WORLD):  # the ids and weights to every rank
                meta = _to(ctx, words, d, rank, deltas, SIM) + at * row_words + meta_word
                tl.store(meta + kk, e, mask=km)
                tl.store(meta + K + kk, w.to(tl.int32, bitcast=True), mask=km)
            for c in range(0, hidden, BLOCK):  # the row, loaded (and quantized) once, to its ranks
                m = c + offs < hidden
                v = tl.load(x + t * hidden + c + offs, mask=m, other=0.0)
                if FP8:
                    q, scale = quantize_chunk(v, BLOCK, GROUP, QMAX, MIN_AMAX)
                    v = unempty(q)  # finite fp8 bytes travel as they are; scales are positive, never empty
                else:
                    v = unempty(v)
                for d in tl.static_range(WORLD):
                    if tl.sum((dest == d).to(tl.int32), 0) > 0:
                        tl.store(_to(ctx, data, d, rank, deltas, SIM) + at * row_elems + c + offs, v, mask=m)
                        if FP8:
                            gi = tl.arange(0, BLOCK // GROUP)
                            scales = _to(ctx, words, d, rank, deltas, SIM) + at * row_words + side_word
                            tl.store(scales + c // GROUP + gi, scale.to(tl.int32, bitcast=True),
                                     mask=c + gi * GROUP < hidden)
        tl.store(bad + pid, nbad.to(tl.int64))
        stamp(trace, 1, TRACE)
    if PHASE != 1:
        cap = WORLD * max_tokens  # rows of an expert's block
        lo = rank * local_experts
        total = tl.zeros((), dtype=tl.int64)
        # This CTA's own tokens' rows (i == 0) it stored itself, in this launch or an earlier one:
        # after the barrier, plain loads; they are never polled, so they are not emptied.
        tl.debug_barrier()
        # A loop, not unrolled over the ranks: its body once, whatever the world (unrolled, this
        # kernel took 2.3 / 7.4 / 37 s to compile at world 2 / 4 / 8: bench/probes/compile_time.py).
        for i in range(WORLD):
            q = (rank + i) % WORLD
            n = tl.cast(T, tl.int64)
            if i != 0:
                nq, sq = _take_count(ctx, counts, copy, q, s, WORLD)
                n = tl.cast(nq, tl.int64)
                s = ilt.failure_or(s, sq)
                if sq == 0:  # q's kernel of the previous call has ended (module docs)
                    _empty_dispatch_reads(counts, words, data, seen, seen_rows, prev, q, max_tokens, hidden,
                                          row_words, row_elems, meta_word, side_word, side_words, WORLD, K, KB,
                                          BLOCK, SIDE_BLOCK)
            # Clamped: whatever the word holds, nothing is read or written outside the buffers.
            tq = tl.minimum(tl.maximum(n, 0), max_tokens).to(tl.int64)
            if i != 0:
                tl.store(seen + q * MAX_CTAS + pid, tq.to(tl.int32))
            total += tq
            if pid == 0:
                tl.store(src_counts + q, tq)
            if i == WORLD - 1:
                stamp(trace, 2, TRACE)
            for t in range(pid, tq, grid):
                r = q * max_tokens + tl.cast(t, tl.int64)
                at = (copy * WORLD + q) * max_tokens + t
                meta = words + at * row_words + meta_word
                if i == 0:
                    e = tl.load(meta + kk, mask=km, other=-1)
                    wb = tl.load(meta + K + kk, mask=km, other=0)
                else:
                    e, se = wait_written(ctx, meta + kk, km, _WAIT_OTHERS, s)
                    wb, sw = wait_written(ctx, meta + K + kk, km, _WAIT_OTHERS, ilt.failure_or(s, se))
                    s = ilt.failure_or(s, ilt.failure_or(se, sw))
                w = wb.to(tl.float32, bitcast=True)
                le = e - lo
                here = km & (e >= 0) & (le >= 0) & (le < local_experts)
                pos = tl.atomic_add(counters + tl.where(here, le, 0), 1, mask=here, sem="relaxed")
                fits = here & (pos < cap)
                to = tl.where(fits, le.to(tl.int64) * cap + pos, tl.where(here, NO_ROOM, -1))
                tl.store(slot + r * K + kk, to, mask=km)
                tl.store(weight + r * K + kk, w, mask=km)
                came = tl.sum(here.to(tl.int32), 0) > 0  # the row came here: taken, even where nothing fits
                if i != 0:
                    tl.store(seen_rows + q * max_tokens + t, came.to(tl.int32))
                if came:
                    for c in range(0, hidden, BLOCK):
                        m = c + offs < hidden
                        if i == 0:
                            v = tl.load(data + at * row_elems + c + offs, mask=m)
                        else:
                            v, sd = wait_written(ctx, data + at * row_elems + c + offs, m, _WAIT_OTHERS, s)
                            s = ilt.failure_or(s, sd)
                        for j in tl.static_range(K):
                            tj = tl.sum(tl.where(kk == j, to, 0), 0)
                            tl.store(recv + tj * hidden + c + offs, v, mask=m & (tj >= 0))
                    if SIDE_BLOCK > 0:  # an fp8 row's scales, beside it
                        so = tl.arange(0, SIDE_BLOCK)
                        sm = so < side_words
                        if i == 0:
                            sv = tl.load(words + at * row_words + side_word + so, mask=sm)
                        else:
                            sv, ss = wait_written(ctx, words + at * row_words + side_word + so, sm, _WAIT_OTHERS,
                                                  s)
                            s = ilt.failure_or(s, ss)
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
            cn = tl.atomic_xchg(counters + ll, 0, mask=lm)
            tl.store(expert_counts + ll, tl.minimum(cn, cap).to(tl.int64), mask=lm)
            tl.store(expert_offsets + ll, ll.to(tl.int64) * cap, mask=lm)
            full = lm & (cn > cap)
            if tl.sum(full.to(tl.int32), 0) > 0:  # the first expert past its block (moe.sort.SUMMARY)
                first = tl.min(tl.where(full, ll, LB), 0)
                tl.store(overflow, 1)
                tl.store(overflow + 1, lo + first)
                tl.store(overflow + 2, tl.sum(tl.where(ll == first, cn, 0), 0).to(tl.int64))
                tl.store(overflow + 3, tl.sum(tl.where(lm, cn, 0), 0).to(tl.int64))
            tl.atomic_xchg(arrivals, 0)
    stamp(trace, 4, TRACE)
    tl.store(status + pid, s)


@jit(do_not_specialize=["ctx", "T", "rank"])
def ll_combine(ctx, y, slot, weight, src_counts, own_ids, back, back_counts, calls, seen_tokens, seen_back, out, T,
               rank, local_experts, max_tokens, hidden, deltas, status, trace, WORLD: tl.constexpr, K: tl.constexpr,
               KB: tl.constexpr, BLOCK: tl.constexpr, PHASE: tl.constexpr, SIM: tl.constexpr,
               TRACE: tl.constexpr = False):
    """Combine of the last dispatch (see the module docs): out [T, hidden] = per own token, in rank
    order, the rows the ranks it went to sent back. y: [local_experts * WORLD * max_tokens, hidden]
    in recv_x's layout; slot, weight, src_counts, own_ids as dispatch left them; back [COPIES,
    WORLD, max_tokens, hidden] and back_counts [COPIES, WORLD, MAX_CTAS] int64 (heap, "empty" where
    nothing is pending); seen_tokens [MAX_CTAS] and seen_back [2, WORLD, max_tokens] int32 (zeroed
    when made): this CTA's T in its previous call, and per call parity which rows came. TRACE:
    stamps at the start (0), once the sums are sent (1), after the own tokens' sums (2) and at the
    end (3)."""
    stamp(trace, 0, TRACE)
    pid, grid = tl.program_id(0), tl.num_programs(0)
    call, copy, prev = _this_call(calls)
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
                    dst = _to(ctx, back, q, rank, deltas, SIM) + ((copy * WORLD + rank) * max_tokens + t) * hidden
                    for c in range(0, hidden, BLOCK):
                        acc = weighted_chunk(y, slot, weight, r, c, hidden, K, BLOCK)
                        tl.store(dst + c + offs, unempty(acc.to(back.dtype.element_ty)), mask=c + offs < hidden)
        _send_count(ctx, back_counts, copy, rank, tl.load(src_counts + rank), deltas, WORLD, SIM)
        stamp(trace, 1, TRACE)
    if PHASE != 1:
        tl.debug_barrier()  # this CTA's sums for its own tokens are stored
        parity = (call % 2).to(tl.int64)
        for t0 in range(pid, T, grid):
            t = tl.cast(t0, tl.int64)
            e = tl.load(own_ids + t * K + kk, mask=km, other=-1)
            dest = tl.where(e >= 0, e // local_experts, -1)
            for p in tl.static_range(WORLD):
                if p != rank:
                    came = (tl.sum((dest == p).to(tl.int32), 0) > 0).to(tl.int32)
                    tl.store(seen_back + (parity * WORLD + p) * max_tokens + t, came)
            for c in range(0, hidden, BLOCK):
                m = c + offs < hidden
                # kernels' sum_ranks_chunk as the rows land: fp32, rank order, 0.0 for a rank
                # the token did not go to.
                acc = tl.zeros([BLOCK], dtype=tl.float32)
                for p in tl.static_range(WORLD):
                    at = back + ((copy * WORLD + p) * max_tokens + t) * hidden + c + offs
                    if tl.sum((dest == p).to(tl.int32), 0) > 0:
                        if p == rank:  # this CTA's own sum (before the barrier): never polled
                            v = tl.load(at, mask=m, other=0.0)
                        else:
                            v, sv = wait_written(ctx, at, m, _WAIT_OTHERS, s)
                            s = ilt.failure_or(s, sv)
                        acc += tl.where(m, v.to(tl.float32), 0.0)
                tl.store(out + t * hidden + c + offs, acc.to(out.dtype.element_ty), mask=m)
        stamp(trace, 2, TRACE)
        for q in tl.static_range(WORLD):  # the rendezvous: every other rank's CTA sent what it will send
            if q != rank:
                _, sq = _take_count(ctx, back_counts, copy, q, s, WORLD)
                s = ilt.failure_or(s, sq)
                if sq == 0:  # q's kernel of the previous call has ended (module docs)
                    _empty_combine_reads(back_counts, back, seen_tokens, seen_back, prev, 1 - parity, q,
                                         max_tokens, hidden, WORLD, BLOCK)
        tl.store(seen_tokens + pid, T)
        tl.store(calls + pid, call + 1)
    stamp(trace, 3, TRACE)
    tl.store(status + pid, s)


__all__ = ["NO_ROOM", "ll_combine", "ll_dispatch"]
