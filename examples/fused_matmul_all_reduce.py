"""Fuse an all-reduce into your own Triton GEMM (the row-parallel linear of tensor parallelism).

    torchrun --nproc_per_node=2 examples/fused_matmul_all_reduce.py

Each rank multiplies its [M, K/world] x [K/world, N] slices; the output is their sum, two-shot: a
tile's owner gets the others' partials (each pushed inside the next tile's K loop, at K steps that
differ between CTAs), sums them in rank order two steps later and stores the sum into every rank's
`out`. A rank sends 2 (world - 1) / world outputs (one-shot, every partial to every peer: world - 1).
A launch ends once every sum came, so its partials were read: the next launch may overwrite them.
"""

import sys
from pathlib import Path

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
    """Tile t's first row and column: GROUP tile rows walked column by column (b's columns in L2)."""
    group, rows = t // (GROUP * tiles_n), t % (GROUP * tiles_n)
    return (group * GROUP + rows % GROUP) * BM, (rows // GROUP) * BN


@triton.jit
def _owner(t, grid, WORLD: tl.constexpr):  # who sums tile t: CTA t % grid's tiles take the ranks in turn
    return (t % grid + t // grid) % WORLD


@triton.jit
def _push(ctx, out, inbox, t, rank, owner, M, tiles_n, N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Tile t's partial (staged in `out`) into slot `rank` of its owner's inbox, 32 rows at a time."""
    m0, n0 = _tile_origin(t, tiles_n, BM, BN, 8)
    slot = ilt.peer_pointer(ctx, inbox, owner) + rank.to(tl.int64) * M * N
    for r0 in tl.static_range(0, BM, 32):
        rows = (m0 + r0 + tl.arange(0, 32))[:, None].to(tl.int64) * N + (n0 + tl.arange(0, BN))[None, :]
        tl.store(slot + rows, tl.load(out + rows))


@triton.jit
def _sum(ctx, out, inbox, t, tiles, rank, M, tiles_n, N: tl.constexpr, WORLD: tl.constexpr, BM: tl.constexpr,
         BN: tl.constexpr):
    """Own tile t summed in rank order once the peers' partials came, into every rank's out. A status."""
    s = il.symm_tile_wait_others(ctx, t)
    if s == 0:
        m0, n0 = _tile_origin(t, tiles_n, BM, BN, 8)
        for r0 in tl.static_range(0, BM, 32):
            rows = (m0 + r0 + tl.arange(0, 32))[:, None].to(tl.int64) * N + (n0 + tl.arange(0, BN))[None, :]
            total = tl.zeros((32, BN), dtype=tl.float32)
            for q in tl.static_range(WORLD):
                total += tl.load(tl.where(q == rank, out, inbox + q * M * N) + rows).to(tl.float32)
            for k in tl.static_range(WORLD):  # this rank's out first
                tl.store(ilt.peer_pointer(ctx, out, (rank + k) % WORLD) + rows, total.to(tl.bfloat16))
        s = il.symm_tile_signal_others(ctx, tiles + t)  # tile index tiles + t: its sum is in
    return s


@ironlink.jit(do_not_specialize=["ctx"])
def gemm_all_reduce(ctx, a, b, out, inbox, M, K, status, N: tl.constexpr, WORLD: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGGER: tl.constexpr):
    pid, grid, rank = tl.program_id(0), tl.num_programs(0), il.symm_rank(ctx)
    tiles_n, tiles = N // BN, (M // BM) * (N // BN)  # (shapes are multiples of the tile here: no masks)
    split = (pid % STAGGER) * (K // BK) // STAGGER * BK  # where in the K loop this CTA pushes
    worst, prev, prev2 = pid * 0, pid * 0 - 1, pid * 0 - 1  # prev, prev2: the tiles one and two steps back
    for t in range(pid, tiles, grid):
        m0, n0 = _tile_origin(t, tiles_n, BM, BN, 8)
        to = _owner(prev, grid, WORLD)  # prev's, whose partial this rank pushes unless its own
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, split, BK):  # a, b: TMA descriptors (the SM's copy engine loads the tiles)
            acc = tl.dot(a.load([m0, k0]), b.load([k0, n0]), acc)
        if (prev >= 0) & (to != rank):
            _push(ctx, out, inbox, prev, rank, to, M, tiles_n, N, BM, BN)
        for k0 in range(split, K, BK):
            acc = tl.dot(a.load([m0, k0]), b.load([k0, n0]), acc)
        if (prev >= 0) & (to != rank):
            worst = ilt.failure_or(il.symm_tile_signal(ctx, prev, to), worst)
        tl.store(out + (m0 + tl.arange(0, BM))[:, None].to(tl.int64) * N + (n0 + tl.arange(0, BN))[None, :],
                 acc.to(tl.bfloat16))  # this tile's partial, staged
        if (prev2 >= 0) & (worst == 0) & (_owner(prev2, grid, WORLD) == rank):  # partials came a tile ago
            worst = _sum(ctx, out, inbox, prev2, tiles, rank, M, tiles_n, N, WORLD, BM, BN)
        prev2, prev = prev, t
    if (prev >= 0) & (_owner(prev, grid, WORLD) != rank):  # the last tile: no GEMM left to overlap its push
        _push(ctx, out, inbox, prev, rank, _owner(prev, grid, WORLD), M, tiles_n, N, BM, BN)
        worst = ilt.failure_or(il.symm_tile_signal(ctx, prev, _owner(prev, grid, WORLD)), worst)
    for last in tl.static_range(2):
        t = prev2 if last == 0 else prev
        if (t >= 0) & (worst == 0) & (_owner(t, grid, WORLD) == rank):
            worst = _sum(ctx, out, inbox, t, tiles, rank, M, tiles_n, N, WORLD, BM, BN)
    for t in range(pid, tiles, grid):  # the sums of the tiles others own: out is whole, the partials read
        if (worst == 0) & (_owner(t, grid, WORLD) != rank):
            worst = il.symm_tile_wait(ctx, tiles + t, _owner(t, grid, WORLD))
    tl.store(status + pid, worst)


def main() -> int:
    sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # the timer, from this checkout
    from ironlink_bench import time_graph  # loads the compiled extension: only where it runs
    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    k = K_TOTAL // world
    gen = torch.Generator(device="cuda").manual_seed(rank)
    a = torch.randn(M, k, device="cuda", generator=gen).to(torch.bfloat16)
    b = (torch.randn(k, N, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
    sms = ironlink.sm_share(torch.cuda.current_device())  # the SMs this rank's CTAs can count on
    lib_bytes = ironlink.matmul_all_reduce.heap_bytes(M, N, k, world, "bfloat16", sms)  # the library op's workspaces
    with ironlink.SymmetricHeap((3 * world + 1) * M * N * 2 + lib_bytes) as heap:
        out, inbox = heap.empty((M, N), torch.bfloat16), heap.empty((world, M, N), torch.bfloat16)
        status = torch.zeros(256, dtype=torch.int32, device="cuda")
        grid = (min(sms, (M // BM) * (N // BN)),)  # resident (a CTA waits for peers' CTAs): a CTA an SM at most
        a_desc = TensorDescriptor(a, list(a.shape), list(a.stride()), [BM, BK])
        b_desc = TensorDescriptor(b, list(b.shape), list(b.stride()), [BK, BN])

        def fused() -> None:
            gemm_all_reduce[grid](heap.ctx, a_desc, b_desc, out, inbox, M, k, status, N=N, WORLD=world, BM=BM,
                                  BN=BN, BK=BK, STAGGER=STAGGER, num_warps=8, num_stages=3)

        fused()
        heap.check()
        parts = [[torch.empty_like(t) for _ in range(world)] for t in (a, b)]
        dist.all_gather(parts[0], a), dist.all_gather(parts[1], b)
        ref = sum(x.double() @ y.double() for x, y in zip(*parts))
        err = ((out.double() - ref).norm() / ref.norm()).item()
        dist.broadcast(ours := out.clone(), 0)
        same = bool(torch.equal(ours, out))
        t_fused = time_graph(fused, out.nbytes)
        t_lib = time_graph(lambda: ironlink.matmul_all_reduce(a, b, out=out, heap=heap), out.nbytes)
        t_pair = time_graph(lambda: (torch.matmul(a, b, out=out), ironlink.all_reduce(out, heap=heap)), out.nbytes)
        heap.check()
        if rank == 0:
            print(f"fused GEMM + all-reduce [{M}, {k}] x [{k}, {N}] on {world} GPUs: relative error {err:.2e}, "
                  f"bitwise equal on every rank: {same}; this kernel {t_fused:.1f} us, ironlink.matmul_all_reduce "
                  f"{t_lib:.1f} us, torch.matmul + ironlink.all_reduce {t_pair:.1f} us", flush=True)
    dist.destroy_process_group()
    return 0 if err < 1e-2 and same else 1


if __name__ == "__main__":
    raise SystemExit(main())
