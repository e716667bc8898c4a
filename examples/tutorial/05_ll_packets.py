"""Lesson 5: LL ("low latency") packets: the flag travels inside the data, so nothing waits.

    torchrun --nproc_per_node=4 examples/tutorial/05_ll_packets.py

Lessons 2-4 send data, then a flag, and the flag needs release/acquire ordering plus a round
trip of its own. For small messages that latency is the whole cost. An LL packet puts the flag
NEXT TO the data in one 8-byte word: [ data (32 bits) | flag (32 bits) ]. An aligned 8-byte store
reaches the peer whole (never half old, half new), so a reader that sees this call's flag in a
word has that word's data: no fence, no separate flag, no barrier. The cost: half of every
packet is flag, so twice the bytes (the library's LL all-gather packs 16-byte packets the same way).

The flag is the call number (each CTA counts its calls in ordinary memory), so no mailbox is ever
reset. Packets go to two mailboxes, by the call number's parity: a rank one call ahead writes the
other one, and it cannot be two ahead, because call k+1 ends only after receiving every rank's
packets of call k+1, which each rank sends only after it finished reading call k. The two
mailboxes sit world x n apart, so n stays the same from call to call here: with sizes that vary,
put them the largest call's size apart, or a rank one call ahead could write into the part of the
other mailbox that a slower peer still reads (the library's slot halves are half their workspace).

This is a one-shot LL all-gather: every rank writes its packets straight into every peer.
The spin loop reloads with `volatile=True` (ld.volatile: never served from a stale cache).
"""

from __future__ import annotations

import triton
import triton.language as tl

import ironlink
import ironlink.typed as ilt
from _common import finish, start, time_us

N = 1 << 12  # fp32 elements per rank (16 KiB): a small message, where LL pays
BLOCK = 1024
CTAS = N // BLOCK


@ironlink.jit
@triton.jit
def ll_all_gather(ctx, inp, out, mailbox, epochs, rank, world, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    flag = tl.load(epochs + pid) + 1  # this call's number: starts at 1, mailboxes start at 0
    box = mailbox + (flag % 2) * world * n  # [2 parities][world senders][n] int64 packets
    bits = tl.load(inp + offs).to(tl.uint32, bitcast=True).to(tl.int64)  # zero-extended: high half free
    packet = bits | (flag.to(tl.int64) << 32)
    for p in range(world):  # send: one 8-byte store per element, into our row of p's mailbox
        tl.store(ilt.peer_pointer(ctx, box, p) + rank * n + offs, packet)
    for p in range(world):  # receive: spin until every packet of p's row carries our flag
        got = tl.load(box + p * n + offs, volatile=True)
        while tl.sum(((got >> 32).to(tl.int32) != flag).to(tl.int32)) > 0:
            got = tl.load(box + p * n + offs, volatile=True)
        tl.store(out + p * n + offs, got.to(tl.int32).to(tl.float32, bitcast=True))
    tl.store(epochs + pid, flag)


@ironlink.jit
@triton.jit
def library_all_gather(ctx, inp, out, n, status):
    # The library's all_gather uses LL packets at this size too (16 bytes: 12 data, 4 flag).
    tl.store(status + tl.program_id(0), ilt.all_gather(ctx, inp, out, n))


def main() -> None:
    import torch  # in main, not above: CI compiles the kernels without torch
    import torch.distributed as dist

    lesson = start(heap_bytes=4 * 8 * N * 8 + (1 << 20))
    rank, world, heap, status = lesson.rank, lesson.world, lesson.heap, lesson.status
    inp, out = heap.empty((N,), torch.float32), heap.empty((world, N), torch.float32)
    inp.normal_()
    mailbox = heap.zeros((2, world, N), torch.int64)  # symmetric: peers write packets into it
    epochs = torch.zeros(CTAS, dtype=torch.int32, device="cuda")
    heap.barrier()  # mailboxes zeroed everywhere before the first packet

    run = lambda: ll_all_gather[(CTAS,)](heap.ctx, inp, out, mailbox, epochs, rank, world, N, BLOCK=BLOCK)  # noqa: E731
    run()
    want = torch.empty(world * N, device="cuda")
    dist.all_gather_into_tensor(want, inp)
    ok = torch.equal(out, want.view(world, N))

    us = time_us(run, world * N * 4)
    lib = time_us(lambda: library_all_gather[(CTAS,)](heap.ctx, inp, out, N, status), world * N * 4)
    finish(lesson, "05", "LL packets (all-gather)", ok, world * N * 4, {"": us}, "ironlink symm_all_gather", lib)


if __name__ == "__main__":
    main()
