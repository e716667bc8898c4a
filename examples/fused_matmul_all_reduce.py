"""Fuse an all-reduce into your own Triton GEMM: the row-parallel linear of tensor parallelism.

    torchrun --nproc_per_node=2 examples/fused_matmul_all_reduce.py

Each rank holds a [M, K/world] slice of the activations and a [K/world, N] slice of the weight;
the output is the sum over ranks of their products. One persistent kernel, in which no CTA waits
for another rank while there is GEMM work left:
1. Per tile: the first part of the K loop; push the PREVIOUS tile's partial (staged in `out`)
   into every peer's inbox with plain stores through `ilt.peer_pointer`; the rest of the K loop;
   signal the previous tile (`symm_tile_signal_others`); stage this tile's partial in `out`.
   CTAs push at different points of their K loops, so pushes spread over time instead of
   queueing every CTA behind NVLink at once.
2. Then the tile of two steps back: wait for every peer's partial (`symm_tile_wait_others`: they
   came in during a whole tile), sum the ranks' partials in rank order in fp32 (bitwise the same
   on every rank), tell the peers their slot in this inbox is read (tile index tiles + t).
3. Before the launch ends: wait until every peer has read this rank's partials, so the next
   launch may overwrite them.
`ironlink.matmul_all_reduce` does the same, with a TMA push, any shape and layout, and a
double-buffered inbox instead of step 3 (docs/fused.md). Prints the error against a float64
reference and the times of this kernel, the library op and torch.matmul + ironlink.all_reduce.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import ironlink
import ironlink.language as il
import ironlink.typed as ilt

M, N, K_TOTAL = 4096, 8192, 8192
BM, BN, BK, STAGGER = 128, 256, 64, 8


@triton.jit
def _tile_origin(t, tiles_n, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    """Tile t's first row and column: groups of GROUP tile rows walked column by column, so the
    CTAs of one wave share b's columns in L2."""
    group, rows = t // (GROUP * tiles_n), t % (GROUP * tiles_n)
    return (group * GROUP + rows % GROUP) * BM, (rows // GROUP) * BN


@ironlink.jit(do_not_specialize=["ctx"])
def gemm_all_reduce(ctx, a, b, out, inbox, M, K, status, N: tl.constexpr, WORLD: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGGER: tl.constexpr):
    pid, grid = tl.program_id(0), tl.num_programs(0)
    rank = il.symm_rank(ctx)
    tiles_n = N // BN
    tiles = (M // BM) * tiles_n  # (shapes are multiples of the tile here: no masks)
    split = (pid % STAGGER) * (K // BK) // STAGGER * BK  # where in the K loop this CTA pushes
    worst = pid * 0
    prev, prev2 = pid * 0 - 1, pid * 0 - 1  # the tiles one and two steps back
    for t in range(pid, tiles + 2 * grid, grid):  # two steps past the last tile: push it, sum it
        m0, n0 = _tile_origin(t, tiles_n, BM, BN, 8)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for part in tl.static_range(2):  # the K loop in two parts: [0, split), then [split, K)
            if t < tiles:  # a, b: TMA descriptors (Hopper's copy engine loads the operand tiles)
                for k0 in range(split * part, split + (K - split) * part, BK):
                    acc = tl.dot(a.load([m0, k0]), b.load([k0, n0]), acc)
            if (part == 0) & (prev >= 0) & (prev < tiles):  # prev's partial into every peer's inbox
                pm, pn = _tile_origin(prev, tiles_n, BM, BN, 8)
                for r0 in tl.static_range(0, BM, 32):  # 32 rows at a time: acc holds most registers
                    rows = (pm + r0 + tl.arange(0, 32))[:, None].to(tl.int64) * N + (pn + tl.arange(0, BN))[None, :]
                    v = tl.load(out + rows)
                    for k in tl.static_range(1, WORLD):
                        dst = ilt.peer_pointer(ctx, inbox, (rank + k) % WORLD) + rank.to(tl.int64) * M * N
                        tl.store(dst + rows, v)
        if (prev >= 0) & (prev < tiles):
            worst = ilt.failure_or(il.symm_tile_signal_others(ctx, prev), worst)
        offs = (m0 + tl.arange(0, BM))[:, None].to(tl.int64) * N + (n0 + tl.arange(0, BN))[None, :]
        if t < tiles:
            tl.store(out + offs, acc.to(tl.bfloat16))  # this tile's partial, staged
        if (prev2 >= 0) & (prev2 < tiles) & (worst == 0):  # sum prev2: its peers' partials are in
            worst = il.symm_tile_wait_others(ctx, prev2)
            pm, pn = _tile_origin(prev2, tiles_n, BM, BN, 8)
            for r0 in tl.static_range(0, BM, 32):
                rows = (pm + r0 + tl.arange(0, 32))[:, None].to(tl.int64) * N + (pn + tl.arange(0, BN))[None, :]
                total = tl.zeros((32, BN), dtype=tl.float32)
                for q in tl.static_range(WORLD):  # rank order: the same bits on every rank
                    total += tl.load(tl.where(q == rank, out, inbox + q * M * N) + rows).to(tl.float32)
                if worst == 0:
                    tl.store(out + rows, total.to(tl.bfloat16))
            worst = ilt.failure_or(il.symm_tile_signal_others(ctx, tiles + prev2), worst)  # slot read
        prev2, prev = prev, t
    for t in range(pid, tiles, grid):  # every peer has read this rank's partials: the next launch
        if worst == 0:                 # may overwrite them
            worst = il.symm_tile_wait_others(ctx, tiles + t)
    tl.store(status + pid, worst)


def main() -> int:
    from ironlink.bench import time_graph  # loads the compiled extension: only where it runs

    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    k = K_TOTAL // world
    gen = torch.Generator(device="cuda").manual_seed(rank)
    a = torch.randn(M, k, device="cuda", generator=gen).to(torch.bfloat16)
    b = (torch.randn(k, N, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
    # out, the inbox, the library's output and its workspace (2 x (world - 1) partial slots).
    with ironlink.SymmetricHeap((3 * world + 2) * M * N * 2 + (64 << 20)) as heap:
        out, inbox = heap.empty((M, N), torch.bfloat16), heap.empty((world, M, N), torch.bfloat16)
        status = torch.zeros(256, dtype=torch.int32, device="cuda")
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        grid = (min(sms, (M // BM) * (N // BN)),)  # resident: a CTA waits for peers' CTAs

        a_desc = TensorDescriptor(a, list(a.shape), list(a.stride()), [BM, BK])
        b_desc = TensorDescriptor(b, list(b.shape), list(b.stride()), [BK, BN])

        def fused() -> None:
            gemm_all_reduce[grid](heap.ctx, a_desc, b_desc, out, inbox, M, k, status, N=N, WORLD=world, BM=BM,
                                  BN=BN, BK=BK, STAGGER=STAGGER, num_warps=8, num_stages=3)

        fused()
        heap.check()
        parts = [torch.empty_like(a) for _ in range(world)], [torch.empty_like(b) for _ in range(world)]
        dist.all_gather(parts[0], a)
        dist.all_gather(parts[1], b)
        ref = sum(x.double() @ y.double() for x, y in zip(*parts))
        err = ((out.double() - ref).norm() / ref.norm()).item()
        ours = out.clone()
        dist.broadcast(ours, 0)
        same = bool(torch.equal(ours, out))
        lib_out = heap.empty((M, N), torch.bfloat16)
        t_fused = time_graph(fused, out.nbytes)
        t_lib = time_graph(lambda: ironlink.matmul_all_reduce(a, b, out=lib_out, heap=heap), out.nbytes)
        t_pair = time_graph(lambda: (torch.matmul(a, b, out=lib_out), ironlink.all_reduce(lib_out, heap=heap)),
                            out.nbytes)
        heap.check()
        ok = err < 1e-2 and same
        if rank == 0:
            print(f"fused GEMM + all-reduce [{M}, {k}] x [{k}, {N}] on {world} GPUs: relative error {err:.2e}, "
                  f"bitwise equal on every rank: {same}; this kernel {t_fused:.1f} us, ironlink.matmul_all_reduce "
                  f"{t_lib:.1f} us, torch.matmul + ironlink.all_reduce {t_pair:.1f} us", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
