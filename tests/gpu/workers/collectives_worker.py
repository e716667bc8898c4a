"""GPU suite of the device collectives, one process per GPU (run under torchrun by `tests/gpu/run.sh collectives`).

Every collective x dtype x op over sizes from 1 element to 256 MiB, grids of 1 to 132 CTAs,
num_warps 4 and 8, fresh random data each case, outputs poisoned first, results against a
float64 reference and bitwise equal on all ranks; 1000 back-to-back launches; CUDA graph capture
and replay with new data; every error code. Prints one pytest-style summary line per rank-0 run.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import ironlink
from ironlink.runtime.distributed import grid_cap
import ironlink.language as il
import ironlink.tuning
from ironlink.language import _abi

from _cases import SMALL, Cases, heap_timeout_s, renewed, same_on_all_ranks, small  # tests/gpu/workers/, the script's own directory

S = _abi.STATUS
OPS = _abi.REDUCE_OP
DT = {torch.float32: _abi.DTYPE["FLOAT32"], torch.float16: _abi.DTYPE["FLOAT16"], torch.bfloat16: _abi.DTYPE["BFLOAT16"]}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

# The kernels' integer arguments are not specialized (Triton would compile a variant for each
# value that is 1 or a multiple of 16): the soak calls them with random sizes, offsets, ops,
# dtypes and roots at five num_warps, and the variants alone outlasted a 6-minute run at world 2.

@ironlink.jit
@triton.jit(do_not_specialize=["ctx", "off", "n", "op", "dt"])
def all_reduce_k(ctx, buf, off, n, op, dt, status):
    s = il.symm_all_reduce(ctx, buf, off, n, op, dt)
    tl.store(status + tl.program_id(0), s)


@ironlink.jit
@triton.jit(do_not_specialize=["ctx", "n", "op", "dt"])
def reduce_scatter_k(ctx, inp, out, n, op, dt, status):
    tl.store(status + tl.program_id(0), il.symm_reduce_scatter(ctx, inp, out, n, op, dt))


@ironlink.jit
@triton.jit(do_not_specialize=["ctx", "n", "dt"])
def all_gather_k(ctx, inp, out, n, dt, status):
    tl.store(status + tl.program_id(0), il.symm_all_gather(ctx, inp, out, n, dt))


@ironlink.jit
@triton.jit(do_not_specialize=["ctx", "n", "dt", "root"])
def broadcast_k(ctx, buf, n, dt, root, status):
    tl.store(status + tl.program_id(0), il.symm_broadcast(ctx, buf, n, dt, root))


@ironlink.jit
@triton.jit(do_not_specialize=["ctx", "n", "op", "dt", "root"])
def reduce_k(ctx, inp, out, n, op, dt, root, status):
    tl.store(status + tl.program_id(0), il.symm_reduce(ctx, inp, out, n, op, dt, root))


@ironlink.jit
@triton.jit(do_not_specialize=["ctx", "n", "dt"])
def all_to_all_k(ctx, inp, out, n, dt, status):
    tl.store(status + tl.program_id(0), il.symm_all_to_all(ctx, inp, out, n, dt))


@ironlink.jit
@triton.jit(do_not_specialize=["ctx"])
def barrier_k(ctx, status):
    tl.store(status + tl.program_id(0), il.symm_barrier(ctx))


@ironlink.jit
@triton.jit(do_not_specialize=["ctx"])
def ring_k(ctx, src, put_dst, get_dst, nbytes, right, left, slot0, expect, status):
    # Put my block into my right neighbour, tell it so, wait for my left neighbour's put, then
    # fetch my left neighbour's source block too; every CTA uses its own slot and area.
    pid = tl.program_id(0)
    off = pid * nbytes
    s = il.symm_put(ctx, put_dst + off, src, nbytes, right)
    s = tl.where(s == 0, il.symm_signal(ctx, slot0 + pid, 1, 1, right), s)
    s = tl.where(s == 0, il.symm_signal_wait(ctx, slot0 + pid, 4, expect), s)
    s = tl.where(s == 0, il.symm_get(ctx, get_dst + off, src, nbytes, left), s)
    s = tl.where(s == 0, il.symm_barrier(ctx), s)
    tl.store(status + pid, s)


class Suite(Cases):
    def __init__(self, heap: "ironlink.SymmetricHeap") -> None:
        super().__init__(renew=self.renew_heap)
        self.heap = heap
        self.world = dist.get_world_size()
        self.status = torch.zeros(_abi.MAX_CTAS, dtype=torch.int32, device="cuda")
        self.case = 0
        self.slot_next = 0  # first user signal slot not used yet
        # The limits the heap was created with (tuned for this world size, else the defaults).
        self.limits0 = heap.algorithm_limits

    def renew_heap(self) -> None:
        """A new heap of the same size after a case that raised IronlinkError (collective): a
        timeout leaves the old one's counters disagreeing (docs/device-api.md)."""
        if not self.heap.closed:  # the cases after the suite's heap closed make their own
            self.heap = renewed(self.heap)
            self.slot_next, self.limits0 = 0, self.heap.algorithm_limits

    # --- helpers -----------------------------------------------------------------------------
    def launch_cfg(self) -> tuple[int, int]:
        """Rotates grids (1..132 CTAs, at most the rank's share of a GPU that ranks share) and
        num_warps (4, 8) across cases; same on every rank."""
        self.case += 1
        grids = [1, 2, 7, 16, 32, 64, 132]
        grid = min(grids[self.case % len(grids)], grid_cap(torch.cuda.current_device()))
        return grid, (4, 8)[self.case // len(grids) % 2]

    def check_status(self, grid: int, want: int = 0) -> None:
        got = self.status[:grid].tolist()
        assert all(s == want for s in got), f"statuses {sorted(set(got))}, want {want}"

    def gather64(self, t: torch.Tensor) -> list[torch.Tensor]:
        x = t.to(torch.float64)
        out = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(out, x)
        return out

    @staticmethod
    def reduce_ref(xs: list[torch.Tensor], op: str) -> torch.Tensor:
        st = torch.stack(xs)
        if op == "SUM":
            return st.sum(0)
        if op == "AVG":
            return st.mean(0)
        if op == "PROD":
            return st.prod(0)
        if op == "MAX":
            return st.max(0).values
        return st.min(0).values

    @classmethod
    def magnitude_ref(cls, xs: list[torch.Tensor], op: str) -> torch.Tensor:
        """The reduction of the inputs' magnitudes: what a rounding error of the reduction scales
        with. Relative to the result alone, a sum that cancels (one element of eight ranks, a
        reduce-scatter's slice) fails on a last-bit difference in the order of the adds."""
        return cls.reduce_ref([x.abs() for x in xs], "MAX" if op in ("MAX", "MIN") else op)

    def close(self, what: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype,
              magnitude: Optional[torch.Tensor] = None) -> None:
        g = got.to(torch.float64)
        assert not torch.isnan(g).any(), f"{what}: NaN in the output (an element was not written)"
        scale = (want if magnitude is None else magnitude).abs().max().clamp_min(1e-30)
        err = ((g - want).abs().max() / scale).item()
        assert err <= TOL[dtype], f"{what}: max rel error {err:.3e} > {TOL[dtype]}"

    def data(self, n: int, dtype: torch.dtype, op: str = "SUM") -> torch.Tensor:
        if op == "PROD":
            return (torch.rand(n, device="cuda") + 0.5).to(dtype)
        return (torch.randn(n, device="cuda") * 2).to(dtype)


    # --- cases -------------------------------------------------------------------------------
    def all_reduce(self, n: int, dtype: torch.dtype, op: str, skew: int = 0) -> None:
        grid, warps = self.launch_cfg()
        buf = self.heap.empty((n + skew,), dtype)
        x = self.data(n, dtype, op)
        buf[skew:].copy_(x)
        xs = self.gather64(x)
        ref, mag = self.reduce_ref(xs, op), self.magnitude_ref(xs, op)
        all_reduce_k[(grid,)](self.heap.ctx, buf, skew * buf.element_size(), n, OPS[op], DT[dtype], self.status, num_warps=warps)
        torch.cuda.synchronize()
        self.check_status(grid)
        self.close(f"grid={grid} warps={warps}", buf[skew:], ref, dtype, mag)
        same_on_all_ranks(buf[skew:])
        self.heap.free(buf)

    def reduce_scatter(self, n: int, dtype: torch.dtype, op: str) -> None:
        grid, warps = self.launch_cfg()
        inp = self.heap.empty((self.world * n,), dtype)
        out = self.heap.empty((n,), dtype)
        inp.copy_(self.data(self.world * n, dtype, op))
        out.fill_(float("nan"))
        xs, mine = self.gather64(inp), slice(self.rank * n, (self.rank + 1) * n)
        ref, mag = self.reduce_ref(xs, op)[mine], self.magnitude_ref(xs, op)[mine]
        reduce_scatter_k[(grid,)](self.heap.ctx, inp, out, n, OPS[op], DT[dtype], self.status, num_warps=warps)
        torch.cuda.synchronize()
        self.check_status(grid)
        self.close(f"grid={grid}", out, ref, dtype, mag)
        self.heap.free(out)
        self.heap.free(inp)

    def all_gather(self, n: int, dtype: torch.dtype, in_place: bool) -> None:
        grid, warps = self.launch_cfg()
        out = self.heap.empty((self.world * n,), dtype)
        out.fill_(float("nan"))
        x = self.data(n, dtype)
        inp = out[self.rank * n : (self.rank + 1) * n] if in_place else self.heap.empty((n,), dtype)
        inp.copy_(x)
        want = torch.cat(self.gather64(x))
        all_gather_k[(grid,)](self.heap.ctx, inp, out, n, DT[dtype], self.status, num_warps=warps)
        torch.cuda.synchronize()
        self.check_status(grid)
        assert torch.equal(out.to(torch.float64), want), "gathered values differ"
        if not in_place:
            self.heap.free(inp)
        self.heap.free(out)

    def broadcast(self, n: int, dtype: torch.dtype, root: int) -> None:
        grid, warps = self.launch_cfg()
        buf = self.heap.empty((n,), dtype)
        x = self.data(n, dtype)
        buf.copy_(x)
        want = self.gather64(x)[root]
        broadcast_k[(grid,)](self.heap.ctx, buf, n, DT[dtype], root, self.status, num_warps=warps)
        torch.cuda.synchronize()
        self.check_status(grid)
        assert torch.equal(buf.to(torch.float64), want), "broadcast values differ"
        self.heap.free(buf)

    def reduce(self, n: int, dtype: torch.dtype, op: str, root: int) -> None:
        grid, warps = self.launch_cfg()
        inp = self.heap.empty((n,), dtype)
        out = self.heap.empty((n,), dtype)
        x = self.data(n, dtype, op)
        inp.copy_(x)
        out.fill_(float("nan"))
        xs = self.gather64(x)
        ref, mag = self.reduce_ref(xs, op), self.magnitude_ref(xs, op)
        reduce_k[(grid,)](self.heap.ctx, inp, out, n, OPS[op], DT[dtype], root, self.status, num_warps=warps)
        torch.cuda.synchronize()
        self.check_status(grid)
        if self.rank == root:
            self.close("root", out, ref, dtype, mag)
        else:
            assert torch.isnan(out.float()).all(), "a non-root rank's output was written"
        self.heap.free(out)
        self.heap.free(inp)

    def all_to_all(self, n: int, dtype: torch.dtype) -> None:
        grid, warps = self.launch_cfg()
        inp = self.heap.empty((self.world * n,), dtype)
        out = self.heap.empty((self.world * n,), dtype)
        x = self.data(self.world * n, dtype)
        inp.copy_(x)
        out.fill_(float("nan"))
        allx = self.gather64(x)
        want = torch.cat([allx[p][self.rank * n : (self.rank + 1) * n] for p in range(self.world)])
        all_to_all_k[(grid,)](self.heap.ctx, inp, out, n, DT[dtype], self.status, num_warps=warps)
        torch.cuda.synchronize()
        self.check_status(grid)
        assert torch.equal(out.to(torch.float64), want), "all_to_all blocks differ"
        self.heap.free(out)
        self.heap.free(inp)

    def back_to_back(self, launches: int) -> None:
        """`launches` launches with no host sync, cycling through a tiny message (one unit: most
        CTAs idle), a one-shot size and a large size."""
        sizes = (3, 1000, 1 << 20)
        bufs = [self.heap.empty((n,), torch.bfloat16) for n in sizes]
        xs = [self.data(n, torch.bfloat16) for n in sizes]
        for b, x in zip(bufs, xs):
            b.copy_(x)
        # MAX is idempotent, so after any number of calls the result is the first call's.
        refs = [self.reduce_ref(self.gather64(x), "MAX") for x in xs]
        st = torch.zeros(launches, 132, dtype=torch.int32, device="cuda")
        for i in range(launches):
            k = i % len(sizes)
            all_reduce_k[(32,)](self.heap.ctx, bufs[k], 0, sizes[k], OPS["MAX"], DT[torch.bfloat16], st[i], num_warps=4)
        torch.cuda.synchronize()
        assert (st[:, :32] == 0).all(), f"statuses {st.unique().tolist()}"
        for n, b, ref in zip(sizes, bufs, refs):
            self.close(f"n={n}", b, ref, torch.bfloat16)
        for b in bufs:
            self.heap.free(b)

    def forced(self, alg: str, case: Callable[[], None]) -> None:
        """Runs `case` with the context's limits set so that `alg` is chosen where it fits."""
        self.heap.set_algorithm_limits(*ironlink.tuning.FORCED_LIMITS[alg])
        try:
            case()
        finally:
            self.heap.set_algorithm_limits(*self.limits0)

    def cuda_graph(self) -> None:
        """Capture copy-in + all-reduce (one-shot and two-shot), replay with new data each time."""
        sizes = (3000, 1 << 21)
        bufs = [self.heap.empty((n,), torch.bfloat16) for n in sizes]
        srcs = [torch.empty(n, dtype=torch.bfloat16, device="cuda") for n in sizes]
        for s in srcs:
            s.copy_(self.data(s.numel(), torch.bfloat16))
        for b, s, n in zip(bufs, srcs, sizes):  # warm up (compile) outside the capture
            b.copy_(s)
            all_reduce_k[(16,)](self.heap.ctx, b, 0, n, OPS["SUM"], DT[torch.bfloat16], self.status, num_warps=8)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            with torch.cuda.graph(g, stream=stream):
                for b, s, n in zip(bufs, srcs, sizes):
                    b.copy_(s)
                    all_reduce_k[(16,)](self.heap.ctx, b, 0, n, OPS["SUM"], DT[torch.bfloat16], self.status, num_warps=8)
        torch.cuda.current_stream().wait_stream(stream)
        for replay in range(5):
            for s in srcs:
                s.copy_(self.data(s.numel(), torch.bfloat16))
            refs = [self.reduce_ref(self.gather64(s), "SUM") for s in srcs]
            self.heap.barrier()
            g.replay()
            torch.cuda.synchronize()
            self.check_status(16)
            for b, ref in zip(bufs, refs):
                self.close(f"replay {replay}", b, ref, torch.bfloat16)
                same_on_all_ranks(b)
        del g
        for b in bufs:
            self.heap.free(b)

    def primitives(self, nbytes: int, grid: int, rounds: int) -> None:
        """put + signal(ADD) + signal_wait(GE) + get + barrier around a ring, `rounds` times."""
        right, left = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        src = self.heap.empty((nbytes,), torch.uint8)
        put_dst = self.heap.empty((grid * nbytes,), torch.uint8)
        get_dst = self.heap.empty((grid * nbytes,), torch.uint8)
        for r in range(rounds):
            src.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda"))
            put_dst.fill_(0)
            get_dst.fill_(0)
            theirs = [torch.empty_like(src) for _ in range(self.world)]
            dist.all_gather(theirs, src)
            self.heap.barrier()
            ring_k[(grid,)](self.heap.ctx, src, put_dst, get_dst, nbytes, right, left, self.slot_next, r + 1, self.status, num_warps=4)
            torch.cuda.synchronize()
            self.check_status(grid)
            for g in range(grid):
                assert torch.equal(put_dst[g * nbytes : (g + 1) * nbytes], theirs[left]), f"put, cta {g}, round {r}"
                assert torch.equal(get_dst[g * nbytes : (g + 1) * nbytes], theirs[left]), f"get, cta {g}, round {r}"
        self.slot_next += grid  # signal slots only grow (ADD): the next test takes fresh ones
        self.heap.free(get_dst)
        self.heap.free(put_dst)
        self.heap.free(src)

    def errors(self) -> None:
        buf = self.heap.empty((1024,), torch.float32)
        buf.fill_(1.0)
        before = buf.clone()
        cases = [
            ("null context", 0, buf, 0, 16, OPS["SUM"], DT[torch.float32], S["NULL_CONTEXT"]),
            ("bad op", self.heap.ctx, buf, 0, 16, 99, DT[torch.float32], S["UNSUPPORTED_OP"]),
            ("bad dtype", self.heap.ctx, buf, 0, 16, OPS["SUM"], 9, S["UNSUPPORTED_DTYPE"]),
            ("past the heap", self.heap.ctx, buf, 0, 1 << 40, OPS["SUM"], DT[torch.float32], S["OUT_OF_BOUNDS"]),
            ("misaligned", self.heap.ctx, buf, 2, 16, OPS["SUM"], DT[torch.float32], S["MISALIGNED"]),
        ]
        for what, ctx, b, off, n, op, dt, want in cases:
            all_reduce_k[(4,)](ctx, b, off, n, op, dt, self.status, num_warps=4)
            torch.cuda.synchronize()
            got = self.status[:4].tolist()
            assert got == [want] * 4, f"{what}: got {got}, want {want}"
        foreign = torch.zeros(64, dtype=torch.int64, device="cuda")  # not an ironlink context
        all_reduce_k[(4,)](foreign.data_ptr(), buf, 0, 16, OPS["SUM"], DT[torch.float32], self.status, num_warps=4)
        torch.cuda.synchronize()
        assert self.status[:4].tolist() == [S["UNKNOWN_CONTEXT"]] * 4, "foreign context"
        assert torch.equal(buf, before), "a rejected call changed the buffer"
        self.heap.check()  # argument errors are returned, not recorded
        self.heap.free(buf)


def timeout_case(suite: Suite) -> None:
    """Rank 0 waits in a barrier nobody else joins: TIMEOUT, recorded, raised by heap.check()."""
    heap = ironlink.SymmetricHeap(1 << 20, timeout_s=0.5)
    try:
        if suite.rank == 0:
            t0 = time.time()
            barrier_k[(2,)](heap.ctx, suite.status, num_warps=4)
            torch.cuda.synchronize()
            assert suite.status[:2].tolist() == [S["TIMEOUT"]] * 2, f"statuses {suite.status[:2].tolist()}"
            assert time.time() - t0 < 5, "the timeout took too long"
            try:
                heap.check()
            except ironlink.IronlinkError as e:
                assert "TIMEOUT" in str(e), str(e)
            else:
                raise AssertionError("heap.check() did not raise after a device timeout")
        dist.barrier()
    finally:
        heap.close()


def main() -> int:
    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234 + rank)
    full = os.environ.get("IRONLINK_GPU_FULL", "1") == "1" and not SMALL
    heap = ironlink.SymmetricHeap(2 << 30, timeout_s=heap_timeout_s())
    s = Suite(heap)
    t0 = time.time()
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    sizes = list(small([1, 7, 1023, 4099, (1 << 16) + 3, 1 << 20], [7, 4099])) + ([1 << 23] if full else [])
    for dtype in dtypes:
        for op in OPS:
            for i, n in enumerate(sizes):
                skew = 1 if i == 2 else 0  # one case starts off the 16-byte grid
                s.run(f"all_reduce {dtype} {op} n={n} skew={skew}", lambda: s.all_reduce(n, dtype, op, skew))
    for alg in ("one_shot_ll", "two_shot_ll", "two_shot"):
        for dtype, op in ((torch.bfloat16, "SUM"), (torch.float32, "MAX"), (torch.float16, "AVG")):
            for n in small((1, 7, 4099, (1 << 16) + 3, 1 << 19), (7, 4099)):
                s.run(f"all_reduce {alg} {dtype} {op} n={n}", lambda: s.forced(alg, lambda: s.all_reduce(n, dtype, op)))
    for alg in ("gather_ll", "gather_bulk"):
        for dtype in dtypes:
            for n in small((1, 5, 4097), (5,)):
                for op in ("SUM", "AVG"):
                    s.run(f"reduce_scatter {alg} {dtype} {op} n={n}",
                          lambda: s.forced(alg, lambda: s.reduce_scatter(n, dtype, op)))
                for in_place in (False, True):
                    s.run(f"all_gather {alg} {dtype} n={n} in_place={in_place}",
                          lambda: s.forced(alg, lambda: s.all_gather(n, dtype, in_place)))
    for dtype, n in [(torch.bfloat16, 128 << 20), (torch.float32, 64 << 20)] if full else []:  # 256 MiB
        s.run(f"all_reduce {dtype} SUM 256MiB", lambda: s.all_reduce(n, dtype, "SUM"))
    # Past the large-message switches of the two-shot all-reduce (the device's PUSH_MIN_BYTES and
    # SEPARATE_PHASES_MIN_BYTES; the sizes bracket them), with a partial last 16-byte unit; 16-byte
    # aligned (two-shot by stores through scratch) and not (from SEPARATE_PHASES_MIN_BYTES loads,
    # barrier, stores; below, loads and stores fused). (dtype, bytes, extra elements, op, skew):
    push, separate = _abi.THRESHOLDS["PUSH_MIN_BYTES"], _abi.THRESHOLDS["SEPARATE_PHASES_MIN_BYTES"]
    past_switch = [(torch.float16, separate, 5, "MAX", 0), (torch.bfloat16, separate * 3 // 2, 3, "AVG", 1),
                   (torch.float32, push * 3 // 2, 3, "SUM", 0), (torch.float32, push * 3, 1, "MIN", 1)]
    for dtype, nbytes, extra, op, skew in past_switch if full else []:
        n = nbytes // (torch.finfo(dtype).bits // 8) + extra
        s.run(f"all_reduce {dtype} {op} past-switch n={n} skew={skew}", lambda: s.all_reduce(n, dtype, op, skew))
    for dtype in dtypes:
        for n in small((1, 5, 4097, 1 << 18), (5, 4097)):
            for op in ("SUM", "MAX", "AVG"):
                s.run(f"reduce_scatter {dtype} {op} n={n}", lambda: s.reduce_scatter(n, dtype, op))
                s.run(f"reduce {dtype} {op} n={n}", lambda: s.reduce(n, dtype, op, n % world))
            for in_place in (False, True):
                s.run(f"all_gather {dtype} n={n} in_place={in_place}", lambda: s.all_gather(n, dtype, in_place))
            s.run(f"broadcast {dtype} n={n}", lambda: s.broadcast(n, dtype, (n + 1) % world))
            s.run(f"all_to_all {dtype} n={n}", lambda: s.all_to_all(n, dtype))
    for nbytes, grid in small(((1000, 3), (1 << 20, 16)), ((1000, 3),)):
        s.run(f"put/signal/wait/get/barrier ring {nbytes} B x {grid} CTAs", lambda: s.primitives(nbytes, grid, 3))
    if full:
        # The large end for the other collectives: 256 MiB buffers (world blocks of n bf16 for
        # all_gather's output and all_to_all; n for broadcast and reduce).
        big = (128 << 20) // world
        # reduce_scatter by stores: its input from the device's PUSH_REDUCE_SCATTER_MIN_BYTES on.
        rs_bytes = _abi.THRESHOLDS["PUSH_REDUCE_SCATTER_MIN_BYTES"]
        s.run(f"reduce_scatter bf16 SUM {rs_bytes >> 20}MiB input",
              lambda: s.reduce_scatter(rs_bytes // 2 // world, torch.bfloat16, "SUM"))
        s.run("all_gather bf16 256MiB output", lambda: s.all_gather(big, torch.bfloat16, False))
        s.run("all_to_all bf16 256MiB", lambda: s.all_to_all(big, torch.bfloat16))
        s.run("broadcast bf16 256MiB", lambda: s.broadcast(128 << 20, torch.bfloat16, world - 1))
        s.run("reduce bf16 SUM 256MiB", lambda: s.reduce(128 << 20, torch.bfloat16, "SUM", 0))
    launches = 50 if SMALL else 1000
    s.run(f"{launches} back-to-back launches", lambda: s.back_to_back(launches))
    s.run("cuda graph capture and replay", s.cuda_graph)
    s.run("error codes", s.errors)
    s.heap.close()
    if world > 1:  # one rank alone is never kept waiting in a barrier
        s.run("timeout", lambda: timeout_case(s))
    if rank == 0:
        summary = f"{s.passed} passed, {len(s.failed)} failed"
        for f in s.failed:
            print(f"FAILED {f}")
        print(f"== world {world}: {summary} in {time.time() - t0:.1f}s ==", flush=True)
    dist.destroy_process_group()
    return 1 if s.failed else 0


if __name__ == "__main__":
    sys.exit(main())
