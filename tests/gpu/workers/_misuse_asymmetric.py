"""The misuse suite's asymmetric-heap cases (`tests/gpu/workers/misuse_worker.py` runs them):
ranks whose heaps saw different calls get HEAP_ASYMMETRIC on every rank, naming the first heap
call that differs, with nothing written; the ops' workspaces (the lamport slots, MoeExchange's
buffers) sit at the same offsets whatever each rank allocated before."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from _misuse_common import COMPILE_TIMEOUT_S, TIMEOUT_S, expect_error, ints, summed  # the script's own directory


def _digests(heap: Any) -> str:
    """ "rank 0 0x..., rank 1 0x..." of every rank's heap digest, as the report prints them."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, int(heap._native.digest))
    return ", ".join(f"rank {r} {d:#018x}" for r, d in enumerate(out))


def _asymmetric(make_heaps_differ: Any, seq: int, calls: Any) -> None:
    """Every rank allocates `a` (4 MiB) and `b` (256 B), then `make_heaps_differ(heap, a)` makes rank
    1's heap calls differ, then every rank allocates `z` (4 MiB) and all-reduces it (two-shot:
    barriers): HEAP_ASYMMETRIC on every rank, with check=True and then through heap.check(), both
    naming heap call `seq`, as `calls[rank]` describes it on each rank; `z` is left as it was."""
    import ironlink
    from ironlink.language import _abi

    heap = ironlink.SymmetricHeap(32 << 20, timeout_s=TIMEOUT_S)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        code = _abi.STATUS["HEAP_ASYMMETRIC"]
        a = heap.zeros((1 << 20,), torch.float32)
        b = heap.zeros((64,), torch.float32)
        make_heaps_differ(heap, a)
        z = heap.empty((1 << 20,), torch.float32)
        z.copy_(ints(z.numel()))
        before = z.clone()
        heap.barrier()
        report = (
            f"The first heap call that differs between the ranks is call #{seq} (counted from the heap's "
            "creation): " + "; ".join(f"rank {r}: {calls(r)}" for r in range(world)) + f" (heap digests: {_digests(heap)})"
        )
        e = expect_error(lambda: ironlink.all_reduce(z, heap=heap, check=True))
        assert str(e) == f"ironlink.all_reduce: symm_all_reduce returned HEAP_ASYMMETRIC ({code}) on rank {rank}. {report}", str(e)
        assert e.status == code and e.function == "symm_all_reduce", (e.status, e.function)
        e = expect_error(heap.check)
        assert str(e) == (
            f"device function symm_all_reduce on rank {rank} recorded HEAP_ASYMMETRIC ({code}): the ranks' "
            "symmetric heaps differ (a rank allocated or freed a tensor that the others did not, or one of "
            "another size, or in another order), so one offset names different tensors on different ranks; "
            "nothing was moved. Every rank must make the same heap.empty/free calls in the same order. "
            f"{report}"
        ), str(e)
        assert torch.equal(z, before), "an all-reduce over asymmetric heaps wrote its buffer"
        del a, b
    finally:
        heap.close()


def asymmetric_small_all_reduce() -> None:
    """Issue 62's misuse: on a fresh heap rank r allocates 1000 * (r + 1) floats, then every rank
    x (4096 bf16) and all-reduces it with check=True. The small all-reduce reads only this rank's
    x and stores into the peers' lamport workspace, which sits at the same offset on every rank
    (the end of the user region, whatever each rank allocated): the right sum on every rank, and
    the other tensor untouched. (Before, the workspace followed each rank's own tensors: peers
    stored into other memory and the call timed out.)"""
    import ironlink

    heap = ironlink.SymmetricHeap(32 << 20, timeout_s=COMPILE_TIMEOUT_S)  # the right sum, no timeout
    try:
        pad = heap.zeros((1000 * (dist.get_rank() + 1),), torch.float32)
        x = heap.empty((4096,), torch.bfloat16)
        x.copy_(ints(x.numel()))
        want = summed(x)
        ironlink.all_reduce(x, heap=heap, check=True)
        assert torch.equal(x, want), "wrong sum over an asymmetric heap"
        assert not pad.any(), "the small all-reduce wrote another tensor"
    finally:
        heap.close()


def asymmetric_moe() -> None:
    """Issue 62's misuse for MoeExchange: on a fresh heap rank r allocates 1000 * (r + 1) floats,
    then an exchange on each path, whose buffers (peers store into and read them at this rank's
    offsets) sit at the heap's top, the same offsets on every rank. The low-latency path (no
    barrier) gives the expert counts, offsets and combined rows it gives on a symmetric heap (its
    rows within an expert come in arrival order). The direct and relay paths, whose first
    barrier compares the ranks' heap calls, record HEAP_ASYMMETRIC on every rank and move no row,
    though every kernel of the layer runs (unchecked calls): recv_x stays as constructed (zeros).
    The tensor allocated first is untouched on every path."""
    import ironlink
    from _cases import moe_routing, moe_scaled_layer  # tests/gpu/workers/, the script's own directory

    rank, world = dist.get_rank(), dist.get_world_size()
    tokens, hidden, k, experts = 64, 256, 4, max(2 * world, 8)
    x, idx, wts = moe_routing(torch.Generator(device="cuda").manual_seed(11 + rank), tokens, hidden, experts, k, False)
    for path in ("low_latency", "direct", "relay"):
        nbytes = ironlink.MoeExchange.heap_bytes(world, tokens, hidden, k, path=path) + (1 << 20)
        got = {}
        for asymmetric in (False, True):
            heap = ironlink.SymmetricHeap(nbytes, timeout_s=COMPILE_TIMEOUT_S)
            try:
                pad = heap.zeros((1000 * (rank + 1 if asymmetric else 1),), torch.float32)
                moe = ironlink.MoeExchange(heap, tokens, hidden, k, experts, path=path)
                if path == "low_latency" or not asymmetric:
                    got[asymmetric] = moe_scaled_layer(moe, x, idx, wts)
                else:
                    recv_x, _, _, handle = moe.dispatch(x, idx, wts)  # unchecked: every kernel of the layer runs
                    moe.combine(recv_x.clone(), handle)
                    torch.cuda.synchronize()
                    expect_error(heap.check, "HEAP_ASYMMETRIC", "nothing was moved")
                    assert not moe.recv_x.any(), f"{path} path: rows reached recv_x on an asymmetric heap"
                assert not pad.any(), f"{path} path: the exchange wrote the tensor allocated before it"
            finally:
                heap.close()
        if path == "low_latency":  # counts, offsets, combine's rows
            assert all(torch.equal(a, b) for a, b in zip(got[False][-3:], got[True][-3:])), \
                "low_latency path: other bits on an asymmetric heap"


F32 = "torch.float32"


def asymmetric_allocation() -> None:
    """Rank 1 allocates 256 floats the others do not: their heap call #2 is z, rank 1's the extra."""

    def extra(heap: Any, a: Any) -> None:
        if dist.get_rank() == 1:
            heap.empty((256,), torch.float32)

    z_at = (1 << 22) + 256  # after a (4 MiB) and b (256 B)
    _asymmetric(
        extra, 2,
        lambda r: (f"alloc of 1024 bytes at offset {z_at}, shape (256,), {F32}" if r == 1
                   else f"alloc of 4194304 bytes at offset {z_at}, shape (1048576,), {F32}"),
    )


def asymmetric_free() -> None:
    """Rank 1 frees `a` (4 MiB at offset 0), which the others keep: their call #2 allocates z after
    b, rank 1's frees a (and its z lands where a was)."""

    def free_a(heap: Any, a: Any) -> None:
        if dist.get_rank() == 1:
            heap.free(a)

    _asymmetric(
        free_a, 2,
        lambda r: (f"free of 4194304 bytes at offset 0, shape (1048576,), {F32}" if r == 1
                   else f"alloc of 4194304 bytes at offset {(1 << 22) + 256}, shape (1048576,), {F32}"),
    )
