"""all_reduce_rmsnorm's kernels: one for a heap of one node, whose constexprs pick the mode
(`all_reduce_rmsnorm_exchanges` says what each does), and one for a heap of several nodes over the
hierarchical all-reduces, linked with the NVSHMEM bitcode."""

from __future__ import annotations

import triton.language as tl

from .. import language as il
from ..language import typed as ilt
from ..language.jit import jit
from ..language.pdl import allow_next_kernel, wait_for_previous_kernel
from ..language.slots import PEERS, peer_distances
from ..language.trace import stamp
from .all_reduce_rmsnorm_exchanges import lamport_rows, push_pipelined, split_row
from .all_reduce_rmsnorm_two_shot import push_two_shot, two_shot_rows
from .all_reduce_rmsnorm_norm import norm_after_grid_barrier, norm_row, norm_values


@jit(do_not_specialize=["ctx", "T", "eps"])
def allreduce_rmsnorm_kernel(ctx, x, residual, residual_out, weight, out, scale, T, H, eps, status, trace, ws, epochs,
                             inbox, half,
                             WHOLE: tl.constexpr, BLOCK_H: tl.constexpr, FP8: tl.constexpr = False,
                             PDL: tl.constexpr = False, PRELOAD: tl.constexpr = True, TRACE: tl.constexpr = False,
                             ROWS: tl.constexpr = 1, PUSH: tl.constexpr = False, WORLD: tl.constexpr = 2,
                             SPLIT: tl.constexpr = False, PARTS: tl.constexpr = 1, W=0,
                             LAMPORT: tl.constexpr = False, TWO_SHOT: tl.constexpr = False,
                             PUSH_TWO_SHOT: tl.constexpr = False, BLOCK_C: tl.constexpr = 16):
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
    (with LAMPORT): mode "two_shot" (module docs), `inbox` its slots, chunks of W columns, BLOCK_H a
    power of two >= W, PARTS slices a row (more than one: `ws` the slices' words, as for SPLIT).
    PUSH_TWO_SHOT: mode "push_two_shot" (module docs), `ws` its slots, `epochs` as for PUSH, ranks'
    chunks of W columns, BLOCK_C a power of two >= W, ROWS rows a step.
    `half`: the elements of one half of the mode's slots (the push modes' `ws`, the others'
    `inbox`), which alternate launches use in turn (`language.slots.launch_slots`). PRELOAD (rows,
    push): the weight and the CTA's first residual rows are loaded before the all-reduce, so their
    latency hides behind it. TRACE: the global timer at the start, after the wait for the previous
    kernel, after the all-reduce and at the end (`language/trace.py`;
    bench/probes/rmsnorm_timeline.py)."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    stamp(trace, 0, TRACE)
    # The rank and the peers' addresses come from the context, which no kernel writes: read
    # before the wait, their chain of dependent loads overlaps the previous kernel.
    rank = pid * 0
    dists = tl.zeros([PEERS], dtype=tl.int64)
    if PUSH or LAMPORT or PUSH_TWO_SHOT:
        rank = il.symm_rank(ctx)
    if LAMPORT:
        dists = peer_distances(ctx, inbox, rank, WORLD)
    # Anything else we read may be the previous kernel's output (x, the residual, the weight, the
    # heap's counters and LL boxes, the status buffer): wait first. The next kernel waits for our
    # completion before it touches memory, so it may start at once.
    wait_for_previous_kernel(PDL)
    allow_next_kernel(PDL)
    stamp(trace, 1, TRACE)
    per = tl.cdiv(T, grid)  # rows, the push modes, lamport: this CTA's block of rows
    r0 = pid * per
    r1 = tl.minimum(T, r0 + per)
    if SPLIT:
        s = split_row(ctx, x, residual, residual_out, weight, out, scale, T, H, eps, ws, epochs, inbox, half, W,
                       trace, rank, dists, BLOCK_H, PARTS, FP8, TRACE, LAMPORT, WORLD)
    elif WHOLE:
        s = ilt.all_reduce(ctx, x, T * H)
        stamp(trace, 2, TRACE)
        s = norm_after_grid_barrier(s, ctx, x, residual, residual_out, weight, out, scale, T, H, eps, BLOCK_H, FP8)
    elif TWO_SHOT:
        s = two_shot_rows(ctx, x, residual, residual_out, weight, out, scale, ws, inbox, half, epochs, T, H, W, eps,
                           rank, dists, trace, BLOCK_H, PARTS, WORLD, FP8, TRACE)  # stamps slot 2 itself
    elif LAMPORT:
        s = lamport_rows(ctx, x, residual, residual_out, weight, out, scale, inbox, half, epochs, r0, r1, T, H, eps,
                          rank, dists, BLOCK_H, ROWS, WORLD, FP8)
        stamp(trace, 2, TRACE)
    elif PUSH_TWO_SHOT:
        s = push_two_shot(ctx, x, residual, residual_out, weight, out, scale, ws, half, epochs, r0, r1, T, H, W, eps,
                          rank, BLOCK_H, BLOCK_C, ROWS, WORLD, FP8)
        stamp(trace, 2, TRACE)
    elif PUSH:
        s = push_pipelined(ctx, x, residual, residual_out, weight, out, scale, ws, half, epochs, r0, r1, T, H, eps,
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
            norm_values(x, res, w, residual_out, out, scale, block, valid, H, eps, BLOCK_H, FP8)
    stamp(trace, 3, TRACE)
    tl.store(status + pid, s)


# A heap of several nodes: the same over the hierarchical all-reduces, linked with the NVSHMEM bitcode.
@jit(do_not_specialize=["ctx", "T", "eps"], nvshmem=True, several_nodes=True)
def allreduce_rmsnorm_hierarchical_kernel(ctx, x, residual, residual_out, weight, out, scale, T, H, eps, status,
                                          WHOLE: tl.constexpr, BLOCK_H: tl.constexpr, FP8: tl.constexpr = False):
    pid, grid = tl.program_id(0), tl.num_programs(0)
    if WHOLE:
        s = ilt.all_reduce(ctx, x, T * H)
        s = norm_after_grid_barrier(s, ctx, x, residual, residual_out, weight, out, scale, T, H, eps, BLOCK_H, FP8)
    else:
        per = tl.cdiv(T, grid)
        r0 = pid * per
        r1 = tl.minimum(T, r0 + per)
        s = ilt.tile_all_reduce(ctx, x + r0.to(tl.int64) * H, tl.maximum(r1 - r0, 0), H, H, pid)
        for row in range(r0, r1):
            norm_row(x, residual, residual_out, weight, out, scale, row, H, eps, BLOCK_H, FP8)
    tl.store(status + pid, s)


__all__ = ["allreduce_rmsnorm_hierarchical_kernel", "allreduce_rmsnorm_kernel"]
