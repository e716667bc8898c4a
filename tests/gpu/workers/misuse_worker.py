"""GPU cases of misuse that could corrupt silently: each gets a clear error or is made safe.

    torchrun --standalone --nproc_per_node=4 tests/gpu/workers/misuse_worker.py    # tests/gpu/run.sh misuse

- two streams issuing calls on one heap: the heap orders them (ironlink/runtime/streams.py), so a
  large all-reduce on one stream and small ones on another, issued with no sync, all come out
  right;
- a heap used after close(), and after its process group was destroyed: IronlinkError naming the
  call and the problem, nothing launched;
- a call issued on only some ranks: TIMEOUT on the ranks that made it, within the heap's timeout:
  with check=True from the comparison of the ranks' calls before anything launches, naming the
  ranks that did not make it; without, through heap.check(), naming the device function;
- ranks calling one op with other sizes (check=True): IronlinkError on every rank naming each
  rank's call, nothing launched, the input unchanged;
- a user kernel launched with different grids on different ranks: every CTA of every rank returns
  GRID_MISMATCH and heap.check() names it; nothing is written. (The host-level ops launch the same
  grid for the same sizes: ironlink.tuning.choose.)
- ranks whose heaps saw different calls (one rank allocated a tensor the others did not; one freed
  a tensor the others kept): the next all-reduce raises HEAP_ASYMMETRIC on every rank, with
  check=True and through heap.check(), naming the first heap call that differs on each rank and
  the ranks' digests; nothing is written;
- a CUDA graph of calls replayed after a lost peer: the replay ends in about one timeout, not one
  a call, and heap.check() puts the timeout back;
- a fused call skipped by one rank, on the paths that wait once a chunk or tile (the copy engine,
  the tile method): TIMEOUT within the timeout and slack, one timeout a CTA
  (_skipped_fused_calls.py).
A case that times out leaves the ranks' call counters apart, so each such case has a heap of its
own. Rank 0 prints "== misuse world N: X passed, Y failed =="; without GPUs, "skipped: no GPU".
"""

from __future__ import annotations

import itertools
import sys
import time
from typing import Any

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the CPU machines have no torch
    torch = None  # type: ignore[assignment]

from _misuse_common import COMPILE_TIMEOUT_S, SLACK_S, TIMEOUT_S, expect_error, ints, summed  # the script's own directory


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
    """Rank 0 skips an all-reduce the others make: they get TIMEOUT within the timeout, with
    check=True from the comparison of the calls (naming rank 0, nothing launched; then
    heap.check() raises it, recorded in the context), without it
    through heap.check() naming the wait that timed out. At a decode size (the lamport path,
    whose wait is `symm_tile_wait`) and a larger one (the device library's `symm_all_reduce`)."""
    import ironlink
    from ironlink.language import _abi
    from ironlink.ops.collectives import workspace_requests

    for n in (4096, 1 << 20):  # fp32: 16 KiB and 4 MiB
        lamport = bool(workspace_requests(4 * n, 4, dist.get_world_size()))
        function = "symm_tile_wait" if lamport else "symm_all_reduce"  # the device function that waited
        for checked in (True, False):
            heap = ironlink.SymmetricHeap(16 << 20, timeout_s=COMPILE_TIMEOUT_S)
            try:
                x = heap.zeros((n,), torch.float32)
                ironlink.all_reduce(x, heap=heap, check=True)  # compiled and in step first
                heap.barrier()
                heap.set_timeout(TIMEOUT_S)
                if dist.get_rank() != 0:
                    t0 = time.time()
                    if checked:
                        e = expect_error(lambda: ironlink.all_reduce(x, check=True), "ironlink.all_reduce(check=True)",
                                         "rank(s) [0] did not make this call within", "nothing was launched")
                        # a lost peer, recorded in the context as a device wait's TIMEOUT would be
                        expect_error(heap.check, "the comparison of the ranks' calls (check=True)", "recorded TIMEOUT")
                    else:
                        ironlink.all_reduce(x)
                        e = expect_error(heap.check, function, "TIMEOUT", "skipped the call")
                        assert function in e.function, (n, e.function)
                    took = time.time() - t0
                    assert e.status == _abi.STATUS["TIMEOUT"], (n, e.status)
                    assert took < TIMEOUT_S + SLACK_S, f"TIMEOUT raised after {took:.1f} s (timeout {TIMEOUT_S} s)"
            finally:
                heap.close()


def lost_peer_graph() -> None:
    """A CUDA graph of 12 all-reduces, small ones (the lamport path's Triton polls) between larger
    ones (the device library's waits), replayed by every rank but rank 0: the first wait records
    TIMEOUT and sets the context's wait timeout to 0, so the replay ends in about one timeout,
    not one a call (the small calls alone would take 6 x the timeout); heap.check() raises it and
    puts the timeout back, so the next call waits it out again."""
    import ironlink
    from ironlink.tune.timing import captured

    heap = ironlink.SymmetricHeap(32 << 20, timeout_s=COMPILE_TIMEOUT_S)
    try:
        small, large = heap.zeros((1024,), torch.float32), heap.zeros((1 << 20,), torch.float32)  # 4 KiB, 4 MiB
        calls = itertools.count()
        g = captured(lambda: ironlink.all_reduce(small if next(calls) % 2 == 0 else large, heap=heap), 12)
        heap.check()
        heap.barrier()
        heap.set_timeout(TIMEOUT_S)
        if dist.get_rank() != 0:
            t0 = time.time()
            g.replay()
            torch.cuda.synchronize()
            took = time.time() - t0
            expect_error(heap.check, "recorded TIMEOUT")
            assert took < 3 * TIMEOUT_S, f"the replay took {took:.1f} s: more than one timeout ({TIMEOUT_S} s)"
            t0 = time.time()
            ironlink.all_reduce(small)
            expect_error(heap.check, "recorded TIMEOUT")
            took = time.time() - t0
            assert took > 0.8 * TIMEOUT_S, f"after heap.check() a wait took {took:.2f} s: the timeout was not put back"
    finally:
        heap.close()


def different_sizes() -> None:
    """Each rank all-reduces another number of elements with check=True, at a decode size (the
    lamport path) and a larger one: every rank raises, naming each rank's call, before anything
    launches; the input is unchanged, and the heap serves the next call. The tensors are not the
    heap's (all_reduce stages them), so the heaps' calls stay the same on every rank."""
    import ironlink

    rank = dist.get_rank()
    heap = ironlink.SymmetricHeap(16 << 20, timeout_s=COMPILE_TIMEOUT_S)  # no call here may time out
    try:
        for n in (4096, 1 << 20):
            x = ints(n + 256 * rank)
            before = x.clone()
            e = expect_error(lambda: ironlink.all_reduce(x, heap=heap, check=True), "ironlink.all_reduce(check=True)",
                             f"on rank {rank}: the ranks' calls differ in elements: rank 0: "
                             f"ironlink.all_reduce(elements={n}, dtype=float32, op=sum); rank 1: "
                             f"ironlink.all_reduce(elements={n + 256},", "nothing was launched")
            assert e.status is None, e.status
            torch.cuda.synchronize()
            assert torch.equal(x, before), "the input changed"
            y = ints(n)
            want = summed(y)
            ironlink.all_reduce(y, heap=heap, check=True)  # the same call everywhere: it runs
            assert torch.equal(y, want)
    finally:
        heap.close()


def _all_reduce_on_different_grids(heap: Any, n: int) -> tuple[Any, Any, set[int], float]:
    """Ops' all-reduce kernel over `n` fp32 of `heap`: compiled on every rank before any rank
    launches (a rank still compiling would keep its peers waiting past the 1 s timeout), run on
    the same grid everywhere (checked), then on 4 CTAs on rank 0 and 8 elsewhere. Returns (x, x
    before that call, the statuses of this rank's CTAs, the call's seconds)."""
    from ironlink.language import _abi
    from ironlink.ops import collectives as ops

    x = heap.empty((n,), torch.float32)
    x.copy_(ints(x.numel()))
    want = summed(x)
    status = torch.zeros(_abi.MAX_CTAS, dtype=torch.int32, device="cuda")
    grid = 4 if dist.get_rank() == 0 else 8
    args = (heap.ctx, x, x.numel(), _abi.REDUCE_OP["SUM"], status)
    ops._all_reduce_kernel.warmup(*args, num_warps=4, grid=(8,))
    heap.barrier()
    ops._all_reduce_kernel[(8,)](*args, num_warps=4)
    torch.cuda.synchronize()
    heap.check()
    assert torch.equal(x, want), "the same grid everywhere: wrong sum"
    before = x.clone()
    heap.barrier()
    status.zero_()
    t0 = time.time()
    ops._all_reduce_kernel[(grid,)](*args, num_warps=4)
    torch.cuda.synchronize()
    return x, before, set(status[:grid].tolist()), time.time() - t0


def different_grids() -> None:
    """A user kernel (ops' all-reduce kernel, 4 MiB: two-shot, barriers) on 4 CTAs on rank 0 and 8
    elsewhere: every CTA of every rank returns GRID_MISMATCH (the CTAs beyond rank 0's grid after
    the timeout), heap.check() raises it with its message on every rank, the buffer is as it was."""
    import ironlink
    from ironlink.language import _abi

    heap = ironlink.SymmetricHeap(16 << 20, timeout_s=TIMEOUT_S)
    try:
        x, before, codes, _ = _all_reduce_on_different_grids(heap, 1 << 20)  # every CTA has work at both grids
        mismatch = _abi.STATUS["GRID_MISMATCH"]
        assert codes == {mismatch}, f"CTA statuses {sorted(codes)}, wanted only GRID_MISMATCH ({mismatch})"
        e = expect_error(heap.check)
        assert str(e) == (
            f"device function symm_all_reduce on rank {dist.get_rank()} recorded GRID_MISMATCH ({mismatch}): ranks "
            "launched this call with grids of different sizes; nothing was moved. A kernel that calls whole-tensor "
            "collectives must have the same grid on every rank"
        ), str(e)
        assert e.status == mismatch and e.function == "symm_all_reduce", (e.status, e.function)
        assert torch.equal(x, before), "a call with different grids wrote the buffer"
    finally:
        heap.close()


def different_grids_small() -> None:
    """As `different_grids` at 4 KiB, where the all-reduce runs over LL packets (no barrier): the
    packets carry the sender's grid, so none is taken; after the timeout every rank records
    GRID_MISMATCH (a CTA with no partner on the smaller grid may return TIMEOUT), heap.check()
    raises it, the buffer is as it was."""
    import ironlink
    from ironlink.language import _abi

    heap = ironlink.SymmetricHeap(16 << 20, timeout_s=TIMEOUT_S)
    try:
        x, before, codes, took = _all_reduce_on_different_grids(heap, 1024)
        mismatch, timeout = _abi.STATUS["GRID_MISMATCH"], _abi.STATUS["TIMEOUT"]
        assert mismatch in codes and codes <= {mismatch, timeout}, f"CTA statuses {sorted(codes)}"
        assert took < TIMEOUT_S + SLACK_S, f"GRID_MISMATCH came after {took:.1f} s"
        e = expect_error(heap.check, "GRID_MISMATCH", "grids of different sizes")
        assert e.status == mismatch and e.function == "symm_all_reduce", (e.status, e.function)
        assert torch.equal(x, before), "a call with different grids wrote the buffer"
    finally:
        heap.close()


def main() -> int:
    if torch is None or not torch.cuda.is_available():
        print("misuse: skipped: no GPU", flush=True)
        return 0
    from _cases import Cases  # tests/gpu/workers/, the script's own directory
    from _misuse_asymmetric import (asymmetric_allocation, asymmetric_free, asymmetric_moe,  # beside it
                                    asymmetric_small_all_reduce)
    from _skipped_fused_calls import skipped_fused_calls  # beside it
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
    cases.run("a graph replayed after a lost peer: one timeout, not one a call", lost_peer_graph)
    cases.run("one op called with other sizes on different ranks (check=True)", different_sizes)
    cases.run("a user kernel launched with different grids", different_grids)
    cases.run("a user kernel launched with different grids, LL packets", different_grids_small)
    cases.run("asymmetric heaps: an allocation on one rank only", asymmetric_allocation)
    cases.run("asymmetric heaps: a free on one rank only", asymmetric_free)
    cases.run("asymmetric heaps: a small all-reduce over the lamport workspace", asymmetric_small_all_reduce)
    cases.run("asymmetric heaps: MoeExchange on every path", asymmetric_moe)
    cases.run("a fused call skipped by one rank: one timeout a CTA, not one a chunk or tile", skipped_fused_calls)
    code = cases.report("misuse", world, t0)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
