"""NVLink probe: how fast can SM loads and stores move data between the GPUs of this node?

    torchrun --standalone --nproc_per_node=4 bench/nvlink_probe.py --out probe.json

A measurement tool for the large-message all-reduce work, not part of the library: plain Triton
kernels (no ironlink code) copy `--egress` bytes per rank, all ranks at once, in four patterns:

- push_all: load here, store to every peer (what ironlink's all_gather / two-shot second half does)
- push_one: load here, store to the next rank only (a ring's traffic pattern)
- pull_all: load from every peer, store here (ironlink's reduce_scatter / two-shot first half)
- pull_one: load from the next rank only

over grids and warps, and reports per-rank GB/s (bytes moved over NVLink by one rank / time),
the minimum over ranks. Peer addresses come from torch symmetric memory (multicast off).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
import triton
import triton.language as tl


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
                p = (rank + k) % world
                src = mine + tl.multiple_of(tl.load(deltas + p), 8)
                v = tl.load(src + rank * slot + base)
                tl.store(local + (k - 1) * n_per_peer + base, v)
        else:
            v = tl.load(local + base)
            for k in tl.static_range(1, NPEERS + 1):
                p = (rank + k) % world
                dst = mine + tl.multiple_of(tl.load(deltas + p), 8)
                if CS:
                    tl.store(dst + rank * slot + (k - 1) * n_per_peer + base, v, cache_modifier=".cs")
                else:
                    tl.store(dst + rank * slot + (k - 1) * n_per_peer + base, v)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--egress", type=int, default=192 << 20, help="bytes each rank moves per launch")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    group = dist.group.WORLD.group_name
    elems = args.egress // 2
    # Peer q's slot `rank` (elems long) receives / serves this rank's traffic.
    buf = symm_mem.empty(world * elems, dtype=torch.bfloat16, device="cuda")
    hdl = symm_mem.rendezvous(buf, group)
    buf.fill_(1)
    # Peer buffers as element offsets from this rank's: pointer arithmetic on a 16-byte aligned
    # base keeps Triton's 16-byte vector accesses (an integer cast to a pointer loses them).
    deltas = torch.tensor([(p - buf.data_ptr()) // 2 for p in hdl.buffer_ptrs], dtype=torch.int64, device="cuda")
    local = torch.ones(elems, dtype=torch.bfloat16, device="cuda")
    rows = []
    patterns = {"push_all": (world - 1, False), "push_one": (1, False), "pull_all": (world - 1, True), "pull_one": (1, True)}
    for name, (npeers, pull) in patterns.items():
        n_per_peer = elems // npeers
        for warps in (4, 8, 16):
            for unroll in (1, 4):
                block = warps * 32 * 8 * unroll
                n_per_peer_b = n_per_peer // block * block
                for cs in ((False, True) if name == "push_all" and unroll == 1 else (False,)):
                    for ctas in (16, 32, 64, 132, 264):
                        def launch() -> None:
                            _probe[(ctas,)](local, buf, deltas, elems, rank, world, n_per_peer_b, NPEERS=npeers, PULL=pull,
                                            BLOCK=block, CS=cs, num_warps=warps)
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
                        moved = npeers * n_per_peer_b * 2
                        row = {"pattern": name, "ctas": ctas, "warps": warps, "unroll": unroll, "cs": cs,
                               "us": round(us.item(), 1), "GBs": round(moved / us.item() / 1e3, 1)}
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
                       "best": best, "rows": rows}
                json.dump(doc, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
