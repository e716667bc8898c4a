"""Counting sorts on the GPU for MoeExchange (moe/exchange.py): which send row each token
takes (bucketed by destination rank) and which recv_x row each received choice takes (bucketed by
local expert). Stable: items keep their order (token, then choice) inside a bucket. Counts,
offsets and positions are written to device memory; nothing is read back to the host.

Each sort is three kernels over a fixed grid (`MoeExchange.sort_programs`), so a CUDA graph replays
them for any count, and their work follows the items there are, not the buffers' capacity (the
launch shape: MoeConfig's sort_programs, one_hot, scan_tile, scan_warps):
- `*_histogram`: program p counts the bucket of every item of its share (a contiguous run of
  rows, whole blocks of BR rows) into hist[p];
- `bucket_scan` (one program): per bucket its total and offset (exclusive scan over buckets), and
  base[p] = offset + the counts of programs before p; a summary (totals, overflow);
- `*_place`: program p walks its share block by block; an item's position is its bucket's
  running base plus the items of the same bucket before it in the block (a cumsum down a one-hot
  [items, buckets] matrix).
An item is a (row, choice) pair; its bucket is -1 when it is not one (padding, or not for this
sort).
"""

from __future__ import annotations

import triton
import triton.language as tl

# The summary bucket_scan writes (int64 each):
SUMMARY = ("over", "crossing", "crossing_count", "total", "extra")


def block_rows(choices_block: int, buckets_block: int, one_hot: int) -> int:
    """Rows per block, so a block's one-hot matrix holds at most `one_hot` elements
    (MoeConfig.one_hot)."""
    return max(1, one_hot // (choices_block * buckets_block))


def scan_programs(programs_block: int, buckets_block: int, scan_tile: int) -> int:
    """Programs' histograms per step of bucket_scan, at most `scan_tile` elements
    (MoeConfig.scan_tile)."""
    return max(1, min(programs_block, scan_tile // buckets_block))


@triton.jit
def _share(n, BR: tl.constexpr):
    """[start, end) of this program's rows: the n rows in contiguous shares of whole blocks."""
    per = tl.cdiv(tl.cdiv(n, tl.num_programs(0)), BR) * BR
    start = tl.program_id(0) * per
    return start, tl.minimum(start + per, n)


@triton.jit
def _received(counts, world, WB: tl.constexpr):
    """Rows received: the sum of an all_to_all_v's `world` receive counts (WB >= world)."""
    w = tl.arange(0, WB)
    return tl.sum(tl.load(counts + w, mask=w < world, other=0), axis=0).to(tl.int32)


@triton.jit
def _expert_keys(ids, stride, r0, end, lo, buckets, K: tl.constexpr, BR: tl.constexpr, KB: tl.constexpr):
    """[BR, KB]: the local expert (id - lo) of row r0 + i's choice j, -1 where that is not an
    item: a row past `end`, j >= K, or an id outside [lo, lo + buckets) (another rank's expert)."""
    r = r0 + tl.arange(0, BR)
    j = tl.arange(0, KB)
    m = (r[:, None] < end) & (j[None, :] < K)
    e = tl.load(ids + r[:, None].to(tl.int64) * stride + j[None, :], mask=m, other=0) - lo
    return tl.where(m & (e >= 0) & (e < buckets), e, -1)


@triton.jit
def _rank_keys(ids, r0, end, per_rank, world, K: tl.constexpr, BR: tl.constexpr, KB: tl.constexpr):
    """[BR, KB]: the rank (id // per_rank) token r0 + i's choice j goes to; `world` (the extra
    bucket) for an id outside [0, per_rank * world); -1 where that is not an item: a row past
    `end`, j >= K, or a rank an earlier choice of the token goes to (a token reaches a rank once)."""
    r = r0 + tl.arange(0, BR)
    j = tl.arange(0, KB)
    m = (r[:, None] < end) & (j[None, :] < K)
    # The range is checked on the id as given (int64 topk_idx: before narrowing, so an id past
    # 2^31 is out of range, not wrapped into it), as the pack kernels check it.
    e = tl.load(ids + r[:, None].to(tl.int64) * K + j[None, :], mask=m, other=0)
    d = tl.where((e >= 0) & (e < per_rank * world), e // per_rank, world).to(tl.int32)
    d = tl.where(m, d, -1)
    # [i, j, j2]: choice j2 < j of the same token has the same rank.
    earlier = (d[:, :, None] == d[:, None, :]) & (j[None, None, :] < j[None, :, None]) & (d[:, :, None] < world)
    return tl.where(tl.max(earlier.to(tl.int32), axis=2) > 0, -1, d)


@triton.jit
def _count_keys(d, BR: tl.constexpr, KB: tl.constexpr, BB: tl.constexpr):
    """[BB]: how many of the keys `d` ([BR, KB], -1: none) fall in each bucket."""
    flat = tl.reshape(d, (BR * KB,))
    return tl.sum((flat[:, None] == tl.arange(0, BB)[None, :]).to(tl.int32), axis=0)


@triton.jit
def _positions(d, run, BR: tl.constexpr, KB: tl.constexpr, BB: tl.constexpr):
    """([BR, KB] positions, run + the block's counts): item (i, j)'s position is run[its bucket]
    plus the items of its bucket before it in the block (row-major); undefined for d < 0."""
    flat = tl.reshape(d, (BR * KB,))
    hot = (flat[:, None] == tl.arange(0, BB)[None, :]).to(tl.int32)
    before = tl.cumsum(hot, axis=0) - hot + run[None, :]
    pos = tl.sum(before * hot, axis=1)
    return tl.reshape(pos, (BR, KB)), run + tl.sum(hot, axis=0)


@triton.jit
def _store_histogram(hist, counts, BB: tl.constexpr):
    tl.store(hist + tl.program_id(0) * BB + tl.arange(0, BB), counts)


@triton.jit
def rank_histogram(ids, n, per_rank, world, hist, K: tl.constexpr, BR: tl.constexpr, KB: tl.constexpr,
                   BB: tl.constexpr):
    """hist[p] = this program's tokens per destination rank (and out-of-range ids, bucket `world`)
    of topk_idx `ids` [n, K]."""
    start, end = _share(n, BR)
    counts = tl.zeros((BB,), dtype=tl.int32)
    for r0 in range(start, end, BR):
        counts += _count_keys(_rank_keys(ids, r0, end, per_rank, world, K, BR, KB), BR, KB, BB)
    _store_histogram(hist, counts, BB)


@triton.jit
def rank_place(ids, n, per_rank, world, base, send_row, K: tl.constexpr, BR: tl.constexpr, KB: tl.constexpr,
               BB: tl.constexpr, WB: tl.constexpr):
    """send_row[t, p] ([n, world] int64) = token t's row in the send buffer (rank-major, token
    order inside a rank), -1 if it does not go to rank p."""
    start, end = _share(n, BR)
    run = tl.load(base + tl.program_id(0) * BB + tl.arange(0, BB))
    w = tl.arange(0, WB)
    for r0 in range(start, end, BR):
        d = _rank_keys(ids, r0, end, per_rank, world, K, BR, KB)
        pos, run = _positions(d, run, BR, KB, BB)
        row = tl.max(tl.where(d[:, :, None] == w[None, None, :], pos[:, :, None], -1), axis=1)  # [BR, WB]
        r = r0 + tl.arange(0, BR)
        tl.store(send_row + r[:, None].to(tl.int64) * world + w[None, :], row.to(tl.int64),
                 mask=(r[:, None] < end) & (w[None, :] < world))


@triton.jit
def expert_histogram(ids, stride, recv_counts, world, lo, buckets, hist, received, WB: tl.constexpr,
                     K: tl.constexpr, BR: tl.constexpr, KB: tl.constexpr, BB: tl.constexpr):
    """hist[p] = this program's received choices per local expert; received[0] = rows received
    (program 0). `ids`: the received rows' expert ids (int32, `stride` apart)."""
    n = _received(recv_counts, world, WB)
    if tl.program_id(0) == 0:
        tl.store(received, n.to(tl.int64))
    start, end = _share(n, BR)
    counts = tl.zeros((BB,), dtype=tl.int32)
    for r0 in range(start, end, BR):
        counts += _count_keys(_expert_keys(ids, stride, r0, end, lo, buckets, K, BR, KB), BR, KB, BB)
    _store_histogram(hist, counts, BB)


@triton.jit
def expert_place(ids, stride, weights, recv_counts, world, lo, buckets, base, capacity, slot, weight, source,
                 WB: tl.constexpr, K: tl.constexpr, BR: tl.constexpr, KB: tl.constexpr, BB: tl.constexpr):
    """For received row r < n and choice j: slot[r, j] = its recv_x row (-1: not this rank's
    expert, or past `capacity`), weight[r, j] = its weight (fp32, from `weights`, `stride` apart
    like `ids`), source[slot] = r."""
    n = _received(recv_counts, world, WB)
    start, end = _share(n, BR)
    run = tl.load(base + tl.program_id(0) * BB + tl.arange(0, BB))
    j = tl.arange(0, KB)
    for r0 in range(start, end, BR):
        d = _expert_keys(ids, stride, r0, end, lo, buckets, K, BR, KB)
        pos, run = _positions(d, run, BR, KB, BB)
        keep = (d >= 0) & (pos < capacity)
        r = r0 + tl.arange(0, BR)
        m = (r[:, None] < end) & (j[None, :] < K)
        at = r[:, None].to(tl.int64) * K + j[None, :]
        tl.store(slot + at, tl.where(keep, pos, -1).to(tl.int64), mask=m)
        tl.store(weight + at, tl.load(weights + r[:, None].to(tl.int64) * stride + j[None, :], mask=m), mask=m)
        tl.store(source + pos, (r[:, None] + j[None, :] * 0).to(tl.int64), mask=m & keep)


@triton.jit
def bucket_scan(hist, programs, buckets, limit, lo, base, counts, offsets, summary, BB: tl.constexpr,
                PB: tl.constexpr):
    """From hist [programs, BB]: counts[b] and offsets[b] (int64, b < buckets; offsets exclusive
    over buckets), base[p, b] = offsets[b] + the counts of programs before p, and `summary`
    (int64, the names of SUMMARY): total > limit; the first bucket whose end passes limit
    (the last if none), plus `lo`; its count; the total over buckets; the count of the extra
    bucket `buckets` (0 unless the histogram has one: BB > buckets)."""
    b = tl.arange(0, BB)
    p = tl.arange(0, PB)
    total = tl.zeros((BB,), dtype=tl.int32)
    for p0 in range(0, programs, PB):
        total += tl.sum(tl.load(hist + (p0 + p)[:, None] * BB + b[None, :], mask=(p0 + p)[:, None] < programs,
                                other=0), axis=0)
    real = b < buckets
    counted = tl.where(real, total, 0)
    start = tl.cumsum(counted, axis=0) - counted
    run = start
    for p0 in range(0, programs, PB):
        at = (p0 + p)[:, None] * BB + b[None, :]
        h = tl.load(hist + at, mask=(p0 + p)[:, None] < programs, other=0)
        tl.store(base + at, tl.cumsum(h, axis=0) - h + run[None, :], mask=(p0 + p)[:, None] < programs)
        run += tl.sum(h, axis=0)
    tl.store(counts + b, counted.to(tl.int64), mask=real)
    tl.store(offsets + b, start.to(tl.int64), mask=real)
    all_items = tl.sum(counted, axis=0).to(tl.int64)
    crossing = tl.min(tl.where(real & (start + counted > limit), b, buckets - 1), axis=0)
    tl.store(summary, (all_items > limit).to(tl.int64))
    tl.store(summary + 1, (crossing + lo).to(tl.int64))
    tl.store(summary + 2, tl.sum(tl.where(b == crossing, counted, 0), axis=0).to(tl.int64))
    tl.store(summary + 3, all_items)
    tl.store(summary + 4, tl.sum(tl.where(b == buckets, total, 0), axis=0).to(tl.int64))


__all__ = ["SUMMARY", "block_rows", "bucket_scan", "expert_histogram", "expert_place", "rank_histogram", "rank_place",
           "scan_programs"]
