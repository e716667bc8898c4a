"""Lesson 1: a store into another GPU's memory, through a peer pointer.

    torchrun --nproc_per_node=4 examples/tutorial/01_peer_store.py

Symmetric memory: every rank allocates a heap of the same size, and every rank maps every other
rank's heap into its own address space (CUDA IPC over NVLink). Tensors allocated in the same order
sit at the same offset in every heap, so "my `board`" names the same bytes on every GPU, and

    peer address = my address - my heap's base + peer's heap's base

which is what `ilt.peer_pointer(ctx, ptr, peer)` computes (ctx holds every rank's base). A plain
`tl.store` through that pointer writes into the peer's GPU memory: no send, no receive, no
copy engine. Here every rank writes its rank-stamped row into row [rank] of every peer's board:
an all-gather by stores. What this lesson does NOT do is tell the peer that the data has arrived:
the host waits for all GPUs (`heap.barrier()`) before checking. Lessons 2 and 3 do it on the GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

import ironlink
import ironlink.typed as ilt
from _common import finish, start, time_us

N = 1 << 18  # fp32 elements per row: 1 MiB from each rank to each rank
BLOCK = 2048


@ironlink.jit
@triton.jit
def store_into_peers(ctx, board, rank, n, BLOCK: tl.constexpr):
    peer = tl.program_id(1)  # grid: (chunks of a row, peers)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    value = (rank * 1000 + offs % 1000).to(tl.float32)  # who wrote it, and where
    # The same row of the board, but in `peer`'s heap: a pointer into another GPU's memory.
    peer_board = ilt.peer_pointer(ctx, board, peer)
    tl.store(peer_board + rank * n + offs, value, mask=offs < n)


def main() -> None:
    import torch  # in main, not above: CI compiles the kernels without torch

    lesson = start(heap_bytes=2 * 8 * N * 4 + (1 << 20))
    rank, world, heap = lesson.rank, lesson.world, lesson.heap
    board = heap.zeros((world, N), torch.float32)  # row p: what rank p wrote here
    heap.barrier()  # every board is zeroed before anyone writes into it
    grid = (triton.cdiv(N, BLOCK), world)
    store_into_peers[grid](heap.ctx, board, rank, N, BLOCK=BLOCK)
    heap.barrier()  # the host's way to know the stores landed: wait for every GPU
    col = torch.arange(N, device="cuda") % 1000
    want = torch.stack([(p * 1000 + col).float() for p in range(world)])
    ok = torch.equal(board, want)

    us = time_us(lambda: store_into_peers[grid](heap.ctx, board, rank, N, BLOCK=BLOCK), N * 4)
    mine = heap.empty((N,), torch.float32)
    lib = time_us(lambda: ironlink.all_gather(board, mine, heap=heap), N * 4)
    finish(lesson, "01", "peer store", ok, N * 4, {"": us}, "ironlink.all_gather", lib)


if __name__ == "__main__":
    main()
