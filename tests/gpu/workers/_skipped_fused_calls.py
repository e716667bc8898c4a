"""The misuse case "a fused call skipped by one rank" (misuse_worker.py): rank 0 skips a call the
others make, on the paths whose CTAs wait many times in one launch: matmul_reduce_scatter and
all_gather_matmul with the copy engine (a wait a chunk of rows) and matmul_all_reduce's tile
method (a wait a tile). The others must raise TIMEOUT within the timeout and some slack: a CTA
waits no more after its first timeout. Before that rule a CTA waited out the timeout once a chunk
or tile (a stalled call ran for minutes, docs/record.md session 50). The shapes give each CTA
several chunks and tiles of its own block: 8192 rows a rank, N 4096 (128 x 256 tiles: 1024 a
block, about 8 a CTA, each in another chunk of 8 tile rows)."""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable

import torch
import torch.distributed as dist

from _misuse_common import COMPILE_TIMEOUT_S, SLACK_S, TIMEOUT_S, expect_error  # the script's own directory

ROWS, N, K = 8192, 4096, 512


def _calls(world: int) -> list[tuple[str, Callable[[Any], Callable[[], Any]], int]]:
    """(name, the call bound to a heap (what it needs allocated there), the heap bytes it needs)
    of each path."""
    import ironlink
    from ironlink.runtime import tuning

    a = torch.randn(world * ROWS, K, device="cuda").to(torch.bfloat16)
    shard = torch.randn(ROWS, K, device="cuda").to(torch.bfloat16)
    tile_a = torch.randn(ROWS, K, device="cuda").to(torch.bfloat16)
    b = (torch.randn(K, N, device="cuda") / K ** 0.5).to(torch.bfloat16)
    scatter = tuning.ScatterExchange(copy_engine_min_rows=0)
    gather = tuning.GatherExchange(copy_engine=True)
    return [
        ("matmul_reduce_scatter, copy engine",
         lambda h: partial(ironlink.matmul_reduce_scatter, a, b, heap=h, method="kernel", exchange=scatter),
         ironlink.matmul_reduce_scatter.heap_bytes(world * ROWS, N, K, world, method="kernel", exchange=scatter)),
        ("all_gather_matmul, copy engine",
         lambda h: partial(ironlink.all_gather_matmul, shard, b, heap=h, method="kernel", exchange=gather),
         ironlink.all_gather_matmul.heap_bytes(world * ROWS, N, K, world, method="kernel", exchange=gather)),
        ("matmul_all_reduce, tile method",  # out on the heap (the tile method reads peers' out), one a heap
         lambda h: partial(ironlink.matmul_all_reduce, tile_a, b, out=h.empty((ROWS, N), torch.bfloat16), heap=h,
                           method="tile"),
         ironlink.matmul_all_reduce.heap_bytes(ROWS, N, K, world, method="tile") + ROWS * N * 2),
    ]


def skipped_fused_calls() -> None:
    """Each path: a call on every rank (compiles, at COMPILE_TIMEOUT_S), then one that rank 0 skips,
    at TIMEOUT_S: the others raise TIMEOUT within TIMEOUT_S + SLACK_S. Also where ranks share a
    GPU."""
    import ironlink
    from ironlink.language import _abi

    for name, bind, nbytes in _calls(dist.get_world_size()):
        heap = ironlink.SymmetricHeap(nbytes + (64 << 20), timeout_s=COMPILE_TIMEOUT_S)  # the first call compiles
        try:
            call = bind(heap)
            call()  # every rank: compiled, workspaces made, the launch counters in step
            heap.check()
            heap.barrier()
            heap.set_timeout(TIMEOUT_S)
            if dist.get_rank() != 0:
                t0 = time.time()
                call()
                e = expect_error(heap.check, "TIMEOUT")
                took = time.time() - t0
                assert e.status == _abi.STATUS["TIMEOUT"], (name, e.status)
                assert took < TIMEOUT_S + SLACK_S, f"{name}: TIMEOUT raised after {took:.1f} s (timeout {TIMEOUT_S} s)"
        finally:
            heap.close()
