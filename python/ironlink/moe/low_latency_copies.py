"""The copies of the low-latency path's heap buffers (moe/low_latency_kernels.py, whose docs give
the protocol): `landing`, `back` and the count words come in COPIES, used by calls in turn. Here
is what a CTA does with them besides moving rows: which copy its call uses (`_this_call`), the
count word it sends every other rank each call and takes from each (`_send_count`,
`_take_count`: the rendezvous after which a copy is free again), and the emptying, a call later,
of what it read (`_empty_dispatch_reads`, `_empty_combine_reads`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..language import _abi
from ..language._flags import empty_like, wait_written
from .direct_kernels import _peer

# The detail a timed-out wait for a peer's data records: the wait for the peers that the tile
# signals of the other paths make.
_WAIT_OTHERS = tl.constexpr(list(_abi.FUNCTIONS).index("symm_tile_wait_others"))
MAX_CTAS = tl.constexpr(_abi.MAX_CTAS)
# landing, back and the count words come in COPIES, used by calls in turn (low_latency_kernels' docs).
COPIES = tl.constexpr(3)


@triton.jit
def _this_call(calls):
    """(this CTA's calls so far, the copy of the buffers this call uses, the copy the previous
    call used: calls take the COPIES in turn)."""
    call = tl.load(calls + tl.program_id(0))
    return call, (call % COPIES).to(tl.int64), ((call + COPIES - 1) % COPIES).to(tl.int64)


@triton.jit
def _count_word(words, copy, q, WORLD: tl.constexpr):
    """Word (copy, q, this CTA) of a [COPIES, WORLD, MAX_CTAS] buffer of int64 words, as the int32
    the kernels read and write (the low half)."""
    return words.to(tl.pointer_type(tl.int32)) + ((copy * WORLD + q) * MAX_CTAS + tl.program_id(0)) * 2


@triton.jit
def _send_count(ctx, words, copy, rank, n, deltas, WORLD: tl.constexpr, SIM: tl.constexpr):
    """`n` (>= 0: never empty) into word (copy, this rank, this CTA) of every other rank's `words`."""
    for d in tl.static_range(WORLD):
        if d != rank:
            tl.store(_peer(ctx, _count_word(words, copy, rank, WORLD), d, deltas, SIM), n.to(tl.int32))


@triton.jit
def _take_count(ctx, words, copy, q, failed, WORLD: tl.constexpr):
    """Rank q's word (copy, q, this CTA) of this rank's `words` once it has landed (emptied in the
    next call); (its value, status). `failed`: the CTA's status so far (no wait after a failure:
    `wait_written`)."""
    o = tl.arange(0, 2)
    got, s = wait_written(ctx, _count_word(words, copy, q, WORLD) + o, o < 1, _WAIT_OTHERS, failed)
    return tl.sum(tl.where(o < 1, got, 0), 0), s


@triton.jit
def _empty(at, mask, like):
    """The elements at `at` where `mask` made empty again (`like`: a block of their type)."""
    tl.store(at, empty_like(like), mask=mask)


@triton.jit
def _empty_count(words, copy, q, WORLD: tl.constexpr):
    """Word (copy, q, this CTA) of this rank's `words` made empty again."""
    o = tl.arange(0, 2)
    _empty(_count_word(words, copy, q, WORLD) + o, o < 1, o)


@triton.jit
def _empty_dispatch_reads(counts, words, data, seen, seen_rows, prev, q, max_tokens, hidden, row_words, row_elems,
                          meta_word, side_word, side_words, WORLD: tl.constexpr, K: tl.constexpr, KB: tl.constexpr,
                          BLOCK: tl.constexpr, SIDE_BLOCK: tl.constexpr):
    """What this CTA read from rank q in its previous call (copy `prev`) made empty again: q's
    count word, its tokens' ids and weights, and the rows (and fp8 scales) that came here."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    _empty_count(counts, prev, q, WORLD)
    kk = tl.arange(0, KB)
    offs = tl.arange(0, BLOCK)
    for t in range(pid, tl.load(seen + q * MAX_CTAS + pid), grid):
        at = (prev * WORLD + q) * max_tokens + t
        meta = words + at * row_words + meta_word
        _empty(meta + kk, kk < K, kk)
        _empty(meta + K + kk, kk < K, kk)
        if tl.load(seen_rows + q * max_tokens + t) != 0:
            for c in range(0, hidden, BLOCK):
                _empty(data + at * row_elems + c + offs, c + offs < hidden,
                       tl.zeros([BLOCK], dtype=data.dtype.element_ty))
            if SIDE_BLOCK > 0:
                so = tl.arange(0, SIDE_BLOCK)
                _empty(words + at * row_words + side_word + so, so < side_words, so)


@triton.jit
def _empty_combine_reads(back_counts, back, seen_tokens, seen_back, prev, last_parity, q, max_tokens, hidden,
                         WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """What this CTA read from rank q in its previous call (copy `prev`, call parity `last_parity`)
    made empty again: q's count word and the rows that came from it for this CTA's own tokens."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    _empty_count(back_counts, prev, q, WORLD)
    offs = tl.arange(0, BLOCK)
    for t in range(pid, tl.load(seen_tokens + pid), grid):
        if tl.load(seen_back + (last_parity * WORLD + q) * max_tokens + t) != 0:
            at = back + ((prev * WORLD + q) * max_tokens + t) * hidden
            for c in range(0, hidden, BLOCK):
                _empty(at + c + offs, c + offs < hidden, tl.zeros([BLOCK], dtype=back.dtype.element_ty))


__all__ = ["COPIES", "MAX_CTAS"]
