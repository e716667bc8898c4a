"""Lesson 2: put, signal and wait: a one-sided transfer the receiver can wait for.

    torchrun --nproc_per_node=4 examples/tutorial/02_put_signal_wait.py

Each rank sends its block to the next rank around a ring (a shift). With two-sided messaging
(send / recv) every rank sending first and receiving second can deadlock when the sends block.
One-sided transfers cannot: a put writes straight into the peer's memory (lesson 1) and returns;
nothing on the peer has to be running. The receiver only needs to know WHEN the data is there:

  il.symm_put(ctx, dst, src, nbytes, peer)       copies my src into peer's dst (CTA-cooperative)
  il.symm_signal(ctx, slot, 1, ADD, peer)        adds 1 to peer's signal slot, AFTER my put is
                                                 visible there (a release: see lesson 3)
  il.symm_signal_wait(ctx, slot, CMP_GE, value)  spins until MY slot >= value

Signals only grow, so the value to wait for is "one more than last call": each CTA keeps a call
count (its epoch) in ordinary device memory, so nothing is reset between calls and the kernel can
be replayed in a CUDA graph. One thing is left unsafe on purpose: nothing stops a rank from
putting call k+1's data into an inbox its peer still reads in call k. Here every call sends the
same bytes, so it does no harm; lesson 3's barrier is the fix in general.
"""

from __future__ import annotations

import triton
import triton.language as tl

import ironlink
import ironlink.language as il
import ironlink.typed as ilt
from ironlink.constants import CMP_GE, SIGNAL_OP_ADD
from _common import finish, start, time_us

N = 1 << 18  # fp32 elements per rank (1 MiB)
CTAS = 16
CHUNK = N // CTAS


@ironlink.jit
@triton.jit
def ring_shift(ctx, outbox, inbox, epochs, rank, world, status, CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    epoch = tl.load(epochs + pid) + 1  # this CTA's call count, the same on every rank
    nxt = (rank + 1) % world
    # CTA pid moves chunk pid and uses signal slot pid: each CTA is its own little channel.
    s = il.symm_put(ctx, inbox + pid * CHUNK, outbox + pid * CHUNK, CHUNK * 4, nxt)
    s |= il.symm_signal(ctx, pid, 1, SIGNAL_OP_ADD, nxt)
    # Meanwhile the previous rank did the same to us: wait for its signal of this call.
    s |= il.symm_signal_wait(ctx, pid, CMP_GE, epoch)
    tl.store(epochs + pid, epoch)
    tl.store(status + pid, s)  # statuses are 0 or negative: OR keeps "some call failed"


@ironlink.jit
@triton.jit
def library_ring_shift(ctx, outbox, inbox, rank, world, status, CHUNK: tl.constexpr):
    # The library's tile calls do the same (put + signal, counted waits) with their own counters.
    pid = tl.program_id(0)
    s = ilt.tile_put(ctx, inbox + pid * CHUNK, outbox + pid * CHUNK, 1, CHUNK, CHUNK, pid, (rank + 1) % world)
    s |= il.symm_tile_wait(ctx, pid, (rank + world - 1) % world)
    tl.store(status + pid, s)


def main() -> None:
    import torch  # in main, not above: CI compiles the kernels without torch

    lesson = start(heap_bytes=4 * N * 4 + (1 << 20))
    rank, world, heap, status = lesson.rank, lesson.world, lesson.heap, lesson.status
    outbox, inbox = heap.empty((N,), torch.float32), heap.zeros((N,), torch.float32)
    outbox.copy_(torch.arange(N, device="cuda") % 4096 + 10000 * rank)
    epochs = torch.zeros(CTAS, dtype=torch.int32, device="cuda")  # not symmetric: only this GPU reads it
    heap.barrier()  # inboxes zeroed everywhere before the first put

    run = lambda: ring_shift[(CTAS,)](heap.ctx, outbox, inbox, epochs, rank, world, status, CHUNK=CHUNK)  # noqa: E731
    run()
    # No host barrier needed: the kernel returned only after the signal, so the data is here.
    prev = (rank + world - 1) % world
    ok = torch.equal(inbox, torch.arange(N, device="cuda").float() % 4096 + 10000 * prev)

    us = time_us(run, N * 4)
    lib = time_us(lambda: library_ring_shift[(CTAS,)](heap.ctx, outbox, inbox, rank, world, status, CHUNK=CHUNK),
                  N * 4)
    finish(lesson, "02", "put, signal, wait", ok, N * 4, {"": us}, "ironlink symm_tile_put/_wait", lib)


if __name__ == "__main__":
    main()
