"""GPU cases of misuse that could corrupt silently: each gets a clear error or is made safe.

    torchrun --standalone --nproc_per_node=4 tests/gpu/misuse_worker.py    # tests/gpu/run.sh misuse

- two streams issuing calls on one heap: the heap orders them (ironlink/stream_order.py), so a
  large all-reduce on one stream and small ones on another, issued with no sync, all come out
  right;
- a heap used after close(), and after its process group was destroyed: IronlinkError naming the
  call and the problem, nothing launched;
- a call issued on only some ranks: TIMEOUT on the ranks that made it, within the heap's timeout,
  with the call and the device function named (check=True and heap.check());
- a user kernel launched with different grids on different ranks: the ranks with the larger grid
  record TIMEOUT (their extra CTAs have no partner). The host-level ops cannot differ: their grid
  is a function of the sizes and the world size (ironlink.tuning.choose).
A case that times out leaves the ranks' call counters apart, so each such case has a heap of its
own. Rank 0 prints "== misuse world N: X passed, Y failed =="; without GPUs, "skipped: no GPU".
"""

from __future__ import annotations

import sys
import time
from typing import Any

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the CPU machines have no torch
    torch = None  # type: ignore[assignment]

TIMEOUT_S = 1.0  # the heaps' wait timeout in the cases that time out
SLACK_S = 5.0  # a timed-out call must raise within TIMEOUT_S + SLACK_S


def expect_error(call: Any, *words: str) -> Any:
    """Runs `call`, which must raise IronlinkError with every one of `words` in its message."""
    import ironlink

    try:
        call()
    except ironlink.IronlinkError as e:
        for w in words:
            assert w in str(e), f"{w!r} not in the message: {e}"
        return e
    raise AssertionError(f"no IronlinkError (wanted one naming {words})")


def ints(n: int) -> Any:
    """Small integers: every sum is exact in fp32, so results compare bitwise."""
    return torch.randint(-8, 9, (n,), device="cuda").float()


def summed(x: Any) -> Any:
    want = x.clone()
    dist.all_reduce(want)
    return want


def two_streams(heap: Any) -> None:
    """A 64 MiB all-reduce on stream a and a small one on stream b, back to back with no sync,
    20 times: the heap makes b wait for a (and a for b the next round)."""
    import ironlink

    big, small = heap.empty((16 << 20,), torch.float32), heap.empty((1000,), torch.float32)
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    try:
        for i in range(20):
            xb, xs = ints(big.numel()), ints(small.numel())
            big.copy_(xb)
            small.copy_(xs)
            want_b, want_s = summed(xb), summed(xs)
            torch.cuda.synchronize()
            with torch.cuda.stream(a):
                ironlink.all_reduce(big, heap=heap)
            with torch.cuda.stream(b):
                ironlink.all_reduce(small, heap=heap)
            torch.cuda.synchronize()
            assert torch.equal(big, want_b), f"round {i}: the large all-reduce differs"
            assert torch.equal(small, want_s), f"round {i}: the small all-reduce differs"
        assert heap.stream_order.last == b, "the heap did not remember the last call's stream"
        heap.check()
    finally:
        heap.free(small)
        heap.free(big)


def after_close() -> None:
    import ironlink

    heap = ironlink.SymmetricHeap(1 << 20)
    x = heap.zeros((256,), torch.float32)
    heap.close()
    expect_error(lambda: ironlink.all_reduce(x, heap=heap), "ironlink.all_reduce", "closed")
    expect_error(lambda: heap.empty((4,), torch.float32), "closed")
    expect_error(lambda: heap.ctx, "closed")


def after_group_destroyed() -> None:
    """A heap on a subgroup that is then destroyed: calls name the destroyed group; close() still
    frees this rank's memory (no barrier: the group is gone)."""
    import ironlink

    group = dist.new_group(list(range(dist.get_world_size())))
    heap = ironlink.SymmetricHeap(1 << 20, group=group)
    x = heap.zeros((256,), torch.float32)
    ironlink.all_reduce(x, heap=heap, check=True)  # works while the group lives
    heap.barrier()
    dist.destroy_process_group(group)
    expect_error(lambda: ironlink.all_reduce(x, heap=heap), "ironlink.all_reduce", "process group was destroyed")
    expect_error(lambda: heap.ctx, "process group was destroyed")
    heap.close()
    assert heap.closed


def only_some_ranks() -> None:
    """Rank 0 skips an all-reduce the others make: they get TIMEOUT naming the call, within the
    timeout; the same through heap.check() without check=True."""
    import ironlink
    from ironlink import _abi

    for checked in (True, False):
        heap = ironlink.SymmetricHeap(1 << 20, timeout_s=TIMEOUT_S)
        try:
            x = heap.zeros((4096,), torch.float32)
            ironlink.all_reduce(x, heap=heap, check=True)  # compiled and in step first
            heap.barrier()
            if dist.get_rank() != 0:
                t0 = time.time()
                if checked:
                    e = expect_error(lambda: ironlink.all_reduce(x, check=True), "ironlink.all_reduce", "TIMEOUT")
                else:
                    ironlink.all_reduce(x)
                    e = expect_error(heap.check, "symm_all_reduce", "TIMEOUT", "skipped the call")
                took = time.time() - t0
                assert e.status == _abi.STATUS["TIMEOUT"] and e.function == "symm_all_reduce", (e.status, e.function)
                assert took < TIMEOUT_S + SLACK_S, f"TIMEOUT raised after {took:.1f} s (timeout {TIMEOUT_S} s)"
        finally:
            heap.close()


def different_grids() -> None:
    """A user kernel (ops' all-reduce kernel) on 4 CTAs on rank 0 and 8 elsewhere: every rank with
    8 CTAs records TIMEOUT. (Rank 0's CTAs all have partners: it may finish without an error;
    what it computed is not checked.)"""
    import ironlink
    from ironlink import _abi, ops

    heap = ironlink.SymmetricHeap(16 << 20, timeout_s=TIMEOUT_S)
    try:
        x = heap.zeros((1 << 20,), torch.float32)  # every CTA has work at both grids
        status = torch.zeros(_abi.MAX_CTAS, dtype=torch.int32, device="cuda")
        grid = 4 if dist.get_rank() == 0 else 8
        for g in (8, grid):  # first the same grid everywhere (compiles), then the mismatch
            heap.barrier()
            status.zero_()
            ops._all_reduce_kernel[(g,)](heap.ctx, x, x.numel(), _abi.REDUCE_OP["SUM"], status, num_warps=4)
            torch.cuda.synchronize()
        codes = set(status[:grid].tolist())
        try:
            heap.check()
            recorded = 0
        except ironlink.IronlinkError as e:
            recorded = e.status or 0
        if grid == 8:
            assert _abi.STATUS["TIMEOUT"] in codes, f"statuses {sorted(codes)}: no TIMEOUT for the larger grid"
            assert recorded == _abi.STATUS["TIMEOUT"], f"heap.check() recorded {recorded}"
    finally:
        heap.close()


def main() -> int:
    if torch is None or not torch.cuda.is_available():
        print("misuse: skipped: no GPU", flush=True)
        return 0
    from _cases import Cases  # tests/gpu/, the script's own directory
    import ironlink

    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(77 + rank)
    t0 = time.time()
    cases = Cases()
    heap = ironlink.SymmetricHeap(160 << 20)
    cases.run("two streams issuing calls on one heap", lambda: two_streams(heap))
    heap.close()
    cases.run("heap used after close", after_close)
    cases.run("heap used after its process group was destroyed", after_group_destroyed)
    cases.run("a call issued on only some ranks", only_some_ranks)
    cases.run("a user kernel launched with different grids", different_grids)
    code = cases.report("misuse", world, t0)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
