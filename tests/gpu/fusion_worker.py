"""GPU suite of the fusion calls (run under torchrun by `tests/gpu/run.sh fusion`).

- A kernel whose CTAs each produce a slice of a tensor, pass `symm_grid_barrier`, and all-reduce
  the whole tensor in the same launch (every all-reduce algorithm, forced through the limits).
- A persistent kernel that computes the tiles of a 2-D matrix (rows `stride` elements apart,
  edge tiles partial) and all-reduces each with `symm_tile_all_reduce` as soon as it is written;
  rank r runs tile t on CTA (t + r) % grid, so only matching by tile index pairs them.
- Back-to-back launches and a CUDA graph replayed (per-tile epochs), a grid larger than the GPU
  (INVALID_ARGUMENT), results against exact references and bitwise equal on all ranks.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
import triton.language as tl

import ironlink
from ironlink import _abi

from _cases import Cases  # tests/gpu/, the script's own directory
from fusion_kernels import produce_then_all_reduce, tiles_then_all_reduce

DT = {torch.float32: _abi.DTYPE["FLOAT32"], torch.float16: _abi.DTYPE["FLOAT16"], torch.bfloat16: _abi.DTYPE["BFLOAT16"]}
TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


class Suite:
    def __init__(self, heap: ironlink.SymmetricHeap) -> None:
        self.heap = heap
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.status = torch.zeros(_abi.MAX_CTAS, dtype=torch.int32, device="cuda")
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count

    def same_on_all_ranks(self, x: torch.Tensor) -> None:
        theirs = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(theirs, x)
        for r, t in enumerate(theirs):
            assert torch.equal(t.view(torch.uint8), x.view(torch.uint8)), f"rank {r}'s result differs bitwise"

    def check_status(self, grid: int, want: int = 0) -> None:
        got = self.status[:grid].tolist()
        assert all(s == want for s in got), f"statuses {got}, want {want}"

    def grid_barrier(self, n: int, dtype: torch.dtype, grid: int, alg: str) -> None:
        w = self.world
        limits = ironlink.tuning.FORCED_LIMITS[alg]
        old = self.heap.algorithm_limits
        self.heap.set_algorithm_limits(*limits)
        x = self.heap.empty((n,), dtype)
        try:
            for seed in (1, 4):
                x.fill_(float("nan"))
                produce_then_all_reduce[(grid,)](self.heap.ctx, x, n, self.rank, seed, DT[dtype], TL[dtype], self.status,
                                                 BLOCK=256, num_warps=4)
                torch.cuda.synchronize()
                self.check_status(grid)
                idx = torch.arange(n, device="cuda")
                want = ((idx * 7 + seed) % 13).float() * (w * (w + 1) / 2)
                assert torch.equal(x.float(), want.to(dtype).float()), f"wrong result ({alg})"
                self.same_on_all_ranks(x)
        finally:
            self.heap.free(x)
            self.heap.set_algorithm_limits(*old)

    def tiles(self, rows: int, cols: int, stride: int, dtype: torch.dtype, grid: int, graph: bool) -> None:
        w = self.world
        x = self.heap.empty((rows * stride,), dtype)
        try:
            x.fill_(-1.0)  # the stride gaps keep it
            launch = lambda seed: tiles_then_all_reduce[(grid,)](  # noqa: E731
                self.heap.ctx, x, rows, cols, stride, self.rank, seed, DT[dtype], TL[dtype], self.status,
                TR=32, TC=64, num_warps=4)
            if graph:
                launch(0)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    launch(3)
            for seed in (3, 3, 3) if graph else (1, 2, 5):
                if graph:
                    g.replay()
                else:
                    launch(seed)
                torch.cuda.synchronize()
                self.check_status(grid)
                i = torch.arange(rows, device="cuda")[:, None]
                j = torch.arange(cols, device="cuda")[None, :]
                want = ((i * 5 + j * 3 + seed) % 11).float() * (w * (w + 1) / 2)
                m = x.view(rows, stride)
                assert torch.equal(m[:, :cols].float(), want.to(dtype).float()), "wrong tile result"
                assert bool((m[:, cols:] == -1).all()), "a stride gap was written"
                self.same_on_all_ranks(x)
        finally:
            self.heap.free(x)

    def grid_too_large(self) -> None:
        x = self.heap.empty((1024,), torch.float32)
        try:
            grid = _abi.MAX_CTAS  # more than the SMs of any GPU this runs on
            status = torch.zeros(grid, dtype=torch.int32, device="cuda")
            produce_then_all_reduce[(grid,)](self.heap.ctx, x, 1024, self.rank, 1, DT[torch.float32], tl.float32, status,
                                             BLOCK=256, num_warps=4)
            torch.cuda.synchronize()
            got = set(status.tolist())
            assert got == {_abi.STATUS["INVALID_ARGUMENT"]}, f"statuses {got}"
            self.heap.check()  # an argument error is returned, not recorded
        finally:
            self.heap.free(x)


def main() -> int:
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    heap = ironlink.SymmetricHeap(256 << 20)
    s, cases = Suite(heap), Cases()
    t0 = time.time()
    for alg in ("one_shot_ll", "two_shot_ll", "two_shot"):
        for dtype, n, grid in ((torch.bfloat16, 8191, 32), (torch.float32, 1 << 20, 132), (torch.float16, 3, 7)):
            cases.run(f"grid barrier + all_reduce {alg} {dtype} n={n} grid={grid}", lambda: s.grid_barrier(n, dtype, grid, alg))
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows, cols, stride, grid in ((100, 300, 320, 8), (1, 8192, 8192, 4), (2048, 512, 512, 132)):
            cases.run(f"tile all_reduce {dtype} {rows}x{cols} stride {stride} grid {grid}",
                      lambda: s.tiles(rows, cols, stride, dtype, grid, graph=False))
    cases.run("tile all_reduce in a CUDA graph", lambda: s.tiles(64, 1000, 1024, torch.bfloat16, 16, graph=True))
    cases.run("grid barrier: grid larger than the GPU", s.grid_too_large)
    heap.close()
    if rank == 0:
        for f in cases.failed:
            print(f"FAILED {f}")
        print(f"== fusion world {world}: {cases.passed} passed, {len(cases.failed)} failed in {time.time() - t0:.1f}s ==",
              flush=True)
    dist.destroy_process_group()
    return 1 if cases.failed else 0


if __name__ == "__main__":
    sys.exit(main())
