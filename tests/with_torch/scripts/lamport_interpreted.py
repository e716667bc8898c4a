"""all_reduce_rmsnorm mode lamport's data-as-flag helpers in Triton's interpreter (TRITON_INTERPRET=1,
set by tests/with_torch/test_interpreted.py): a sender stores -0.0 as +0.0 (`unempty`); a receiver polls its
slots until no element holds -0.0 (`wait_written`), reads exactly what was sent, and stores
-0.0 ("empty") back; lanes outside the mask are not waited for; a slot a peer never filled gives
TIMEOUT after the context's timeout, recorded in the context with detail symm_tile_wait (and the
context's wait timeout set to 0, unless an error stood already), and its values are not taken as
data. bf16, fp16 and fp32 (16- and 32-bit empties).
The interpreter runs one CTA at a time, so the peer's stores are made beforehand by a sender
launch, as they would have landed from a peer already past them."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ironlink.language.slots import (PEERS, POLL_TOGETHER_MAX_ELEMENTS, TILE_WAIT as _TILE_WAIT, lamport_reduce_values,
                                     lamport_store)
from ironlink.runtime.workspaces import lamport_bits
from ironlink.language import _abi
from ironlink.language._flags import empty_like, is_empty, unempty, wait_written

import _interpreter_shims  # tests/with_torch/scripts/, beside this file

_interpreter_shims.install()


@triton.jit
def send(x, inbox, n, BLOCK: tl.constexpr):
    """A peer's stores: x into the inbox, -0.0 sent as +0.0."""
    i = tl.arange(0, BLOCK)
    tl.store(inbox + i, unempty(tl.load(x + i, mask=i < n)), mask=i < n)


@triton.jit
def receive(ctx, inbox, got, status, n, BLOCK: tl.constexpr):
    """Polls the inbox's first n elements, keeps what arrived, empties them again."""
    i = tl.arange(0, BLOCK)
    v, s = wait_written(ctx, inbox + i, i < n, _TILE_WAIT)
    tl.store(got + i, v, mask=i < n)
    if s == 0:
        tl.store(inbox + i, empty_like(v), mask=i < n)
    tl.store(status, s)


@triton.jit
def count_empty(v, out, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out, tl.sum(is_empty(tl.load(v + i)).to(tl.int32)))


def empty(n: int, dtype: torch.dtype) -> torch.Tensor:
    bits = lamport_bits(torch.empty(n, dtype=dtype))
    return bits.fill_(torch.iinfo(bits.dtype).min).view(dtype)


TIMEOUT_WORD = _abi.CONTEXT_FIELDS["timeout_ns"][0] // 8  # in the context's int64 words


def context(timeout_ns: int) -> torch.Tensor:
    ctx = torch.zeros(_abi.CONTEXT_SIZE // 8, dtype=torch.int64)
    ctx[TIMEOUT_WORD] = timeout_ns
    return ctx


def error_of(ctx: torch.Tensor) -> tuple[int, str]:
    error, detail = ctx.view(torch.int32)[[_abi.CONTEXT_FIELDS[f][0] // 4 for f in ("error", "error_detail")]].tolist()
    return error, (list(_abi.FUNCTIONS)[detail] if error else "")


def check(dtype: torch.dtype) -> None:
    block, n = 64, 50
    x = torch.randn(block).to(dtype)
    x[3], x[7] = -0.0, 0.0
    inbox = empty(block, dtype)
    assert int(torch.signbit(inbox).sum()) == block
    send[(1,)](x, inbox, n, BLOCK=block)
    assert not torch.signbit(inbox[3]) and inbox[3] == 0, "-0.0 leaves as +0.0"
    assert torch.signbit(inbox[n:]).all(), "nothing stored past n"
    ctx, got, status = context(10**9), torch.zeros(block, dtype=dtype), torch.zeros(1, dtype=torch.int32)
    receive[(1,)](ctx.data_ptr(), inbox, got, status, n, BLOCK=block)
    assert status.item() == 0 and error_of(ctx) == (0, ""), (status, error_of(ctx))
    want = torch.where(x == 0, torch.zeros_like(x), x)[:n]
    assert torch.equal(got[:n].view(torch.uint8), want.view(torch.uint8)), "received bitwise what was sent"
    counted = torch.zeros(1, dtype=torch.int32)
    count_empty[(1,)](inbox, counted, BLOCK=block)
    assert counted.item() == block, "every slot empty again after the receive"

    # A peer that stored all but one element: TIMEOUT, recorded, and the slots not emptied.
    send[(1,)](x, inbox, n - 1, BLOCK=block)
    ctx = context(20_000)
    receive[(1,)](ctx.data_ptr(), inbox, got, status, n, BLOCK=block)
    assert status.item() == _abi.STATUS["TIMEOUT"], status
    assert error_of(ctx) == (_abi.STATUS["TIMEOUT"], "symm_tile_wait"), error_of(ctx)
    assert torch.signbit(got[n - 1]) and got[n - 1] == 0, "the missing element is still empty"
    assert ctx[TIMEOUT_WORD].item() == 0, "a recorded TIMEOUT sets the wait timeout to 0: later waits give up at once"

    # A TIMEOUT where another error stands already (this rank's own) records nothing, timeout kept.
    ctx = context(20_000)
    ctx.view(torch.int32)[_abi.CONTEXT_FIELDS["error"][0] // 4] = _abi.STATUS["INVALID_ARGUMENT"]
    receive[(1,)](ctx.data_ptr(), inbox, got, status, n, BLOCK=block)
    assert status.item() == _abi.STATUS["TIMEOUT"] and ctx[TIMEOUT_WORD].item() == 20_000, ctx[TIMEOUT_WORD]

    # Masked lanes are not waited for: a receive of the n - 1 stored elements completes.
    ctx = context(10**9)
    receive[(1,)](ctx.data_ptr(), inbox, got, status, n - 1, BLOCK=block)
    assert status.item() == 0 and error_of(ctx) == (0, ""), (status, error_of(ctx))


@triton.jit
def values_send(parts, slots, dists, rank, n, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """Rank `rank`'s values (row `rank` of parts) from registers into its slot at every peer
    (`lamport_store`, the peers' slots `dists` bytes away), as matmul_all_reduce's lamport method
    sends a tile's partial."""
    i = tl.arange(0, BLOCK)
    v = tl.load(parts + rank * BLOCK + i, mask=i < n)
    lamport_store(v, slots, BLOCK, i, i < n, rank, tl.load(dists + tl.arange(0, PEERS)), WORLD)


@triton.jit
def values_reduce(ctx, parts, slots, out, status, rank, n, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """Rank `rank`'s sum over the ranks in rank order of its own values (in registers) and the
    peers' (polled in its slots, emptied after): `lamport_reduce_values`."""
    i = tl.arange(0, BLOCK)
    own = tl.load(parts + rank * BLOCK + i, mask=i < n)
    total, s = lamport_reduce_values(ctx, own, slots, BLOCK, i, i < n, rank, WORLD)
    tl.store(out + rank * BLOCK + i, total, mask=i < n)
    tl.store(status + rank, s)


def check_values(dtype: torch.dtype, world: int, block: int = 64) -> None:
    """`world` ranks in one process: each sends its values from registers, then each sums: every
    rank gets the same fp32 bits, the sum of the values with -0.0 as +0.0 (in rank order where
    every rank's block is polled at once; within fp32 rounding of it where the ranks are polled in
    groups: world 8's rows of 8192, world 4's of 16384), and its slots are empty again."""
    n = block - 14
    parts = torch.randn(world, block).to(dtype)
    parts[0, 3], parts[world - 1, 3], parts[0, 5] = -0.0, -0.0, -0.0
    # Each rank's slots (world - 1 of BLOCK elements) in one allocation, 256-byte strides apart
    # (heap bases are 256-byte aligned: lamport_store rounds the distances so).
    stride = -(-(world - 1) * block * parts.element_size() // 256) * 256 // parts.element_size()
    heap = empty(world * stride, dtype)
    slots = [heap[r * stride:] for r in range(world)]
    for rank in range(world):
        # Lane k: the bytes from this rank's slots to rank (rank + k) % world's (lane 0: 0).
        dists = torch.zeros(PEERS, dtype=torch.int64)
        for k in range(1, world):
            dists[k] = (((rank + k) % world) - rank) * stride * parts.element_size()
        values_send[(1,)](parts, slots[rank], dists, rank, n, WORLD=world, BLOCK=block)
    ctx, out, status = context(10**9), torch.zeros(world, block), torch.zeros(world, dtype=torch.int32)
    for rank in range(world):
        values_reduce[(1,)](ctx.data_ptr(), parts, slots[rank], out, status, rank, n, WORLD=world, BLOCK=block)
    assert status.tolist() == [0] * world and error_of(ctx) == (0, ""), (status, error_of(ctx))
    sent = torch.where(parts == 0, torch.zeros_like(parts), parts).float()
    want = sent[0].clone()
    for q in range(1, world):
        want += sent[q]
    for rank in range(world):
        assert torch.equal(out[rank, :n].view(torch.int32), out[0, :n].view(torch.int32)), f"rank {rank}'s bits"
    in_groups = world * block > POLL_TOGETHER_MAX_ELEMENTS
    if in_groups:
        scale = sent.abs().sum(0)[:n]
        assert bool(((out[0, :n] - want[:n]).abs() <= 2e-6 * scale).all()), "the sum in groups"
    else:
        assert torch.equal(out[0, :n].view(torch.int32), want[:n].view(torch.int32)), "the sum in rank order"
    assert int(torch.signbit(heap).sum()) == heap.numel(), "every slot empty again after the sums"


def main() -> None:
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        check(dtype)
        for world in (2, 4, 8):
            check_values(dtype, world)
    # Blocks too large for every rank's at once: world 8 polls groups of 4 ranks, world 4 of 2.
    for world, block in ((8, 8192), (4, 16384)):
        check_values(torch.bfloat16, world, block)
    print("ok: lamport slots: sent bitwise (-0.0 as +0.0), emptied after the receive, a missing element times out; "
          "values from registers summed in rank order (in groups of ranks for large blocks), the same bits on every "
          "rank")


if __name__ == "__main__":
    main()
