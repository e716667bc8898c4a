"""The Triton kernels of MoeExchange's direct path (one node: every peer's heap is mapped, so a
kernel reads and writes it through `ilt.peer_pointer`). Host side: moe/direct.py.

Dispatch moves each token row over NVLink once per rank that holds one of its experts and writes
it straight into its expert-major rows there; combine reduces on the expert's rank and writes one
row per (token, rank) straight into the token's rank:

- `gather_meta` (after a barrier): copies every rank's token count and the expert ids and weights
  of its staged tokens into this rank's `meta`, sources in rank order (small: 2 * topk words a
  token), for the counting sort by local expert (moe.sort) that gives each (token, choice) its
  row of recv_x;
- `pull_rows`: for each source token with a choice here, loads its row ONCE from the source's
  stage (a peer load) and stores it into every recv_x row its choices here take (the expert-major
  copy that gather_rows did after the exchange, fused into it), then a barrier, so no source
  restages before every rank has read it;
- `reduce_push` (after a barrier: no rank still reads `back`): for each source token with a
  choice here, the weighted sum (fp32, choice order) of its expert outputs here, rounded to the
  payload dtype and stored into row (this rank, token) of the source's `back` buffer (a peer
  store), then a barrier, after which every row a source will read has landed;
- `sum_partials` (local): each token's rows in `back` from the ranks it went to (its ids as
  staged, from `meta`), added in rank order in fp32.
The arithmetic of combine is that of the relay path (moe/relay_kernels.py: weighted_partial_sums,
sum_rank_rows), so both give the same bits.

SIM (tests only): peers are buffers of one process, reached by adding `deltas[q]` bytes, and the
barriers are the test's own phase order; the kernels then run in Triton's interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import language as il
from ..language import typed as ilt
from ..language.jit import jit
from .kernels import weighted_chunk

# gather_meta's table of sources, int64 words per rank: bytes from this rank's stage to its token
# rows, bytes between them, its first row of meta, its token count.
SOURCE_WORDS = tl.constexpr(4)


@triton.jit(do_not_specialize=["t", "offset", "row_bytes"])
def write_header(tokens, t, offset, row_bytes):
    """This rank's `tokens` words (heap, 3 int64): its token count, and where its token rows are
    (bytes from its stage, bytes between rows), which gather_meta copies to every rank; one launch,
    where a fill_ would write only the count."""
    w = tl.arange(0, 4)
    v = tl.where(w == 0, t.to(tl.int64), tl.where(w == 1, offset.to(tl.int64), row_bytes.to(tl.int64)))
    tl.store(tokens + w, v, mask=w < 3)


@triton.jit
def _peer(ctx, ptr, q, deltas, SIM: tl.constexpr):
    """`ptr` (into the heap) as rank q's address of the same element."""
    if SIM:
        p = (ptr.to(tl.pointer_type(tl.int8)) + tl.load(deltas + q)).to(ptr.dtype)
    else:
        p = ilt.peer_pointer(ctx, ptr, q)
    return p


@triton.jit
def _barrier(ctx, status, SIM: tl.constexpr):
    """symm_barrier (the same-index CTA of every rank; this CTA's stores, peer stores included,
    visible to them after it); simulated, where the test orders the phases itself, the status
    word this CTA left (0; a test writes a failure there to make the barrier fail, and a failure
    stays, as a recorded one makes every later wait give up on GPUs)."""
    if SIM:
        s = tl.load(status + tl.program_id(0))
    else:
        s = il.symm_barrier(ctx)
    return s


@triton.jit
def _source_counts(src_counts, WORLD: tl.constexpr, WB: tl.constexpr):
    """[WB] int64: the tokens each rank staged (ranks past WORLD count 0); meta holds them in rank
    order."""
    w = tl.arange(0, WB)
    return tl.load(src_counts + w, mask=w < WORLD, other=0)


@jit(do_not_specialize=["ctx", "rank"])
def gather_meta(ctx, stage_words, tokens, rank, row_words, meta_word, max_tokens, meta, src_counts, src_rows, bad,
                deltas, status, WORLD: tl.constexpr, K: tl.constexpr, MB: tl.constexpr, BR: tl.constexpr,
                SIM: tl.constexpr):
    """After a barrier (every rank's stage and token count complete): src_counts[q] = rank q's
    staged tokens (clamped to [0, max_tokens]); src_rows[q] = what pull_rows needs of source q
    (SOURCE_WORDS int64: the bytes from this rank's stage to q's token rows and between them, from
    q's `tokens` words 1 and 2, see `DirectPath.stage_tokens`; q's first row of meta; its token
    count); meta rows (sources in rank order) = their 2K words of ids (int32; -1 for an id the
    sender found out of range) and weights (fp32 bits), read from word `meta_word` of each stage
    row (`row_words` 4-byte words apart); bad[program] = the -1 ids among this rank's own tokens
    that this program copied (their sum is what check reports). A CTA whose barrier failed
    (TIMEOUT, HEAP_ASYMMETRIC) reads no peer: it takes every rank's count as 0, so no row moves
    after it (all of them fail alike on an asymmetric heap: dispatch and combine move nothing)."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    s = _barrier(ctx, status, SIM)
    j = tl.arange(0, MB)
    i = tl.arange(0, BR)
    base = tl.zeros((), dtype=tl.int64)
    nbad = tl.zeros((), dtype=tl.int32)
    for q in tl.static_range(WORLD):
        # Clamped: whatever a peer's word holds, meta is written inside its rows.
        at_q = _peer(ctx, tokens, q, deltas, SIM)
        tq = tl.minimum(tl.maximum(tl.load(at_q, mask=s == 0, other=0), 0), max_tokens)
        if pid == 0:
            tl.store(src_counts + q, tq)
            w = tl.arange(0, SOURCE_WORDS)
            rows_at = tl.load(at_q + 1 + w, mask=w < 2, other=0)  # (bytes from q's stage, between rows)
            rows_at += tl.where(w == 0, _stage_distance(ctx, stage_words, q, deltas, SIM), 0)
            tl.store(src_rows + SOURCE_WORDS * q + w, tl.where(w == 2, base, tl.where(w == 3, tq, rows_at)))
        src = _peer(ctx, stage_words, q, deltas, SIM)
        for r0 in range(pid * BR, tq, grid * BR):
            r = r0 + i.to(tl.int64)
            m = (r[:, None] < tq) & (j[None, :] < 2 * K)
            v = tl.load(src + r[:, None] * row_words + meta_word + j[None, :], mask=m, other=0)
            tl.store(meta + (base + r)[:, None] * (2 * K) + j[None, :], v, mask=m)
            own = m & (j[None, :] < K) & (v == -1) & (rank == q)
            nbad += tl.sum(tl.sum(own.to(tl.int32), 1), 0)
        base += tq
    tl.store(bad + pid, nbad.to(tl.int64))
    tl.store(status + pid, s)


@triton.jit
def _stage_distance(ctx, stage, q, deltas, SIM: tl.constexpr):
    """The bytes from this rank's `stage` to rank q's (a multiple of 256: the heaps' bases are
    allocation bases)."""
    if SIM:
        d = tl.load(deltas + q)
    else:
        d = (il.symm_peer_ptr(ctx, stage, q) - stage.to(tl.int64)) // 256 * 256
    return d


@triton.jit
def _interleaved(step, t, WORLD: tl.constexpr):
    """The source whose token t (int64, scalar or [ROWS]) a CTA takes at `step` of its loop over
    meta: q = (t + step) % WORLD. Over the WORLD steps of a block (t fixed) t visits every
    source once, and at any step a grid's tokens are spread evenly over the sources. meta's rows
    are in source order; walked in that order, a rank would copy its own tokens with NVLink idle,
    then move the peers' over NVLink with HBM nearly idle. Interleaved, the two overlap."""
    return (t + step) % WORLD


@triton.jit
def _source_entry(src_rows, q):
    """Source q's entry of gather_meta's table `src_rows` (SOURCE_WORDS int64; q a scalar or
    [ROWS]). Its words are loaded per step: nothing per source stays live in registers across a
    loop."""
    return src_rows + SOURCE_WORDS * q


@triton.jit
def _source_row(at, t):
    """(row of meta, whether the source staged it) of token t (int64, scalar or [ROWS]) of the
    source whose table entry is `at` (`_source_entry`)."""
    return tl.load(at + 2) + t, t < tl.load(at + 3)


@triton.jit
def _pull_sources(slot, src_rows, q, t, K: tl.constexpr, KB: tl.constexpr):
    """For token t of source q ([ROWS] int64 each): its row of meta, whether source q staged it
    and it has a choice here, and the bytes from this rank's `stage` to its token row at q
    (anything where it has none), from gather_meta's table `src_rows`."""
    at = _source_entry(src_rows, q)
    r, staged = _source_row(at, t)
    jj = tl.arange(0, KB)
    mine = tl.load(slot + r[:, None] * K + jj[None, :], mask=(jj[None, :] < K) & staged[:, None], other=-1)
    to_row = tl.load(at) + t * tl.load(at + 1)
    return r, staged & (tl.max(mine, 1) >= 0), tl.multiple_of(to_row, 16)


@triton.jit
def _store_choices(out, slot, r, has, v, cols, c, m, K: tl.constexpr, N: tl.constexpr):
    """out[slot[r, j], c : c + N] = v ([ROWS, N]) for each choice j of each row r ([ROWS]) that
    `has` and is here (slot >= 0)."""
    offs = tl.arange(0, N)
    for j in tl.static_range(K):
        sj = tl.load(slot + r * K + j, mask=has, other=-1)
        tl.store(out + sj[:, None] * cols + c + offs[None, :], v, mask=m & (sj >= 0)[:, None])


@jit(do_not_specialize=["ctx"])
def pull_rows(ctx, stage, src_counts, src_rows, slot, hidden_words, recv, side_col, side_out, side_cols, deltas,
              status, WORLD: tl.constexpr, WB: tl.constexpr, K: tl.constexpr, KB: tl.constexpr,
              BLOCK: tl.constexpr, SIDE_BLOCK: tl.constexpr, ROWS: tl.constexpr, SIM: tl.constexpr):
    """For every row r of meta (source q's token t) with a choice here (slot[r, j] >= 0, K per
    row): recv[slot[r, j], :hidden_words] = q's token row t (loaded once, stored per choice; where
    gather_meta's table src_rows says: its stage row, or its x in place),
    with SIDE_BLOCK > 0 also side_out[slot, :side_cols] = its words from side_col (an fp8
    dispatch's scales). Rows in 2-byte words; ROWS rows loaded at once per CTA (a peer load
    waits a NVLink round trip: one row per CTA at a time leaves the link idle on a small grid),
    the sources interleaved (`_interleaved`). Then a barrier: once every rank has passed it, no
    rank reads a stage any more."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    most = tl.max(_source_counts(src_counts, WORLD, WB), 0)
    base = stage.to(tl.pointer_type(tl.int8))
    offs = tl.arange(0, BLOCK)
    units = grid.to(tl.int64) * ROWS  # tokens of each source per block of WORLD steps
    lanes = pid * ROWS + tl.arange(0, ROWS).to(tl.int64)
    for step in range(0, tl.cdiv(most, units) * WORLD):
        t = (step // WORLD) * units + lanes
        r, has, to_row = _pull_sources(slot, src_rows, _interleaved(step, t, WORLD), t, K, KB)
        src = (base + to_row).to(stage.dtype)  # [ROWS] pointers to the rows at their sources
        for c in range(0, hidden_words, BLOCK):
            m = (c + offs < hidden_words)[None, :]
            v = tl.load(src[:, None] + c + offs[None, :], mask=m & has[:, None])
            _store_choices(recv, slot, r, has, v, hidden_words, c, m, K, BLOCK)
        if SIDE_BLOCK > 0:
            so = tl.arange(0, SIDE_BLOCK)
            sm = (so < side_cols)[None, :]
            sv = tl.load(src[:, None] + side_col + so[None, :], mask=sm & has[:, None])
            _store_choices(side_out, slot, r, has, sv, side_cols, 0, sm, K, SIDE_BLOCK)
    tl.store(status + pid, _barrier(ctx, status, SIM))


@jit(do_not_specialize=["ctx", "rank", "lo"])
def reduce_push(ctx, y, meta, slot, weight, src_counts, src_rows, back, rank, lo, local_experts, max_tokens, hidden,
                deltas, status, WORLD: tl.constexpr, WB: tl.constexpr, K: tl.constexpr, KB: tl.constexpr,
                BLOCK: tl.constexpr, SIM: tl.constexpr):
    """For every row r of meta (source q's token t) with an expert id in [lo, lo + local_experts):
    row rank * max_tokens + t of q's `back` = sum over j < K (in order) of weight[r, j] *
    y[slot[r, j]] in fp32, skipping slot < 0 (another rank's expert, or past recv_capacity: such
    a token still gets its row, zeros if nothing of it is here), rounded to back's dtype.
    The sources interleaved (`_interleaved`), between two barriers: the first keeps this
    combine's stores out of `back` until every rank has finished reading the last combine's (a
    combine repeated on one handle has no dispatch in between), the second makes them visible to
    their ranks. A CTA whose first barrier failed stores nothing into the peers."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    first = _barrier(ctx, status, SIM)
    tl.store(status + pid, first)  # kept there, not in a register over the loop (it spilled on sm_100)
    most = tl.where(first == 0, tl.max(_source_counts(src_counts, WORLD, WB), 0), 0)
    offs = tl.arange(0, BLOCK)
    jj = tl.arange(0, KB)
    for step in range(0, tl.cdiv(most, grid) * WORLD):
        t = (step // WORLD) * grid + pid.to(tl.int64)
        q = _interleaved(step, t, WORLD)
        r, staged = _source_row(_source_entry(src_rows, q), t)
        ids = tl.load(meta + r * (2 * K) + jj, mask=(jj < K) & staged, other=-1)
        here = tl.sum(((ids >= lo) & (ids < lo + local_experts)).to(tl.int32), 0)
        if here > 0:
            dst = _peer(ctx, back, q, deltas, SIM) + (rank * max_tokens + t) * hidden
            for c in range(0, hidden, BLOCK):
                acc = weighted_chunk(y, slot, weight, r, c, hidden, K, BLOCK)
                tl.store(dst + c + offs, acc.to(back.dtype.element_ty), mask=c + offs < hidden)
    second = _barrier(ctx, status, SIM)
    tl.store(status + pid, ilt.failure_or(tl.load(status + pid), second))


@triton.jit
def sum_ranks_chunk(back, dest, t, max_tokens, hidden, c, BLOCK: tl.constexpr, WORLD: tl.constexpr):
    """fp32 [BLOCK]: columns c.. of token t's rows of `back` [WORLD, max_tokens, hidden] from the
    ranks in `dest` (its choices' ranks; -1: none), added in rank order: the last sum of combine
    on the direct and the low-latency path, written once so both give its bits."""
    offs = tl.arange(0, BLOCK)
    m = c + offs < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(WORLD):
        went = tl.sum((dest == p).to(tl.int32), 0) > 0
        acc += tl.load(back + (p * max_tokens + t) * hidden + c + offs, mask=m & went, other=0.0).to(tl.float32)
    return acc


@triton.jit
def sum_partials(back, meta, src_rows, rank, out, max_tokens, hidden, local_experts, WORLD: tl.constexpr,
                 K: tl.constexpr, KB: tl.constexpr, BLOCK: tl.constexpr):
    """out[t] = sum over ranks p (in order) of back[p * max_tokens + t] in fp32, over the ranks
    token t's valid ids go to (read from this rank's own rows of `meta`, found through
    gather_meta's table `src_rows` as pull_rows and reduce_push find them: the ids as staged, -1
    for an out-of-range one; not the caller's topk_idx, which may hold the next routing by now).
    Grid-strided over this rank's tokens."""
    own = _source_entry(src_rows, rank)
    offs = tl.arange(0, BLOCK)
    jj = tl.arange(0, KB)
    for t in range(tl.program_id(0).to(tl.int64), tl.load(own + 3), tl.num_programs(0)):
        r, _ = _source_row(own, t)
        e = tl.load(meta + r * (2 * K) + jj, mask=jj < K, other=-1)
        dest = tl.where(e >= 0, e // local_experts, -1)
        for c in range(0, hidden, BLOCK):
            acc = sum_ranks_chunk(back, dest, t, max_tokens, hidden, c, BLOCK, WORLD)
            tl.store(out + t * hidden + c + offs, acc.to(out.dtype.element_ty), mask=c + offs < hidden)


__all__ = ["SOURCE_WORDS", "gather_meta", "pull_rows", "reduce_push", "sum_partials", "sum_ranks_chunk", "write_header"]
