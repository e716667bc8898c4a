"""Every rank writes its rank into every peer's copy of a symmetric buffer, from a Triton kernel.

    torchrun --nproc_per_node=8 examples/peer_write.py

Each rank allocates the same int32 buffer of `world` slots (SLOT elements each) in a symmetric
heap. A kernel with a grid of (world peers x CHUNKS) CTAs translates the buffer's address into each
peer's copy with ``ironlink.language.symm_peer_ptr`` and stores the writer's rank into slot
[writer rank] there. After a barrier, every rank checks that slot r holds r for every r in
[0, world), prints one OK line, and exits nonzero on a mismatch.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import ironlink
import ironlink.language as il

SLOT = 1 << 16  # int32 elements per writer slot (256 KiB)
BLOCK = 1024
CHUNKS = SLOT // BLOCK


@ironlink.jit
@triton.jit
def peer_write(buf, ctx, rank, SLOT: tl.constexpr, BLOCK: tl.constexpr):
    peer = tl.program_id(0)
    chunk = tl.program_id(1)
    # The address of the same byte as `buf` in `peer`'s heap (0 if buf were not in the heap).
    remote = il.symm_peer_ptr(ctx, buf, peer)
    dst = remote.to(tl.pointer_type(tl.int32))
    offs = rank * SLOT + chunk * BLOCK + tl.arange(0, BLOCK)
    vals = tl.full((BLOCK,), 0, tl.int32) + rank
    tl.store(dst + offs, vals, mask=(offs >= 0) & (remote != 0))


def main() -> int:
    ironlink.init_distributed()  # this rank's GPU (LOCAL_RANK), then the NCCL group on it
    rank, world = dist.get_rank(), dist.get_world_size()
    ok = False
    with ironlink.SymmetricHeap(world * SLOT * 4 + (1 << 20), scratch_bytes=0) as heap:
        buf = heap.empty((world, SLOT), torch.int32)
        buf.fill_(-1)
        heap.barrier()  # every rank's buffer is initialized before anyone writes into it
        peer_write[(world, CHUNKS)](buf, heap.ctx, rank, SLOT=SLOT, BLOCK=BLOCK)
        heap.barrier()  # every rank's writes have landed
        heap.check()
        expected = torch.arange(world, dtype=torch.int32, device=buf.device)[:, None].expand(world, SLOT)
        bad = (buf != expected).nonzero()
        if bad.numel() == 0:
            ok = True
            print(f"rank {rank}/{world}: OK, received ranks 0..{world - 1} from {world} writers "
                  f"({world * SLOT * 4} bytes, grid {world}x{CHUNKS})", flush=True)
        else:
            r, i = bad[0].tolist()
            print(f"rank {rank}/{world}: MISMATCH at slot {r} element {i}: got {buf[r, i].item()}, "
                  f"expected {r} ({bad.shape[0]} wrong elements)", flush=True)
        del buf
    oks = [None] * world
    dist.all_gather_object(oks, ok)
    dist.destroy_process_group()
    return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
