"""What one tile signal costs a CTA, by what it has in flight: a probe, not a benchmark.

    torchrun --standalone --nproc_per_node=2 bench/probes/signal_probe.py --out signal-probe.json

matmul_all_reduce's two-shot kernel spends about 2.9 us per tile in `symm_tile_signal` (2 H100s,
docs/record.md), more than its push. The signal waits for the CTA's bulk (TMA) stores, passes a
CTA barrier, and thread p sends a posted `red.release.sys` (in SASS: MEMBAR.ALL.SYS before the
RED). This kernel times that call alone on every CTA of both ranks at once, `--iters` times, in
these cases (the 64 KiB tile is [128, 256] bf16, as the GEMM's):
- bare: nothing written before it;
- local: the CTA just stored a 64 KiB tile to its own memory (plain stores);
- peer_stores: the CTA just stored a tile to the peer through peer pointers (plain stores);
- tma_now: the CTA just pushed a tile to the peer with a TMA store (the signal waits for it);
- tma_drained: as tma_now, then the CTA spins `--spin-us` before the signal (the push long done);
and each rank then takes the peer's signal (`symm_tile_wait`), so both ranks stay in step.
Reports per case the median over iterations of the mean over CTAs of the signal's microseconds,
the max over ranks (global timer, ns).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import triton.language as tl
from triton.language.extra import cuda as tl_cuda
from triton.tools.tensor_descriptor import TensorDescriptor

import ironlink
import ironlink.language as il
import ironlink.typed as ilt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness ironlink_bench, run from anywhere
from ironlink_bench import record_row, write_results  # noqa: E402

CASES = ("bare", "local", "peer_stores", "tma_now", "tma_drained")


@ironlink.jit(do_not_specialize=["ctx"])
def signal_probe_kernel(ctx, tiles, peer_tiles, times, status, ITERS, spin_ns, CASE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """CTA c: ITERS times, the case's writes to tile c of `tiles` [ctas, BLOCK_M, BLOCK_N] (its own
    or the peer's copy; `peer_tiles`: a TMA descriptor of the peer's), then the signal of tile c
    to the peer, timed into times[i, c], then the wait for the peer's."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    rank = il.symm_rank(ctx)
    peer = 1 - rank
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    offs = pid.to(tl.int64) * BLOCK_M * BLOCK_N + rm[:, None] * BLOCK_N + rn[None, :]
    value = (rm[:, None] + rn[None, :]).to(tiles.dtype.element_ty)
    worst = pid * 0
    for i in range(ITERS):
        if CASE == 1:
            tl.store(tiles + offs, value)
        elif CASE == 2:
            tl.store(ilt.peer_pointer(ctx, tiles, peer) + offs, value)
        elif CASE >= 3:
            peer_tiles.store([pid, 0, 0], value.reshape(1, BLOCK_M, BLOCK_N))
            if CASE == 4:
                t = tl_cuda.globaltimer()
                while tl_cuda.globaltimer() - t < spin_ns:
                    pass
        t0 = tl_cuda.globaltimer()
        s = il.symm_tile_signal(ctx, pid, peer)
        t1 = tl_cuda.globaltimer()
        tl.store(times + i * grid + pid, t1 - t0)
        worst = ilt.failure_or(s, ilt.failure_or(il.symm_tile_wait(ctx, pid, peer), worst))
    tl.store(status + pid, worst)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctas", default="1,16,132")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--spin-us", type=float, default=20.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, "the probe signals the one peer: run it on 2 GPUs"
    heap = ironlink.SymmetricHeap(256 << 20)
    bm, bn = 128, 256
    rows: list[dict[str, Any]] = []
    for ctas in map(int, args.ctas.split(",")):
        tiles = heap.zeros((ctas, bm, bn), torch.bfloat16)
        peer_tiles = TensorDescriptor(heap.peer_tensor(tiles, 1 - rank), [ctas, bm, bn], [bm * bn, bn, 1], [1, bm, bn])
        times = torch.zeros(args.iters, ctas, dtype=torch.int64, device="cuda")
        status = torch.zeros(ctas, dtype=torch.int32, device="cuda")
        for case, name in enumerate(CASES):
            for _ in range(2):  # compile, then the measured launch
                times.zero_()
                torch.cuda.synchronize()
                dist.barrier()
                signal_probe_kernel[(ctas,)](heap.ctx, tiles, peer_tiles, times, status, args.iters,
                                             int(args.spin_us * 1000), CASE=case, BLOCK_M=bm, BLOCK_N=bn, num_warps=8)
                torch.cuda.synchronize()
            heap.check()
            assert int(status.abs().max()) == 0, f"{name}: status {status.tolist()}"
            per_iter = (times[1:].double().mean(dim=1) / 1e3).tolist()  # the first: compile-free but cold
            mine = sorted(per_iter)[len(per_iter) // 2]
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, mine)
            row = {"case": name, "ctas": ctas, "signal_us": round(max(gathered), 3),
                   "signal_us_ranks": [round(v, 3) for v in gathered]}
            record_row(rows, row)
        heap.free(tiles)
    write_results(args.out, world, rows, probe="signal_probe")
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
