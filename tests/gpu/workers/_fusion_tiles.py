"""The fusion suite's cases of the device library's calls inside user kernels
(`tests/gpu/workers/fusion_worker.py` runs them): a grid barrier then a whole-tensor all-reduce in
one launch, tiles all-reduced, all-gathered and reduce-scattered as a persistent kernel writes
them, push-as-produced around a ring, every rank signalling every other, and a grid larger than
the GPU refused. The kernels are in `_fusion_kernels.py`; `_fusion_ops.py` adds the fused ops'
cases to this class."""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton.language as tl

import ironlink
from ironlink.language import _abi
from ironlink.runtime import tuning
from ironlink.runtime.registry import holds

from _cases import renewed, same_on_all_ranks  # tests/gpu/workers/, the script's own directory
from _fusion_kernels import (exchange_with_all, produce_then_all_reduce, ring_push, tiles_then_all_gather,
                            tiles_then_all_reduce, tiles_then_reduce_scatter)


DT = {torch.float32: _abi.DTYPE["FLOAT32"], torch.float16: _abi.DTYPE["FLOAT16"], torch.bfloat16: _abi.DTYPE["BFLOAT16"]}
TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


class TileSuite:
    """The suite's heap and status words, and the cases of tile and grid calls."""

    def __init__(self, heap: ironlink.SymmetricHeap) -> None:
        self.heap = heap
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.status = torch.zeros(_abi.MAX_CTAS, dtype=torch.int32, device="cuda")

    def empty(self, shape: tuple[int, int], dtype: torch.dtype, outside_heap: bool = False) -> torch.Tensor:
        """A heap tensor, or with `outside_heap` an ordinary one, which the ops stage (any tensor in)."""
        return torch.empty(shape, device="cuda", dtype=dtype) if outside_heap else self.heap.empty(shape, dtype)

    def release(self, t: torch.Tensor) -> None:
        if holds(self.heap, t):
            self.heap.free(t)

    def renew_heap(self) -> None:
        """Closes the heap and opens another of its size (collective): what a case that failed
        with an IronlinkError leaves (a timeout's disagreeing counters, a late peer's flags) must
        not reach the cases after it."""
        self.heap = renewed(self.heap)

    def clear_errors(self) -> None:
        """Forgets an error a failed earlier case left recorded in the context."""
        try:
            self.heap.check()
        except ironlink.IronlinkError:
            pass

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
                same_on_all_ranks(x)
        finally:
            self.heap.free(x)
            self.heap.set_algorithm_limits(*old)

    def tile_algorithms(self, rows: int, cols: int, tile: tuple[int, int], dtype: torch.dtype) -> str:
        """How many of the tiles of a rows x cols matrix cut into `tile` go over the LL tile
        all-reduce (the device's rule, as tuning mirrors it) and how many two-shot: for case names."""
        tr, tc = tile
        tiles_c = -(-cols // tc)
        n = -(-rows // tr) * tiles_c
        size = torch.tensor([], dtype=dtype).element_size()
        ll = sum(tuning.tile_all_reduce_takes_ll(t, min(tr, rows - t // tiles_c * tr),
                                                 min(tc, cols - t % tiles_c * tc) * size, self.world)
                 for t in range(n))
        return f"LL {ll} / two-shot {n - ll}"

    def tiles(self, rows: int, cols: int, stride: int, dtype: torch.dtype, grid: int, graph: bool,
              tile: tuple[int, int] = (32, 64), replays: int = 3) -> None:
        """Eager: three launches with new values. Graph: `replays` replays; with more than 3, back
        to back with one check at the end (the tiles' LL halves and epochs across launches)."""
        w = self.world
        x = self.heap.empty((rows * stride,), dtype)
        try:
            x.fill_(-1.0)  # the stride gaps keep it
            launch = lambda seed: tiles_then_all_reduce[(grid,)](  # noqa: E731
                self.heap.ctx, x, rows, cols, stride, self.rank, seed, DT[dtype], TL[dtype], self.status,
                TR=tile[0], TC=tile[1], num_warps=4)
            if graph:
                launch(0)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    launch(3)
            rounds = ((3,) * replays if replays <= 3 else (3,)) if graph else (1, 2, 5)
            for seed in rounds:
                if graph:
                    for _ in range(1 if replays <= 3 else replays):
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
                same_on_all_ranks(x)
        finally:
            self.heap.free(x)

    def _ij(self, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.arange(rows, device="cuda")[:, None], torch.arange(cols, device="cuda")[None, :]

    def tile_gather(self, rows: int, cols: int, stride: int, dtype: torch.dtype, grid: int) -> None:
        w = self.world
        x = self.heap.empty((w * rows * stride,), dtype)
        try:
            x.fill_(-1.0)
            for seed in (1, 2, 7):
                tiles_then_all_gather[(grid,)](self.heap.ctx, x, rows, cols, stride, self.rank, w, seed, TL[dtype],
                                               self.status, TR=32, TC=64, num_warps=4)
                torch.cuda.synchronize()
                self.check_status(grid)
                i, j = self._ij(rows, cols)
                m = x.view(w, rows, stride)
                for p in range(w):
                    want = ((i * 5 + j * 3 + seed) % 11 + 16 * p).float()
                    assert torch.equal(m[p, :, :cols].float(), want.to(dtype).float()), f"block {p} wrong"
                assert bool((m[:, :, cols:] == -1).all()), "a stride gap was written"
                same_on_all_ranks(x)
        finally:
            self.heap.free(x)

    def tile_scatter(self, rows: int, cols: int, stride: int, dtype: torch.dtype, grid: int) -> None:
        w = self.world
        x = self.heap.empty((w * rows * stride,), dtype)
        out = self.heap.empty((rows * stride,), dtype)
        try:
            out.fill_(-1.0)
            for seed in (1, 4):
                tiles_then_reduce_scatter[(grid,)](self.heap.ctx, x, out, rows, cols, stride, self.rank, w, seed,
                                                   TL[dtype], self.status, TR=32, TC=64, num_warps=4)
                torch.cuda.synchronize()
                self.check_status(grid)
                i, j = self._ij(rows, cols)
                want = ((i * 5 + j * 3 + seed + self.rank) % 11).float() * (w * (w + 1) / 2)
                o = out.view(rows, stride)
                assert torch.equal(o[:, :cols].float(), want.to(dtype).float()), "wrong reduce-scatter tile"
                assert bool((o[:, cols:] == -1).all()), "a stride gap was written"
        finally:
            self.heap.free(out)
            self.heap.free(x)

    def ring(self, n_tiles: int, grid: int, graph: bool) -> None:
        w, te = self.world, 1024
        outbox = self.heap.zeros((n_tiles * te,), torch.float32)
        inbox = self.heap.zeros((n_tiles * te,), torch.float32)
        got = torch.zeros(n_tiles * te, device="cuda")
        try:
            launch = lambda seed: ring_push[(grid,)](  # noqa: E731
                self.heap.ctx, outbox, inbox, got, n_tiles, self.rank, w, seed, self.status, TE=te, num_warps=4)
            seeds = (5, 5, 5) if graph else (1, 2, 3)
            if graph:
                launch(0)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    launch(5)
            for seed in seeds:
                got.zero_()
                g.replay() if graph else launch(seed)
                torch.cuda.synchronize()
                self.check_status(grid)
                prev = (self.rank + w - 1) % w
                e = torch.arange(te, device="cuda")[None, :]
                t = torch.arange(n_tiles, device="cuda")[:, None]
                want = (e * 7 + t * 3 + seed + 100 * prev).float()
                assert torch.equal(got.view(n_tiles, te), want), "wrong tile received"
        finally:
            self.heap.free(inbox)
            self.heap.free(outbox)

    def exchange(self, n_tiles: int, grid: int) -> None:
        w, te = self.world, 1024
        board = self.heap.zeros((n_tiles * w * te,), torch.float32)
        got = torch.zeros(n_tiles * w * te, device="cuda")
        try:
            for seed in (1, 2, 3):  # back to back: a wait that returned early reads an old row
                exchange_with_all[(grid,)](self.heap.ctx, board, got, n_tiles, self.rank, w, seed, self.status,
                                           TE=te, num_warps=4)
            torch.cuda.synchronize()
            self.check_status(grid)
            e = torch.arange(te, device="cuda")[None, None, :]
            t = torch.arange(n_tiles, device="cuda")[:, None, None]
            p = torch.arange(w, device="cuda")[None, :, None]
            want = (e * 7 + t * 3 + 3 + 100 * p).float()
            assert torch.equal(got.view(n_tiles, w, te), want), "wrong row received"
        finally:
            self.heap.free(board)

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
