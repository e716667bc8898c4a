"""Lesson 3: a barrier across GPUs, and why it needs release/acquire ordering.

    torchrun --nproc_per_node=4 examples/tutorial/03_barrier.py

Every rank stores its row into every peer's board (lesson 1), then waits at a barrier, then sums
the rows it received: an all-reduce by stores. The barrier is written here in Triton: each rank
adds 1 to a counter on every rank, then waits until its own counter says all ranks have arrived.

Why the memory orders matter. A GPU may make two stores visible to another GPU in either order,
so with a RELAXED counter add a peer can see "everyone arrived" before it sees the rows stored
just before it, and sum stale data. The fix is a pair:
  release (on the add):  my earlier stores become visible no later than the add itself;
  acquire (on the read): my later loads happen no earlier than the read that saw the count.
One thread does each atomic, so `tl.debug_barrier()` (bar.sync) first gathers the CTA's stores
under thread 0's release, and after the acquire hands the ordering on to the whole CTA.

The wrong version (sem="relaxed") fails rarely on a GPU, so it is shown failing in the CPU
simulator instead: device/tests/tutorial_ordering.rs lets a plain store be overtaken by a later
relaxed flag store (which the GPU may do) and the reader sums stale data; with release it never
does. Run it: `RUSTC_BOOTSTRAP=1 cargo +1.93.0 test -q -p ironlink-device --test tutorial_ordering`.

The barrier runs twice per call: at entry (every board row is written) and at exit (everyone
has read its board, so the next call may overwrite it). It is per CTA index, as the library's
`il.symm_barrier` is: CTA c reads only the columns that CTA c of every rank wrote.
"""

from __future__ import annotations

import triton
import triton.language as tl

import ironlink
import ironlink.language as il
import ironlink.typed as ilt
from _common import finish, start, time_us

N = 1 << 16  # fp32 elements per row (256 KiB)
BLOCK = 4096
CTAS = N // BLOCK


@triton.jit
def barrier(ctx, counters, target, world):
    """Arrive at every rank's counter [this CTA], then wait until ours reaches `target`."""
    pid = tl.program_id(0)
    tl.debug_barrier()  # every thread's stores before thread 0's release below
    for p in range(world):
        tl.atomic_add(ilt.peer_pointer(ctx, counters, p) + pid, 1, sem="release", scope="sys")
    while tl.atomic_add(counters + pid, 0, sem="acquire", scope="sys") < target:
        pass
    tl.debug_barrier()  # no thread of the CTA loads before the acquire saw everyone


@ironlink.jit
@triton.jit
def all_reduce_by_stores(ctx, board, out, counters, epochs, rank, world, n, status,
                         BLOCK: tl.constexpr, LIBRARY_BARRIER: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    row = (offs % 7 + rank).to(tl.float32)  # this rank's contribution
    for p in range(world):
        tl.store(ilt.peer_pointer(ctx, board, p) + rank * n + offs, row)
    epoch = tl.load(epochs + pid) + 1  # calls so far: each makes 2 arrivals of `world` ranks
    if LIBRARY_BARRIER:
        tl.store(status + pid, il.symm_barrier(ctx))
    else:
        barrier(ctx, counters, (2 * epoch - 1) * world, world)
    acc = tl.zeros((BLOCK,), tl.float32)
    for p in range(world):  # rank order: the same sum, bit for bit, on every rank
        acc += tl.load(board + p * n + offs)
    tl.store(out + offs, acc)
    if LIBRARY_BARRIER:
        tl.store(status + pid, il.symm_barrier(ctx))
    else:
        barrier(ctx, counters, 2 * epoch * world, world)
        tl.store(epochs + pid, epoch)  # counts calls of OUR barrier only


def main() -> None:
    import torch  # in main, not above: CI compiles the kernels without torch

    lesson = start(heap_bytes=10 * N * 4 + (1 << 20))
    rank, world, heap, status = lesson.rank, lesson.world, lesson.heap, lesson.status
    board, out = heap.empty((world, N), torch.float32), heap.empty((N,), torch.float32)
    counters = heap.zeros((CTAS,), torch.int32)  # symmetric: peers add to ours
    epochs = torch.zeros(CTAS, dtype=torch.int32, device="cuda")
    heap.barrier()  # counters zeroed everywhere before anyone arrives

    def run(library: bool) -> None:
        all_reduce_by_stores[(CTAS,)](heap.ctx, board, out, counters, epochs, rank, world, N, status,
                                      BLOCK=BLOCK, LIBRARY_BARRIER=library)

    run(False)
    col = torch.arange(N, device="cuda") % 7
    ok = torch.equal(out, sum((col + p).float() for p in range(world)))
    us = time_us(lambda: run(False), N * 4)
    lib = time_us(lambda: run(True), N * 4)
    finish(lesson, "03", "barrier (release/acquire)", ok, N * 4, {"": us},
           "same kernel with il.symm_barrier", lib)


if __name__ == "__main__":
    main()
