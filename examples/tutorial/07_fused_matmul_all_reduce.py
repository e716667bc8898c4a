"""Lesson 7: fuse the producer with the collective: matmul + tile all-reduce in one kernel.

    torchrun --nproc_per_node=4 examples/tutorial/07_fused_matmul_all_reduce.py

Tensor parallelism's row-parallel linear: each rank holds a slice of K, computes a partial
out = a @ b, and the partials are summed over ranks. Unfused, the all-reduce waits for the whole
matmul. Fused, each CTA all-reduces ITS OWN output tile as soon as it has stored it, with
`ilt.tile_all_reduce(ctx, tile_ptr, rows, cols, row_stride, tile_index)`: the calling CTA alone
exchanges that tile with the CTA holding the same tile index on every other rank, so one tile
travels while other CTAs still multiply.

Why a tile call and not `il.symm_all_reduce` from lessons 3-6: those split the WHOLE tensor among
CTAs, so every CTA's part would have to be complete first (a grid barrier). A tile call names its
own region, which only this CTA wrote. Tiles are matched by index, so every rank must all-reduce
every tile index the same number of times, in the same order, with all CTAs resident at once
(here: one tile per CTA). The library's `ironlink.matmul_all_reduce` is this kernel grown up
(persistent CTAs, grouped tile order, tuned tile shapes).
"""

from __future__ import annotations

import triton
import triton.language as tl

import ironlink
import ironlink.typed as ilt
from _common import finish, start, time_us

M, N, K = 256, 2048, 128  # out [M, N] fp16 (1 MiB); this rank's slice of the reduction is K
BM, BN, BK = 64, 128, 64


@ironlink.jit
@triton.jit
def matmul_all_reduce(ctx, a, b, out, M, N, K, status, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    tile = tl.program_id(0)  # one output tile per CTA; its index names it on every rank
    tiles_n = tl.cdiv(N, BN)
    m0, n0 = (tile // tiles_n) * BM, (tile % tiles_n) * BN
    rm, rn, rk = m0 + tl.arange(0, BM), n0 + tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):  # the producer: a plain Triton matmul tile
        at = tl.load(a + rm[:, None] * K + (k0 + rk)[None, :], mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K))
        bt = tl.load(b + (k0 + rk)[:, None] * N + rn[None, :], mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N))
        acc = tl.dot(at, bt, acc)
    tl.store(out + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))
    # The tile is in `out` (this CTA's own stores): all-reduce it now, in place.
    s = ilt.tile_all_reduce(ctx, out + m0 * N + n0, tl.minimum(BM, M - m0), tl.minimum(BN, N - n0), N, tile)
    tl.store(status + tile, s)


def main() -> None:
    import torch  # in main, not above: CI compiles the kernels without torch
    import torch.distributed as dist

    def heap_bytes(world: int) -> int:  # out and lib_out, then the library op's workspaces (8 MiB at world 4)
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        return 2 * M * N * 2 + ironlink.matmul_all_reduce.heap_bytes(M, N, K, world, "float16", sms)

    lesson = start(heap_bytes)
    rank, world, heap, status = lesson.rank, lesson.world, lesson.heap, lesson.status
    # Entries in {-1, 0, 1}: every partial and every sum (|x| <= K * world = 1024) is exact in fp16.
    a = torch.randint(-1, 2, (M, K), device="cuda").half()
    b = torch.randint(-1, 2, (K, N), device="cuda").half()
    out = heap.empty((M, N), torch.float16)
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)

    run = lambda: matmul_all_reduce[grid](heap.ctx, a, b, out, M, N, K, status, BM=BM, BN=BN, BK=BK)  # noqa: E731
    run()
    want = (a.float() @ b.float()).half()
    dist.all_reduce(want)  # torch's answer: the partials summed over ranks
    ok = torch.equal(out, want)

    us = time_us(run, M * N * 2)
    lib_out = heap.empty((M, N), torch.float16)
    lib = time_us(lambda: ironlink.matmul_all_reduce(a, b, out=lib_out, heap=heap), M * N * 2)
    finish(lesson, "07", "matmul + tile all-reduce", ok, M * N * 2, {"": us}, "ironlink.matmul_all_reduce", lib)


if __name__ == "__main__":
    main()
