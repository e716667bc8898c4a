"""NVLink probe: how fast can SM loads and stores move data between the GPUs of this node?

    torchrun --standalone --nproc_per_node=4 bench/probes/nvlink_probe.py --out probe.json

A measurement tool for the large-message all-reduce work, not part of the library: plain Triton
kernels (no ironlink code) move `--egress` bytes per rank, all ranks at once, in these patterns:

- push_all: load here, store to every peer (what ironlink's all_gather / two-shot second half does)
- push_one: load here, store to the next rank only (a ring's traffic pattern)
- pull_all: load from every peer, store here (ironlink's reduce_scatter / two-shot first half)
- pull_one: load from the next rank only
- push_split: push_all's traffic, but each CTA stores to one peer only
- tma_push_all: push_all with TMA tile loads and stores (world 4 only)
- reduce_push(_self): two-shot's second half: sum world local blocks (bf16 in fp32), store the
  result to every peer (and locally)
- push_seq: push_all's bytes, but each rank sends a different part to each peer, peer after
  peer: in rounds of `unroll` blocks per CTA, all of a round's data for rank + 1, then for
  rank + 2, ... (two-shot's scatter, ordered so that at any moment the ranks form a permutation)
- scatter_ring: two-shot's scatter (a different part to every peer) and a ring all-gather (three
  more blocks to the next rank) interleaved block by block, half the bytes each
- ring_step: a ring reduce-scatter step: sum two local blocks (bf16 in fp32), store the result
  to the next rank only

over grids and warps, and reports per-rank GB/s (bytes moved over NVLink by one rank / time),
the minimum over ranks. Peer addresses come from torch symmetric memory (multicast off).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
import triton
import triton.language as tl


@triton.jit
def _peer(mine, deltas, rank, world, k):
    # Rank (rank + k) % world's buffer, from this rank's `mine` plus that peer's element offset
    # (pointer arithmetic on a 16-byte aligned base keeps Triton's 16-byte vector accesses).
    return mine + tl.multiple_of(tl.load(deltas + (rank + k) % world), 8)


@triton.jit
def _probe(local, mine, deltas, slot, rank, world, n_per_peer, NPEERS: tl.constexpr, PULL: tl.constexpr,
           BLOCK: tl.constexpr, CS: tl.constexpr):
    # Each of NPEERS peers (rank+1, rank+2, ...) exchanges n_per_peer elements with this rank.
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    nblocks = n_per_peer // BLOCK
    for b in range(pid, nblocks, grid):
        base = b * BLOCK + offs
        if PULL:
            for k in tl.static_range(1, NPEERS + 1):
                src = _peer(mine, deltas, rank, world, k)
                v = tl.load(src + rank * slot + base)
                tl.store(local + (k - 1) * n_per_peer + base, v)
        else:
            v = tl.load(local + base)
            for k in tl.static_range(1, NPEERS + 1):
                dst = _peer(mine, deltas, rank, world, k)
                if CS:
                    tl.store(dst + rank * slot + (k - 1) * n_per_peer + base, v, cache_modifier=".cs")
                else:
                    tl.store(dst + rank * slot + (k - 1) * n_per_peer + base, v)


@triton.jit
def _send_part(local, dst, slot, rank, n_per_peer, k, base):
    # This rank's part k - 1 (n_per_peer elements each), elements `base`, into this rank's slot
    # of `dst`, peer rank + k's buffer.
    v = tl.load(local + (k - 1) * n_per_peer + base)
    tl.store(dst + rank * slot + (k - 1) * n_per_peer + base, v)


@triton.jit
def _split(local, mine, deltas, slot, rank, world, n_per_peer, NPEERS: tl.constexpr, BLOCK: tl.constexpr):
    # Like push_all, but each CTA stores to one peer only: CTA c serves peer rank + 1 + c % NPEERS.
    pid = tl.program_id(0)
    k = pid % NPEERS + 1
    idx = pid // NPEERS
    groups = tl.num_programs(0) // NPEERS
    offs = tl.arange(0, BLOCK)
    dst = _peer(mine, deltas, rank, world, k)
    for b in range(idx, n_per_peer // BLOCK, groups):
        _send_part(local, dst, slot, rank, n_per_peer, k, b * BLOCK + offs)


@triton.jit
def _seq(local, mine, deltas, slot, rank, world, n_per_peer, NPEERS: tl.constexpr, BLOCK: tl.constexpr,
         ROUND: tl.constexpr):
    # push_seq: per round of ROUND blocks per CTA, this rank's part for peer rank + 1 (all CTAs),
    # then for rank + 2, ...
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    nblocks = n_per_peer // BLOCK
    for r0 in range(0, nblocks, grid * ROUND):
        for k in tl.static_range(1, NPEERS + 1):
            dst = _peer(mine, deltas, rank, world, k)
            for j in range(ROUND):
                b = r0 + j * grid + pid
                if b < nblocks:
                    _send_part(local, dst, slot, rank, n_per_peer, k, b * BLOCK + offs)


@triton.jit
def _scatter_ring(local, mine, deltas, slot, rank, world, n_per_peer, NPEERS: tl.constexpr, BLOCK: tl.constexpr):
    # scatter_ring: per block index, this rank's part for every peer (NPEERS stores to NPEERS
    # peers), then NPEERS other blocks to the next rank (a ring all-gather's forwarding).
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    half = n_per_peer // 2
    nxt = _peer(mine, deltas, rank, world, 1)
    for b in range(pid, half // BLOCK, grid):
        base = b * BLOCK + offs
        for k in tl.static_range(1, NPEERS + 1):
            dst = _peer(mine, deltas, rank, world, k)
            _send_part(local, dst, slot, rank, n_per_peer, k, base)
        for k in tl.static_range(1, NPEERS + 1):
            v = tl.load(local + (k - 1) * n_per_peer + half + base)
            tl.store(nxt + rank * slot + (k - 1) * n_per_peer + half + base, v)


@triton.jit
def _reduce_push(local, mine, deltas, slot, rank, world, n_per_peer, NPEERS: tl.constexpr, BLOCK: tl.constexpr,
                 SELF: tl.constexpr):
    # The second half of a two-shot all-reduce: sum NPEERS + 1 local blocks (bf16 in fp32), store
    # the result to every peer (and here when SELF).
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    for b in range(pid, n_per_peer // BLOCK, grid):
        base = b * BLOCK + offs
        acc = tl.load(local + base).to(tl.float32)
        for k in tl.static_range(1, NPEERS + 1):
            acc += tl.load(local + k * n_per_peer + base).to(tl.float32)
        v = acc.to(tl.bfloat16)
        for k in tl.static_range(1, NPEERS + 1):
            dst = _peer(mine, deltas, rank, world, k)
            tl.store(dst + rank * slot + base, v)
        if SELF:
            tl.store(local + (NPEERS + 1) * n_per_peer + base, v)


@triton.jit
def _tma_push(local, mine, deltas, slot, rank, world, n_per_peer, NPEERS: tl.constexpr, ROWS: tl.constexpr):
    # push_all through the tensor memory accelerator: tiles of ROWS x 256 bf16 loaded with TMA
    # and stored with one TMA store per peer (descriptors over the peers' buffers).
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    rows = n_per_peer // 256
    src = tl.make_tensor_descriptor(local, shape=[rows, 256], strides=[256, 1], block_shape=[ROWS, 256])
    d1 = tl.make_tensor_descriptor(_peer(mine, deltas, rank, world, 1) + rank * slot,
                                   shape=[rows, 256], strides=[256, 1], block_shape=[ROWS, 256])
    d2 = tl.make_tensor_descriptor(_peer(mine, deltas, rank, world, 2) + rank * slot,
                                   shape=[rows, 256], strides=[256, 1], block_shape=[ROWS, 256])
    d3 = tl.make_tensor_descriptor(_peer(mine, deltas, rank, world, 3) + rank * slot,
                                   shape=[rows, 256], strides=[256, 1], block_shape=[ROWS, 256])
    for b in range(pid, rows // ROWS, grid):
        v = src.load([b * ROWS, 0])
        d1.store([b * ROWS, 0], v)
        if NPEERS >= 2:
            d2.store([b * ROWS, 0], v)
        if NPEERS >= 3:
            d3.store([b * ROWS, 0], v)


def measure(launch: Callable[[], None]) -> float:
    """Median microseconds per launch, all ranks starting together, max over ranks."""
    launch()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        dist.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        launch()
        launch()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / 2)
    us = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(us, op=dist.ReduceOp.MAX)
    return us.item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--egress", type=int, default=192 << 20, help="bytes each rank moves per launch")
    ap.add_argument("--patterns", default="push_all,push_one,pull_all,pull_one",
                    help="also: push_split, reduce_push, reduce_push_self, ring_step, push_seq, scatter_ring")
    ap.add_argument("--grids", default="16,32,64,132,264")
    ap.add_argument("--warps", default="4,8,16")
    ap.add_argument("--heap", choices=("torch", "ironlink"), default="torch",
                    help="where the peers' buffers live: torch symmetric memory or an ironlink SymmetricHeap")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    # Scratch for tensor descriptors made on the device (tma_push_all).
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    group = dist.group.WORLD.group_name
    elems = args.egress // 2
    # Peer q's slot `rank` (elems long) receives / serves this rank's traffic.
    if args.heap == "ironlink":
        import ironlink

        heap = ironlink.SymmetricHeap(world * elems * 2 + (64 << 20))
        buf = heap.empty((world * elems,), torch.bfloat16)
        peer_ptrs = [heap.peer_tensor(buf, p).data_ptr() for p in range(world)]
    else:
        buf = symm_mem.empty(world * elems, dtype=torch.bfloat16, device="cuda")
        peer_ptrs = list(symm_mem.rendezvous(buf, group).buffer_ptrs)
    buf.fill_(1)
    # Peer buffers as element offsets from this rank's: pointer arithmetic on a 16-byte aligned
    # base keeps Triton's 16-byte vector accesses (an integer cast to a pointer loses them).
    deltas = torch.tensor([(p - buf.data_ptr()) // 2 for p in peer_ptrs], dtype=torch.int64, device="cuda")
    # Local source data; reduce_push reads world blocks of it and writes one more, ring_step reads two.
    local = torch.ones(max(elems + 2 * (elems // (world - 1)), 2 * elems), dtype=torch.bfloat16, device="cuda")
    rows = []
    npeers_of = {"push_one": 1, "pull_one": 1, "ring_step": 1}
    for name in args.patterns.split(","):
        npeers = npeers_of.get(name, world - 1)
        n_per_peer = elems // npeers
        for warps in map(int, args.warps.split(",")):
            for unroll in ((1, 4) if name in ("push_all", "push_one", "pull_all", "pull_one", "tma_push_all")
                           else (1, 2, 4) if name.startswith("reduce_push") or name == "ring_step"
                           else (1, 4, 16, 64) if name == "push_seq" else (1,)):
                block = (warps * 32 * 8 * (unroll if name != "push_seq" else 1) if name != "tma_push_all"
                         else 8 * unroll * 256)
                n = n_per_peer // block * block
                for cs in ((False, True) if name == "push_all" and unroll == 1 else (False,)):
                    for ctas in map(int, args.grids.split(",")):
                        if name == "push_split":
                            ctas = ctas // npeers * npeers
                            def launch() -> None:
                                _split[(ctas,)](local, buf, deltas, elems, rank, world, n, NPEERS=npeers, BLOCK=block,
                                                num_warps=warps)
                        elif name == "scatter_ring":
                            def launch() -> None:
                                _scatter_ring[(ctas,)](local, buf, deltas, elems, rank, world, n, NPEERS=npeers,
                                                       BLOCK=block, num_warps=warps)
                        elif name == "push_seq":
                            def launch() -> None:
                                _seq[(ctas,)](local, buf, deltas, elems, rank, world, n, NPEERS=npeers, BLOCK=block,
                                              ROUND=unroll, num_warps=warps)
                        elif name == "tma_push_all":
                            # Tiles of `unroll` x 8 rows of 256 (4 KiB per row group of 8).
                            def launch() -> None:
                                _tma_push[(ctas,)](local, buf, deltas, elems, rank, world, n, NPEERS=npeers,
                                                   ROWS=8 * unroll, num_warps=warps)
                        elif name.startswith("reduce_push") or name == "ring_step":
                            def launch() -> None:
                                _reduce_push[(ctas,)](local, buf, deltas, elems, rank, world, n, NPEERS=npeers,
                                                      BLOCK=block, SELF=name.endswith("_self"), num_warps=warps)
                        else:
                            def launch() -> None:
                                _probe[(ctas,)](local, buf, deltas, elems, rank, world, n, NPEERS=npeers,
                                                PULL=name.startswith("pull"), BLOCK=block, CS=cs, num_warps=warps)
                        us = measure(launch)
                        moved = npeers * n * 2
                        row = {"pattern": name, "ctas": ctas, "warps": warps, "unroll": unroll, "cs": cs,
                               "us": round(us, 1), "GBs": round(moved / us / 1e3, 1)}
                        rows.append(row)
                        if rank == 0:
                            print(json.dumps(row), flush=True)
    if rank == 0:
        best: dict[str, dict] = {}
        for r in rows:
            if r["pattern"] not in best or r["GBs"] > best[r["pattern"]]["GBs"]:
                best[r["pattern"]] = r
        print("best:", json.dumps(best, indent=1))
        if args.out:
            with open(args.out, "w") as f:
                doc = {"date": datetime.date.today().isoformat(), "git_rev": os.environ.get("IRONLINK_GIT_REV", "unknown"),
                       "gpu": torch.cuda.get_device_name(), "world_size": world, "egress_bytes_per_rank": args.egress,
                       "heap": args.heap,
                       "best": best, "rows": rows}
                json.dump(doc, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
