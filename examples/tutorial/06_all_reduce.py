"""Lesson 6: reduce-scatter and all-reduce; one-shot against two-shot.

    torchrun --nproc_per_node=4 examples/tutorial/06_all_reduce.py

Two ways to sum `x` over ranks, both with peer loads and stores (lesson 1) between barriers
(`il.symm_barrier`, lesson 3: at entry every input is complete, at exit every result is):

one-shot: every rank loads ALL of every peer's x and sums it. One step, but each rank reads
    world x n elements over its links: the fastest for small messages, wasteful for large ones.
two-shot: (1) reduce-scatter: rank r sums only block r (n / world elements) from every peer;
    (2) all-gather: it stores that reduced block into every peer's out. Each rank moves about
    2 n elements whatever the world size: the one that wins as messages grow.

The library picks between these (and LL variants, lesson 5) by size: docs/algorithms.md.
Summing in rank order 0..world-1 gives every rank the same bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

import ironlink
import ironlink.language as il
import ironlink.typed as ilt
from _common import finish, start, time_us

N = 1 << 18  # fp32 elements (1 MiB)
BLOCK = 2048
CTAS = 32


@ironlink.jit
@triton.jit
def one_shot_all_reduce(ctx, x, out, n, world, status, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    s = il.symm_barrier(ctx)  # every rank's x is complete
    for base in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = base + tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK,), tl.float32)
        for p in range(world):
            acc += tl.load(ilt.peer_pointer(ctx, x, p) + offs, mask=offs < n)
        tl.store(out + offs, acc, mask=offs < n)
    s |= il.symm_barrier(ctx)  # nobody still reads our x when the next call changes it
    tl.store(status + pid, s)


@ironlink.jit
@triton.jit
def two_shot_all_reduce(ctx, x, out, n, rank, world, status, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    per_rank = tl.cdiv(n, world)  # block r: [r * per_rank, (r + 1) * per_rank)
    s = il.symm_barrier(ctx)
    for base in range(pid * BLOCK, per_rank, tl.num_programs(0) * BLOCK):
        offs = rank * per_rank + base + tl.arange(0, BLOCK)
        mask = (offs < n) & (base + tl.arange(0, BLOCK) < per_rank)
        acc = tl.zeros((BLOCK,), tl.float32)
        for p in range(world):  # (1) reduce-scatter: block `rank` from every rank
            acc += tl.load(ilt.peer_pointer(ctx, x, p) + offs, mask=mask)
        for p in range(world):  # (2) all-gather: push the sum into every rank's out
            tl.store(ilt.peer_pointer(ctx, out, p) + offs, acc, mask=mask)
    s |= il.symm_barrier(ctx)  # every block of our out has arrived (and nobody reads our x)
    tl.store(status + pid, s)


def main() -> None:
    import torch  # in main, not above: CI compiles the kernels without torch
    import torch.distributed as dist

    lesson = start(heap_bytes=4 * N * 4 + (1 << 20))
    rank, world, heap, status = lesson.rank, lesson.world, lesson.heap, lesson.status
    x, out = heap.empty((N,), torch.float32), heap.empty((N,), torch.float32)
    x.copy_(torch.randint(-8, 8, (N,), device="cuda"))  # small integers: every sum is exact
    want = x.clone()
    dist.all_reduce(want)

    one = lambda: one_shot_all_reduce[(CTAS,)](heap.ctx, x, out, N, world, status, BLOCK=BLOCK)  # noqa: E731
    two = lambda: two_shot_all_reduce[(CTAS,)](heap.ctx, x, out, N, rank, world, status, BLOCK=BLOCK)  # noqa: E731
    one()
    ok = torch.equal(out, want)
    out.zero_()
    two()
    ok = ok and torch.equal(out, want)

    ours = {"one-shot": time_us(one, N * 4), "two-shot": time_us(two, N * 4)}
    y = heap.zeros((N,), torch.float32)
    lib = time_us(lambda: ironlink.all_reduce(y, heap=heap), N * 4)
    finish(lesson, "06", "all-reduce", ok, N * 4, ours, "ironlink.all_reduce", lib)


if __name__ == "__main__":
    main()
