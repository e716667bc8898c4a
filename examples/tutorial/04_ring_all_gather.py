"""Lesson 4: a ring all-gather, from put, signal and wait.

    torchrun --nproc_per_node=4 examples/tutorial/04_ring_all_gather.py

All-gather: block p of every rank's `out` becomes rank p's block. In a ring each rank talks only
to its two neighbours: in step s it forwards block (rank - s) to rank + 1, then waits for block
(rank - s - 1) from rank - 1, which it forwards in the next step. After world - 1 steps every
block has gone round. Each link carries (world - 1) blocks, the minimum an all-gather needs, which
is why rings win for large messages over links of equal speed (NCCL's default); the price is
world - 1 dependent steps, each a full put + signal + wait latency, so small messages lose.

Signals count: rank - 1 adds 1 to our slot per step, so "block of step s has arrived" is
"slot >= (world - 1) * (calls before this one) + s + 1". The entry barrier (`il.symm_barrier`,
lesson 3) keeps a fast rank from overwriting a block its neighbour is still forwarding from the
previous call.
"""

from __future__ import annotations

import triton
import triton.language as tl

import ironlink
import ironlink.language as il
from ironlink.constants import CMP_GE, SIGNAL_OP_ADD
from _common import finish, start, time_us

N = 1 << 18  # fp32 elements per rank (1 MiB)
CTAS = 16
CHUNK = N // CTAS


@ironlink.jit
@triton.jit
def ring_all_gather(ctx, out, epochs, rank, world, n, status, CHUNK: tl.constexpr):
    pid = tl.program_id(0)  # CTA pid moves chunk pid of every block, on signal slot pid
    calls = tl.load(epochs + pid)
    nxt = (rank + 1) % world
    s = il.symm_barrier(ctx)
    for step in range(world - 1):
        block = (rank - step + world) % world  # ours at step 0, then the one that just arrived
        chunk = out + block * n + pid * CHUNK
        s |= il.symm_put(ctx, chunk, chunk, CHUNK * 4, nxt)  # same place in nxt's out
        s |= il.symm_signal(ctx, pid, 1, SIGNAL_OP_ADD, nxt)
        s |= il.symm_signal_wait(ctx, pid, CMP_GE, calls * (world - 1) + step + 1)
    tl.store(epochs + pid, calls + 1)
    tl.store(status + pid, s)


def main() -> None:
    import torch  # in main, not above: CI compiles the kernels without torch
    import torch.distributed as dist

    lesson = start(heap_bytes=2 * 8 * N * 4 + (1 << 20))
    rank, world, heap, status = lesson.rank, lesson.world, lesson.heap, lesson.status
    out = heap.zeros((world, N), torch.float32)
    mine = torch.randn(N, device="cuda")
    out[rank].copy_(mine)  # in place: our block of out is our input
    epochs = torch.zeros(CTAS, dtype=torch.int32, device="cuda")
    heap.barrier()

    run = lambda: ring_all_gather[(CTAS,)](heap.ctx, out, epochs, rank, world, N, status, CHUNK=CHUNK)  # noqa: E731
    run()
    want = torch.empty(world * N, device="cuda")
    dist.all_gather_into_tensor(want, mine)  # torch's (NCCL's) answer
    ok = torch.equal(out, want.view(world, N))

    us = time_us(run, world * N * 4)
    lib = time_us(lambda: ironlink.all_gather(out, out[rank], heap=heap), world * N * 4)
    finish(lesson, "04", "ring all-gather", ok, world * N * 4, {"": us}, "ironlink.all_gather", lib)


if __name__ == "__main__":
    main()
