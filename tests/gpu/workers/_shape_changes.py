"""Ops with peer slots called back to back with a new shape every call, the ranks kept apart.

Their kernels use alternate halves of a workspace in alternate launches: a rank in launch m knows
every peer is past launch m - 2, not past m - 1. Each half is half the workspace whatever the
call's shape (`ironlink.runtime.workspaces.slot_half`); a half placed by the shape ((world - 1)
x M x N, as before 2026-11-29) let launch m of another shape store into the part of the other
half that a slower peer still read for launch m - 1: its sum took the new data (silently wrong)
and emptied it, and its next call waited for data that never came (TIMEOUT).

Here each rank sleeps on the GPU before a different call (rank r before calls r, r + world, ...),
so some rank is always behind its peers while they launch the next call, and every call's result
is checked against a float64 reference, after the calls (no host sync between them) and bitwise
equal on every rank. fusion_worker.py registers the cases.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

import ironlink

from _cases import close_to, lamport_slots_empty, same_on_all_ranks  # tests/gpu/workers/, the script's own directory

TOKENS = (32, 8, 1, 24, 3, 16, 32, 5)  # all_reduce_rmsnorm's rows, call after call (modes change with them)
ROWS = (16, 48, 8, 40, 1, 32)  # matmul_all_reduce's M
ELEMENTS = (4096, 512, 16384, 64, 8192, 1024)  # all_reduce's (its lamport path)
SLEEP_CYCLES = 40_000  # ~20 us at the H200's clock: longer than a small call


def _behind(i: int) -> None:
    """The rank whose turn call `i` is sleeps on the GPU before it: its peers run ahead."""
    if i % dist.get_world_size() == dist.get_rank():
        torch.cuda._sleep(SLEEP_CYCLES)


def rmsnorm(heap: Any, mode: Optional[str], rounds: int = 3, hidden: int = 1024) -> None:
    """all_reduce_rmsnorm over TOKENS, `rounds` times, in `mode` (None: as ironlink chooses, so
    the mode changes with the tokens too)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    calls = [t for _ in range(rounds) for t in TOKENS]
    gen = torch.Generator(device="cuda").manual_seed(77)
    parts = [[torch.randn(t, hidden, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(world)]
             for t in calls]
    res0 = [torch.randn(t, hidden, device="cuda", generator=gen).to(torch.bfloat16) for t in calls]
    weight = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=gen)).to(torch.bfloat16)
    xs = [heap.empty((t, hidden), torch.bfloat16) for t in calls]
    try:
        residuals = [r.clone() for r in res0]
        outs = [torch.empty(t, hidden, device="cuda", dtype=torch.bfloat16) for t in calls]
        for x, p in zip(xs, parts):
            x.copy_(p[rank])
        dist.barrier()
        torch.cuda.synchronize()
        for i, (x, res, out) in enumerate(zip(xs, residuals, outs)):
            _behind(i)
            ironlink.all_reduce_rmsnorm(x, res, weight, 1e-6, out=out, heap=heap, mode=mode)
        torch.cuda.synchronize()
        heap.check()
        for i, (p, r0, res, out) in enumerate(zip(parts, res0, residuals, outs)):
            want_res = sum(q.double() for q in p) + r0.double()
            want = want_res * torch.rsqrt(want_res.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
            close_to(res, want_res, torch.bfloat16, f"call {i} ({calls[i]} tokens): residual")
            close_to(out, want, torch.bfloat16, f"call {i} ({calls[i]} tokens): out")
            same_on_all_ranks(out)
        lamport_slots_empty(heap, "all_reduce_rmsnorm", [torch.bfloat16])
    finally:
        for x in reversed(xs):
            heap.free(x)


def matmul(heap: Any, method: Optional[str], rounds: int = 3, n: int = 1024, k: int = 256) -> None:
    """matmul_all_reduce over ROWS, `rounds` times, with `method` (None: ironlink's choice)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    calls = [m for _ in range(rounds) for m in ROWS]
    gen = torch.Generator(device="cuda").manual_seed(78)
    a_all = [[torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(world)]
             for m in calls]
    b_all = [(torch.randn(k, n, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16) for _ in range(world)]
    outs = [heap.empty((m, n), torch.bfloat16) for m in calls]
    try:
        dist.barrier()
        torch.cuda.synchronize()
        for i, (a, out) in enumerate(zip(a_all, outs)):
            _behind(i)
            ironlink.matmul_all_reduce(a[rank], b_all[rank], out=out, heap=heap, method=method)
        torch.cuda.synchronize()
        heap.check()
        for i, (a, out) in enumerate(zip(a_all, outs)):
            close_to(out, sum(x.double() @ y.double() for x, y in zip(a, b_all)), torch.bfloat16,
                     f"call {i} ({calls[i]} rows)")
            same_on_all_ranks(out)
        lamport_slots_empty(heap, "matmul_all_reduce", [torch.bfloat16])
    finally:
        for out in reversed(outs):
            heap.free(out)


def all_reduce(heap: Any, rounds: int = 3) -> None:
    """all_reduce (sum, bf16) over ELEMENTS, `rounds` times: the sizes its lamport path takes."""
    world, rank = dist.get_world_size(), dist.get_rank()
    calls = [n for _ in range(rounds) for n in ELEMENTS]
    gen = torch.Generator(device="cuda").manual_seed(79)
    parts = [[torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(world)] for n in calls]
    bufs = [heap.empty((n,), torch.bfloat16) for n in calls]
    try:
        for buf, p in zip(bufs, parts):
            buf.copy_(p[rank])
        dist.barrier()
        torch.cuda.synchronize()
        for i, buf in enumerate(bufs):
            _behind(i)
            ironlink.all_reduce(buf, heap=heap)
        torch.cuda.synchronize()
        heap.check()
        for i, (buf, p) in enumerate(zip(bufs, parts)):
            close_to(buf, sum(q.double() for q in p), torch.bfloat16, f"call {i} ({calls[i]} elements)")
            same_on_all_ranks(buf)
        lamport_slots_empty(heap, "all_reduce", [torch.bfloat16])
    finally:
        for buf in reversed(bufs):
            heap.free(buf)
