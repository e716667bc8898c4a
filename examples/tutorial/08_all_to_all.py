"""Lesson 8: all-to-all: every rank sends a different block to every rank.

    torchrun --nproc_per_node=4 examples/tutorial/08_all_to_all.py

Rank r's input holds `world` blocks; block p is for rank p, and lands in block r of rank p's
output (the exchange behind expert parallelism's dispatch and combine, and behind transposing a
sharded tensor). With symmetric memory it is lesson 1 plus lesson 3: store block p straight into
rank p's out through a peer pointer, then a barrier says every block has arrived. Nothing is
reduced and nothing is forwarded: each byte crosses one link once.

Two details that matter on real links. The CTAs along grid axis 1 each take one peer, starting at
`rank + 1` (`peer = (rank + j) % world`), so at any moment the ranks write to different GPUs
rather than all to rank 0 first. And the entry barrier keeps a fast rank from overwriting an
output block its peer has not consumed from the previous call.
"""

from __future__ import annotations

import triton
import triton.language as tl

import ironlink
import ironlink.language as il
import ironlink.typed as ilt
from _common import finish, start, time_us

N = 1 << 16  # fp32 elements per block: 256 KiB to each peer
BLOCK = 4096


@ironlink.jit
@triton.jit
def all_to_all(ctx, inp, out, rank, world, n, status, BLOCK: tl.constexpr):
    chunk, j = tl.program_id(0), tl.program_id(1)  # grid: (chunks of a block, peers)
    peer = (rank + 1 + j) % world  # staggered: each rank starts with a different peer
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    s = il.symm_barrier(ctx)  # every out is free to overwrite
    block = tl.load(inp + peer * n + offs, mask=offs < n)
    tl.store(ilt.peer_pointer(ctx, out, peer) + rank * n + offs, block, mask=offs < n)
    # Each of our blocks comes from another CTA index, so this CTA's barrier alone does not say
    # our out is complete; once ALL our CTAs have passed theirs (the kernel's end), it is.
    s |= il.symm_barrier(ctx)
    tl.store(status + j * tl.num_programs(0) + chunk, s)


@ironlink.jit
@triton.jit
def library_all_to_all(ctx, inp, out, n, status):
    tl.store(status + tl.program_id(0), ilt.all_to_all(ctx, inp, out, n))


def main() -> None:
    import torch  # in main, not above: CI compiles the kernels without torch
    import torch.distributed as dist

    lesson = start(heap_bytes=2 * 2 * 8 * N * 4 + (1 << 20))
    rank, world, heap, status = lesson.rank, lesson.world, lesson.heap, lesson.status
    inp, out = heap.empty((world, N), torch.float32), heap.zeros((world, N), torch.float32)
    inp.normal_()
    heap.barrier()

    grid = (triton.cdiv(N, BLOCK), world)
    run = lambda: all_to_all[grid](heap.ctx, inp, out, rank, world, N, status, BLOCK=BLOCK)  # noqa: E731
    run()
    want = torch.empty_like(out)
    dist.all_to_all_single(want, inp)  # torch's answer
    ok = torch.equal(out, want)

    nbytes = world * N * 4
    us = time_us(run, nbytes)
    lib = time_us(lambda: library_all_to_all[(64,)](heap.ctx, inp, out, N, status), nbytes)
    finish(lesson, "08", "all-to-all", ok, nbytes, {"": us}, "ironlink symm_all_to_all", lib)


if __name__ == "__main__":
    main()
