"""Does compute-sanitizer's initcheck see what a peer process wrote? A probe (docs/record.md,
session 71): initcheck over the ops suite at world 4 reported "Uninitialized __global__ memory
read of size 16 bytes" in `_all_reduce_kernel`, where every byte of the heap was set (cuMemsetD8 at
creation, then the callers' tensors). Here every rank fills its tensor, then one
ironlink.all_reduce of `--bytes` runs: at 1 MiB its two-shot loads the peers' shards from their
heaps (16-byte units), at 4 KiB the one-shot LL path reads only this rank's scratch, which the
peers' stores fill. Each rank prints whether the sum is right; the sanitizer's reports name the
reads it could not trace to a write of this process.

    source tests/gpu/mps.sh; start_mps; mps_confine 2
    IRONLINK_INITCHECK_PEERS=0 SANITIZE_TOOL=initcheck SANITIZE_LOG=$OUT/ic-1m torchrun --standalone \
        --nproc_per_node=2 --no-python tests/gpu/sanitize_rank.sh bench/probes/initcheck_peer_reads.py \
        --bytes 1048576

With IRONLINK_INITCHECK_PEERS=1 (sanitize_rank.sh's default for initcheck) each heap marks its
peers' regions initialized for the tool (`ironlink.runtime.initcheck`), and the reports go
(session 72: 0 at worlds 2 and 4, against 32,768 and 49,152 a rank without it). Every world and
flag in one call: bench/probes/initcheck_peer_reads.sh.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import ironlink


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--bytes", type=int, default=1 << 20)
    args = ap.parse_args()
    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    heap = ironlink.SymmetricHeap(64 << 20, timeout_s=60)
    x = heap.empty((args.bytes // 2,), torch.bfloat16)
    x.fill_(rank + 1)  # every byte of it, on every rank, before the call
    torch.cuda.synchronize()
    dist.barrier()
    ironlink.all_reduce(x, heap=heap)
    torch.cuda.synchronize()
    heap.check()
    right = bool((x.float() == world * (world + 1) / 2).all())
    print(f"rank {rank}: all_reduce of {args.bytes} B at world {world}: sum {'right' if right else 'WRONG'}", flush=True)
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
