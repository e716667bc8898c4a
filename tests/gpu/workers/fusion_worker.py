"""GPU suite of the fusion calls (run under torchrun by `tests/gpu/run.sh fusion`).

- A kernel whose CTAs each produce a slice of a tensor, pass `symm_grid_barrier`, and all-reduce
  the whole tensor in the same launch (every all-reduce algorithm, forced through the limits).
- A persistent kernel that computes the tiles of a 2-D matrix (rows `stride` elements apart,
  edge tiles partial) and all-reduces each with `symm_tile_all_reduce` as soon as it is written;
  rank r runs tile t on CTA (t + r) % grid, so only matching by tile index pairs them.
- The same for tile all-gather (stacked blocks) and tile reduce-scatter, and push-as-produced
  around a ring (symm_tile_put, stores through peer pointers + symm_tile_signal, symm_tile_wait).
- Back-to-back launches and a CUDA graph replayed (per-tile epochs), a grid larger than the GPU
  (INVALID_ARGUMENT), results against exact references and bitwise equal on all ranks. Tile
  shapes on both sides of the LL tile all-reduce's limits (size and tile index; the case names
  count the tiles of each algorithm), graphs replayed 200 times back to back.
- The fused ops (ironlink.all_reduce_rmsnorm in every mode, ironlink.matmul_all_reduce,
  ironlink.matmul_reduce_scatter, ironlink.all_gather_matmul, each also 8
  launches back to back) against a
  float64 reference within the dtype's tolerance, bitwise equal on all ranks, eager and replayed
  in a CUDA graph, at shapes that are not multiples of the tile; all_reduce_rmsnorm at the token
  counts of decode (1 to 128, rows over the LL tile all-reduce at world 2) also 500 graph
  replays back to back; chains of all_reduce_rmsnorm and all_reduce launched with programmatic
  dependent launch on, off and alternating (sm_90+), bitwise the same.
- The ops with peer slots (all_reduce_rmsnorm, matmul_all_reduce, all_reduce's lamport path)
  called back to back with a new shape every call while each rank in turn runs behind its peers
  (`_shape_changes.py`): consecutive launches' slot halves must stay apart whatever the shapes.
- The fused ops' kernels for heaps of several nodes (grid barriers around a hierarchical
  collective), relinked with the P2P bitcode and run on this one-node heap as if it spanned
  several (`as_several_nodes`): their own logic checked the same way on any GPUs, without NVSHMEM
  (tests/gpu/workers/nvshmem_worker.py runs them across simulated nodes).

Here the list of cases (`main`); their code in `_fusion_tiles.py` (the device calls in kernels),
`_fusion_ops.py` (the fused ops) and `_fusion_several_nodes.py`, the kernels in `_fusion_kernels.py`.
"""

from __future__ import annotations

from dataclasses import replace
import sys
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

import ironlink
from ironlink.runtime.distributed import grid_cap, ranks_per_gpu, sm_share
from ironlink.runtime import tuning
from ironlink.fused.all_reduce_rmsnorm import MODES
from ironlink.fused.matmul_all_reduce import METHODS as MATMUL_METHODS
from ironlink.runtime.pdl import MIN_MAJOR

from _cases import Cases, heap_timeout_s, replays, small  # tests/gpu/workers/, the script's own directory
import _shape_changes as shape_changes

from _fusion_ops import Suite
from _fusion_several_nodes import hierarchical_cases, refused


def matmul_kernel(method: Optional[str], m: int, n: int, k: int, world: int) -> str:
    """Which kernel matmul_all_reduce runs for this shape (for the case's name): the method, and
    for "push" one-shot or two-shot (tuning.matmul_one_shot)."""
    tiles = tuning.matmul_config(m, n, k, world).tiles(m, n)
    ctas = min(tiles, sm_share(torch.cuda.current_device()))
    method = method or tuning.matmul_method(tiles, ctas, world, m * n * 2)  # bf16 or fp16 out
    if method != "push":
        return method
    return f"push {'one' if tuning.matmul_one_shot(tiles, ctas, world) else 'two'}-shot"


def split_fits(tokens: int, hidden: int, world: int) -> bool:
    """Whether all_reduce_rmsnorm's mode "split" runs `tokens` rows of `hidden` 16-bit values here
    (it refuses rows it cannot cut into slices with every CTA resident)."""
    return tuning.rmsnorm_split_parts(tokens, 2 * hidden, world, sm_share(torch.cuda.current_device())) > 1


def sp_cases(cases: Cases, s: Suite, world: int, dtype: torch.dtype, method: str) -> None:
    """all_gather_matmul and matmul_reduce_scatter by `method`: odd shapes, back to back, graphs."""
    for m, n, k in small(((16 * world, 8192, 512), (100 * world, 1000, 300), (1030 * world, 2050, 1024)),
                         ((16 * world, 8192, 512), (100 * world, 1000, 300))):
        cases.run(f"matmul_reduce_scatter {method} {dtype} {m}x{n}x{k}",
                  lambda: s.matmul_scatter(m, n, k, dtype, False, method))
        cases.run(f"all_gather_matmul {method} {dtype} {m // world}x{n}x{k}",
                  lambda: s.gather_matmul(m // world, n, k, dtype, False, method))
    cases.run(f"matmul_reduce_scatter {method} {dtype} 8 launches back to back",
              lambda: s.matmul_scatter(*small((1030 * world, 2050, 1024), (100 * world, 1000, 300)), dtype, False, method,
                                       launches=8))
    cases.run(f"all_gather_matmul {method} {dtype} 8 launches back to back",
              lambda: s.gather_matmul(*small((1030, 2050, 1024), (100, 1000, 300)), dtype, False, method, launches=8))
    cases.run(f"matmul_reduce_scatter {method} {dtype} in a CUDA graph",
              lambda: s.matmul_scatter(200 * world, 4096, 512, dtype, True, method))
    cases.run(f"all_gather_matmul {method} {dtype} in a CUDA graph",
              lambda: s.gather_matmul(200, 4096, 512, dtype, True, method))
    if method == "kernel":  # the copy engine carries the data (the defaults: all_gather_matmul's
        # row-major shard, matmul_reduce_scatter's partials) or the kernel's CTAs push it.
        # Also where ranks share a GPU, where the copy engine once stalled (docs/gpu-testing.md).
        for rows, n, k, launches, graph in small(((16, 8192, 512, 1, False), (100, 1000, 300, 8, False),
                                                  (1030, 2050, 1024, 8, False), (200, 4096, 512, 1, True)),
                                                 ((100, 1000, 300, 8, False), (200, 4096, 512, 1, True))):
            how = f"{dtype} {{}}x{n}x{k} {launches} launch(es){' in a CUDA graph' if graph else ''}"
            for least, name in ((0, "copy engine"), (None, "SM push")):
                cases.run(f"matmul_reduce_scatter kernel, {name}, {how.format(rows * world)}",
                          lambda least=least: s.matmul_scatter(
                              rows * world, n, k, dtype, graph, method, launches=launches,
                              exchange=tuning.ScatterExchange(copy_engine_min_rows=least)))
            cases.run(f"all_gather_matmul kernel, copy engine, {how.format(rows)}",
                      lambda: s.gather_matmul(rows, n, k, dtype, graph, method, launches=launches, contiguous=True))
        # Called on the stream the copies would take (as a pool stream once could be): they must
        # take another, or each rank's kernel waits for transfers queued behind itself.
        for op in ("matmul_reduce_scatter", "all_gather_matmul"):
            cases.run(f"{op} kernel, copy engine, {dtype}, called on the copies' stream",
                      lambda op=op: on_side_stream(
                          lambda: s.matmul_scatter(200 * world, 1000, 300, dtype, False, method, launches=2,
                                                   exchange=tuning.ScatterExchange(copy_engine_min_rows=0))
                          if op == "matmul_reduce_scatter" else
                          s.gather_matmul(200, 1000, 300, dtype, False, method, launches=2, contiguous=True)))

def on_side_stream(fn: Callable[[], None]) -> None:
    """Runs `fn` with the first of the side streams the ops take (runtime.streams) as the current
    stream."""
    from ironlink.runtime import streams

    stream = streams._made_streams(torch.cuda.current_device(), 2)[0]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)


def fusion_heap_bytes(world: int) -> int:
    """The suite's heap: 2 GiB, or 768 MiB a peer where that is more (see main)."""
    return max(2 << 30, (world - 1) * (768 << 20))


def main() -> int:
    ironlink.init_distributed()
    world = dist.get_world_size()
    # 1 GiB: the fused ops keep their workspaces (matmul_all_reduce's, all_reduce_rmsnorm push's
    # slots: twice x) until the heap closes, each a power of two; the 8200-row two-shot cases' is
    # 128 MiB on top of the smaller ones kept before it (512 MiB ran out there).
    # 2 GiB: every mode forced at every shape keeps its workspaces (each a power of two, the smaller
    # ones kept for graphs captured with them); with two_shot beside lamport (one workspace name,
    # more sizes) 1 GiB ran out at world 4 before matmul_all_reduce's lamport cases.
    # The push and lamport workspaces grow as world - 1: 2 GiB ran out at world 8 (lamport
    # 4100x2050 needs 256 MiB after the cases before it); 768 MiB a peer keeps world 4's 2 GiB.
    s = Suite(ironlink.SymmetricHeap(fusion_heap_bytes(world), timeout_s=heap_timeout_s()))
    # One failure's recorded error must not fail the cases after it, nor its heap's state.
    cases = Cases(before=s.clear_errors, renew=s.renew_heap)
    t0 = time.time()
    cap = grid_cap(torch.cuda.current_device())  # ranks sharing a GPU: every rank's CTAs resident
    for alg in ("one_shot_ll", "two_shot_ll", "two_shot"):
        for dtype, n, grid in small(((torch.bfloat16, 8191, 32), (torch.float32, 1 << 20, 132), (torch.float16, 3, 7)),
                                    ((torch.bfloat16, 8191, 32), (torch.float16, 3, 7))):
            grid = min(grid, cap)
            cases.run(f"grid barrier + all_reduce {alg} {dtype} n={n} grid={grid}", lambda: s.grid_barrier(n, dtype, grid, alg))
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows, cols, stride, grid in small(((100, 300, 320, 8), (1, 8192, 8192, 4), (2048, 512, 512, 132)),
                                              ((100, 300, 320, 8), (1, 8192, 8192, 4))):
            grid = min(grid, cap)
            cases.run(f"tile all_reduce {dtype} {rows}x{cols} stride {stride} grid {grid}",
                      lambda: s.tiles(rows, cols, stride, dtype, grid, graph=False))
    cases.run("tile all_reduce in a CUDA graph", lambda: s.tiles(64, 1000, 1024, torch.bfloat16, 16, graph=True))
    # The LL tile all-reduce (small tiles of indices below MAX_LL_TILES) beside the two-shot: tiles
    # at its size limit at world 2 (64 x 128 bf16 = 16 KiB; fp32 two-shot), one row of hidden
    # 8192 per tile (all_reduce_rmsnorm's rows), and a matrix whose tile indices run past
    # MAX_LL_TILES; eager, and CUDA graphs replayed back to back.
    for dtype, rows, cols, tile, grid in ((torch.bfloat16, 200, 1000, (64, 128), 16),
                                          (torch.float32, 200, 1000, (64, 128), 16),
                                          (torch.bfloat16, 40, 8192, (1, 8192), 40),
                                          (torch.float16, 330, 1000, (16, 64), 132)):
        grid = min(grid, cap)
        algs = s.tile_algorithms(rows, cols, tile, dtype)
        cases.run(f"tile all_reduce {dtype} {rows}x{cols} tiles {tile} grid {grid} ({algs})",
                  lambda: s.tiles(rows, cols, cols, dtype, grid, graph=False, tile=tile))
        cases.run(f"tile all_reduce {dtype} {rows}x{cols} tiles {tile} ({algs}): {replays(200)} graph replays back to back",
                  lambda: s.tiles(rows, cols, cols, dtype, grid, graph=True, tile=tile, replays=replays(200)))
    cases.run("grid barrier: grid larger than the GPU", s.grid_too_large)
    for dtype in (torch.bfloat16, torch.float32):
        for rows, cols, stride, grid in ((100, 300, 320, 8), (7, 4096, 4100, 32)):
            cases.run(f"tile all_gather {dtype} {rows}x{cols} stride {stride} grid {grid}",
                      lambda: s.tile_gather(rows, cols, stride, dtype, grid))
            cases.run(f"tile reduce_scatter {dtype} {rows}x{cols} stride {stride} grid {grid}",
                      lambda: s.tile_scatter(rows, cols, stride, dtype, grid))
    for n_tiles, grid in ((9, 4), (64, 64)):
        cases.run(f"push-as-produced ring {n_tiles} tiles grid {grid}", lambda: s.ring(n_tiles, grid, graph=False))
    cases.run("push-as-produced ring in a CUDA graph", lambda: s.ring(16, 8, graph=True))
    for n_tiles, grid in ((9, 4), (64, 64)):
        cases.run(f"signal_others / wait_others exchange {n_tiles} tiles grid {grid}", lambda: s.exchange(n_tiles, grid))
    for dtype in (torch.bfloat16, torch.float16):
        # 300 x 5120: several rows a CTA (push: chunks pipelined, the last one ragged).
        for tokens, hidden in small(((1, 8192), (5, 4096), (33, 8192), (300, 5120), (1000, 16384)),
                                    ((1, 8192), (33, 8192), (300, 5120))):
            for mode in MODES:
                if mode == "split" and not split_fits(tokens, hidden, world):
                    cases.run(f"all_reduce_rmsnorm split {tokens}x{hidden} refused", lambda: refused(
                        lambda: s.rmsnorm(tokens, hidden, dtype, mode, graph=False), "mode 'split' needs"))
                    continue
                cases.run(f"all_reduce_rmsnorm {mode} {dtype} {tokens}x{hidden}",
                          lambda: s.rmsnorm(tokens, hidden, dtype, mode, graph=False))
        cases.run(f"all_reduce_rmsnorm {dtype} in a CUDA graph", lambda: s.rmsnorm(32, 8192, dtype, None, graph=True))
        # Any tensor in: the argument peers reach at its heap offset outside the heap, staged.
        # Small: 1030x2050x1024 took 134 s a call under racecheck (one H200, world 4).
        mm = small(((1030, 2050, 1024),), ((100, 1000, 300),))[0]
        for graph in (False, True):
            how = " in a CUDA graph" if graph else ""
            cases.run(f"all_reduce_rmsnorm {dtype} 32x8192, x outside the heap{how}",
                      lambda: s.rmsnorm(32, 8192, dtype, None, graph=graph, outside_heap=True))
            cases.run(f"matmul_all_reduce {dtype} {mm[0]}x{mm[1]}x{mm[2]}, out outside the heap{how}",
                      lambda: s.matmul(*mm, dtype, graph=graph, outside_heap=True))
            for method in ("kernel", "collective"):
                cases.run(f"all_gather_matmul {method} {dtype} 256x1024x512, a_full outside the heap{how}",
                          lambda: s.gather_matmul(256, 1024, 512, dtype, graph=graph, method=method,
                                                  outside_heap=True))
        for mode in MODES:
            if mode != "split" or split_fits(33, 8192, world):  # ranks sharing a GPU: too few SMs each
                cases.run(f"all_reduce_rmsnorm {mode} {dtype} residual_out", lambda: s.rmsnorm(
                    33, 8192, dtype, mode, graph=False, separate_residual=True))
            if torch.cuda.get_device_capability()[0] >= 9:
                for tokens in (1, 33, 300):  # 300: three rows a CTA in rows mode (two at a time, then one)
                    if mode == "split" and not split_fits(tokens, 8192, world):
                        continue
                    cases.run(f"all_reduce_rmsnorm {mode} {dtype} {tokens}x8192 fp8 out", lambda: s.rmsnorm(
                        tokens, 8192, dtype, mode, graph=False, fp8=True))
        if torch.cuda.get_device_capability()[0] >= 9:
            cases.run(f"all_reduce_rmsnorm {dtype} fp8 out in a CUDA graph",
                      lambda: s.rmsnorm(8, 8192, dtype, None, graph=True, fp8=True))
        # The token counts of decode, in the default mode: rows over the LL tile all-reduce where
        # a CTA's row fits it (hidden 8192 at world 2; the case name says which).
        sms = sm_share(torch.cuda.current_device())
        for tokens in (1, 8, 32, 128):
            mode = tuning.rmsnorm_mode(tokens, 8192 * 2, world, sms)
            ll = mode == "rows" and tuning.tile_all_reduce_takes_ll(
                min(tokens, sms) - 1, tuning.rmsnorm_rows_per_cta(tokens, min(tokens, sms)), 8192 * 2, world)
            how = f"{mode}{' over LL' if ll else ''}"
            cases.run(f"all_reduce_rmsnorm default ({how}) {dtype} {tokens}x8192",
                      lambda: s.rmsnorm(tokens, 8192, dtype, None, graph=False))
            cases.run(f"all_reduce_rmsnorm default ({how}) {dtype} {tokens}x8192: {replays(500)} graph replays back to back",
                      lambda: s.rmsnorm(tokens, 8192, dtype, None, graph=True, back_to_back=replays(500)))
        # The push modes with 16 rows a CTA (8 pipelined steps): both halves of their slots, alternately.
        for mode in ("push", "push_two_shot"):
            cases.run(f"all_reduce_rmsnorm {mode} {dtype} 2048x8192: {replays(200)} graph replays back to back",
                      lambda: s.rmsnorm(2048, 8192, dtype, mode, graph=True, back_to_back=replays(200)))
        # Split with the exchange of its slices that the tuning does not choose (LL packets or
        # lamport slots: tuning.RMSNORM_SPLIT_LAMPORT), as the default one is checked above.
        other = "LL packets" if tuning.RMSNORM_SPLIT_LAMPORT else "lamport slots"
        flipped = tuning.RmsnormConfig(split_lamport=not tuning.RMSNORM_SPLIT_LAMPORT)
        for tokens in (1, 8, 16):
            if split_fits(tokens, 8192, world):
                cases.run(f"all_reduce_rmsnorm split over {other} {dtype} {tokens}x8192",
                          lambda: s.rmsnorm(tokens, 8192, dtype, "split", graph=False, config=flipped))
                if torch.cuda.get_device_capability()[0] >= 9:
                    cases.run(f"all_reduce_rmsnorm split over {other} {dtype} {tokens}x8192 fp8 out",
                              lambda: s.rmsnorm(tokens, 8192, dtype, "split", graph=False, fp8=True, config=flipped))
        if split_fits(8, 8192, world):
            cases.run(f"all_reduce_rmsnorm split over {other} {dtype} 8x8192: {replays(2000)} graph replays back to back",
                      lambda: s.rmsnorm(8, 8192, dtype, "split", graph=True, back_to_back=replays(2000), config=flipped))
        # Lamport and two_shot: every slot must be empty again after each call, or the next call
        # that lands there reads stale rows (or waits out its timeout): many calls, several rows a CTA.
        for mode, tokens, full in (("lamport", 32, 2000), ("lamport", 2048, 200), ("two_shot", 32, 2000),
                                   ("two_shot", 128, 2000), ("two_shot", 2048, 200)):
            cases.run(f"all_reduce_rmsnorm {mode} {dtype} {tokens}x8192: {replays(full)} graph replays back to back",
                      lambda: s.rmsnorm(tokens, 8192, dtype, mode, graph=True, back_to_back=replays(full)))
        # two_shot's ragged chunks at world 4: a row of 1000, a CTA a row (chunks of 256, the last
        # 232); rows of 5000 in 4 slices a row (chunks of 320, the last slice's last 200).
        for tokens, hidden in ((7, 1000), (3, 5000)):
            cases.run(f"all_reduce_rmsnorm two_shot {dtype} {tokens}x{hidden} (ragged chunks)",
                      lambda: s.rmsnorm(tokens, hidden, dtype, "two_shot", graph=False))
        # push_two_shot's ragged chunks (a row of 1000: chunks of 256 at world 4, the last 232; a
        # row of 16: every chunk but rank 0's empty) and a ragged last step (267 rows: 3 a CTA on
        # 132 CTAs at world 2 and 4, two then one; the last CTAs none).
        for tokens, hidden in ((7, 1000), (267, 1000), (5, 16)):
            cases.run(f"all_reduce_rmsnorm push_two_shot {dtype} {tokens}x{hidden} (ragged chunks)",
                      lambda: s.rmsnorm(tokens, hidden, dtype, "push_two_shot", graph=False))
        # Decode replays a graph of the op for every token generated: 10,000 replays back to back
        # (one per decode step of a long answer) and still the reference's bits.
        for tokens in small((1, 32), (1,)):
            cases.run(f"all_reduce_rmsnorm default {dtype} {tokens}x8192: {replays(10000)} graph replays back to back",
                      lambda: s.rmsnorm(tokens, 8192, dtype, None, graph=True, back_to_back=replays(10000)))
        # Shapes of one wave of tiles (push: one-shot at world 2), of two (153 tiles of 128 x 256 on
        # up to 132 SMs: one-shot at world 2, tuning.MATMUL_ONE_SHOT_MAX_WAVES) and of more (push:
        # two-shot by slices, ragged edges); the case name says which kernel ran.
        for method in MATMUL_METHODS:
            for m, n, k in small(((16, 8192, 512), (100, 1000, 300), (1030, 2050, 1024), (2050, 2050, 512),
                                  (4100, 2050, 512)),
                                 ((16, 8192, 512), (100, 1000, 300), (2050, 2050, 512), (4100, 2050, 512))):
                cases.run(f"matmul_all_reduce {matmul_kernel(method, m, n, k, world)} {dtype} {m}x{n}x{k}",
                          lambda: s.matmul(m, n, k, dtype, graph=False, method=method))
            for m, n, k in small(((1030, 2050, 1024), (4100, 2050, 512)), ((100, 1000, 300), (4100, 2050, 512))):
                cases.run(f"matmul_all_reduce {matmul_kernel(method, m, n, k, world)} {dtype} {m}x{n}x{k} "
                          "8 launches back to back",
                          lambda: s.matmul(m, n, k, dtype, graph=False, launches=8, method=method))
        for m, n, k in small(((1030, 2048, 1024), (4096, 2048, 512)), ((128, 1024, 256), (4096, 2048, 512))):
            cases.run(f"matmul_all_reduce {matmul_kernel(None, m, n, k, world)} {dtype} b row-major {m}x{n}x{k} "
                      "8 launches back to back",
                      lambda: s.matmul(m, n, k, dtype, graph=False, launches=8, b_row_major=True))
        # The two-shot kernel's signals per tile and in batches (tuning.MATMUL_SIGNAL_EVERY, flat
        # loop at world 2): 8200 rows make 585 tiles of 128 x 256, four or five a CTA, so batches
        # of 2 and 3 leave ragged remainders after the loop.
        if world == 2 and torch.cuda.get_device_capability()[0] == 9:
            for every in (1, 2, 3):
                for launches, graph in ((8, False), (1, True)):
                    cases.run(f"matmul_all_reduce push two-shot, signals every {every} tile(s), {dtype} "
                              f"8200x2050x512 {launches} launch(es){' in a CUDA graph' if graph else ''}",
                              lambda: s.matmul(8200, 2050, 512, dtype, graph=graph, launches=launches, method="push",
                                               exchange=replace(tuning.push_pacing(9), signal_every=every)))
        # matmul_reduce_scatter's kernel signals the same ways: 8200 rows a rank make 585 tiles of
        # 128 x 256 a block, 1170 in all: eight or nine a CTA, four or five before its own block.
        # The CTAs push (copy_engine_min_rows=None): by default blocks this large take the copy
        # engine, which has no signals to batch (and stalls where ranks share a GPU).
        if world == 2 and torch.cuda.get_device_capability()[0] == 9:
            for every in (1, 2, 3):
                for launches, graph in ((8, False), (1, True)):
                    cases.run(f"matmul_reduce_scatter kernel, signals every {every} tile(s), {dtype} "
                              f"16400x2050x512 {launches} launch(es){' in a CUDA graph' if graph else ''}",
                              lambda: s.matmul_scatter(16400, 2050, 512, dtype, graph, "kernel", launches=launches,
                                                       exchange=tuning.ScatterExchange(copy_engine_min_rows=None,
                                                                                       signal_every=every)))
        # The one-shot kernel's tail both ways (tuning.MATMUL_TAIL_INTERLEAVED): one tile a CTA
        # (1030 rows: 81 tiles of 128 x 256) and two (2050: 153 tiles), ragged edges.
        if world == 2:
            for on in (False, True):
                for m, launches, graph in ((1030, 1, False), (2050, 8, False), (2050, 1, True)):
                    if matmul_kernel("push", m, 2050, 1024, world) != "push one-shot":  # no tail to test
                        if s.rank == 0 and on:  # ranks sharing a GPU: fewer CTAs, 2050 rows go two-shot
                            print(f"skipped: the one-shot tail cases of {m} rows: this GPU share runs them two-shot",
                                  flush=True)
                        continue
                    cases.run(f"matmul_all_reduce push one-shot, tail {'interleaved' if on else 'in turn'}, "
                              f"{dtype} {m}x2050x1024 {launches} launch(es){' in a CUDA graph' if graph else ''}",
                              lambda: s.matmul(m, 2050, 1024, dtype, graph=graph, launches=launches, method="push",
                                               exchange=replace(tuning.push_pacing(torch.cuda.get_device_capability()[0]),
                                                                tail_interleaved=on)))
        for method in tuning.SP_METHOD_NAMES:
            sp_cases(cases, s, world, dtype, method)
        for m, n in ((200, 4096), (4100, 2050)):
            cases.run(f"matmul_all_reduce {matmul_kernel(None, m, n, 512, world)} {dtype} {m}x{n}x512 in a CUDA graph",
                      lambda: s.matmul(m, n, 512, dtype, graph=True))
    # A new shape every call, back to back, each rank behind its peers in turn (_shape_changes.py):
    # the slots' halves must stay apart whatever the shapes of consecutive calls.
    for mode in (None, "lamport", "push") + (("two_shot",) if world & (world - 1) == 0 else ()):
        cases.run(f"all_reduce_rmsnorm {mode or 'default'}: a new shape every call, ranks apart",
                  lambda: shape_changes.rmsnorm(s.heap, mode))
    for method in (None, "push", "lamport"):
        cases.run(f"matmul_all_reduce {method or 'default'}: a new shape every call, ranks apart",
                  lambda: shape_changes.matmul(s.heap, method))
    cases.run("all_reduce (lamport sizes): a new size every call, ranks apart", lambda: shape_changes.all_reduce(s.heap))
    if ranks_per_gpu() > 1:  # PDL asked for explicitly: a rank's next grid holds SMs a peer's grid needs
        print("skipped: the PDL chains: ranks share a GPU, and PDL asked for there stalls until the timeout "
              "(docs/python.md: off by default where ranks share a GPU)", flush=True)
    elif torch.cuda.get_device_capability()[0] >= MIN_MAJOR:  # griddepcontrol: sm_90+
        for tokens, mode in small(((1, None), (32, None), (128, None), (2048, None), (8, "whole"), (32, "rows")),
                                  ((1, None), (8, "whole"))):
            cases.run(f"all_reduce_rmsnorm + all_reduce chain {tokens}x8192 {mode or 'default mode'}: "
                      "PDL on, off, alternating: bitwise the same",
                      lambda: s.rmsnorm_pdl_chain(tokens, 8192, torch.bfloat16, mode, replays=replays(200)))
    hierarchical_cases(cases, s, world)
    s.heap.close()
    code = cases.report("fusion", world, t0)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
