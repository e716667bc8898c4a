"""bench/moe_torch.py's torch_nvshmem contender (of bench/moe.py) without GPUs: when it is
skipped and why, the buffer sizes, and its dispatch + combine on simulated ranks (threads, an
all_to_all_vdev done in Python with the op's semantics) against the routing. The parts that run
torch are skipped without it (the CI venv)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from _bench_scripts import load_bench  # tests/, the helpers' folder
from _ranks import run_ranks



def load() -> Any:
    return load_bench("moe_torch")


def fake_op(*names: str) -> Any:
    args = [SimpleNamespace(name=n) for n in names]
    return SimpleNamespace(default=SimpleNamespace(_schema=SimpleNamespace(arguments=args)))


def test_skip_reasons() -> None:
    m = load()
    ops = SimpleNamespace(all_to_all_vdev=fake_op(*m.OP_ARGS))
    nvshmem = SimpleNamespace(is_nvshmem_available=lambda: True)
    row = 7168 * 2
    assert m.skip_reason(4, row, nvshmem, ops, {}) is None
    assert m.skip_reason(2, row, nvshmem, ops, {}) is None
    assert m.skip_reason(8, row, nvshmem, ops, {}) is None
    assert "world size 1" in m.skip_reason(1, row, nvshmem, ops, {})
    assert "no torch.ops.symm_mem.all_to_all_vdev" in m.skip_reason(4, row, nvshmem, SimpleNamespace(), {})
    old = SimpleNamespace(all_to_all_vdev=fake_op("input", "out", "in_out_splits", "group_name"))
    assert "in_out_splits" in m.skip_reason(4, row, nvshmem, old, {})
    assert "is_nvshmem_available" in m.skip_reason(4, row, SimpleNamespace(is_nvshmem_available=lambda: False), ops, {})
    assert "is_nvshmem_available" in m.skip_reason(4, row, None, ops, {})
    # 64 blocks over 3 ranks: 21 per peer, which 14336 bytes do not divide; 16 blocks (the
    # variable) over 4 ranks: 4 per peer, which 1000 bytes do.
    assert "21 blocks" in m.skip_reason(3, row, nvshmem, ops, {})
    assert m.skip_reason(4, 1000, nvshmem, ops, {"TORCH_SYMMMEM_NBLOCKS": "16"}) is None
    assert "16 blocks" in m.skip_reason(4, 1000, nvshmem, ops, {})


def test_buffers_hold_the_worst_case() -> None:
    m = load()
    row = 7168 * 2
    assert m.buffer_rows(4, 8192, 8, row) == (8192 * 8, 4 * 8192 * 8)
    send, recv = m.buffer_rows(4, 1, 1, row)  # tiny: padded to the 4 MiB that fix the grid
    assert send * row >= m.MIN_BUFFER_BYTES and recv * row >= m.MIN_BUFFER_BYTES
    assert m.heap_bytes(4, 8192, 8, row) == 6 * 8192 * 8 * row + m.HEAP_SLACK_BYTES


def test_weighted_sum() -> None:
    torch = pytest.importorskip("torch")
    m = load()
    rows = torch.randn(6, 5).to(torch.bfloat16)
    w = torch.rand(3, 2)
    want = (rows.float().view(3, 2, 5) * w[..., None]).sum(1).to(torch.bfloat16)
    assert torch.equal(m.weighted_sum(rows, w), want)


def simulated_paths(m: Any, torch: Any, world: int, tokens: int, hidden: int, k: int, experts: int) -> list[Any]:
    """One NvshmemPath per simulated rank on CPU tensors (no NVSHMEM: the buffers set here, the op
    replaced by a Python all_to_all_vdev between the ranks' threads: each rank pulls its rows
    from every rank's `input` and writes the counts and offsets to its `out_splits_offsets`)."""
    barrier = threading.Barrier(world)
    posted: list[Any] = [None] * world
    send_rows, recv_rows = m.buffer_rows(world, tokens, k, hidden * 2)

    def a2a_for(rank: int) -> Any:
        def a2a(inp: Any, out: Any, in_splits: Any, out_splits_offsets: Any, group: str) -> None:
            posted[rank] = (inp, in_splits.clone())
            barrier.wait()
            at = 0
            for q, (rows, splits) in enumerate(posted):
                first, n = int(splits[:rank].sum()), int(splits[rank])
                out[at:at + n] = rows[first:first + n]
                out_splits_offsets[0, q], out_splits_offsets[1, q] = n, at
                at += n
            barrier.wait()
        return a2a

    paths = []
    for r in range(world):
        p = m.NvshmemPath.__new__(m.NvshmemPath)
        p.world, p.hidden, p.topk, p.local_experts, p.group = world, hidden, k, experts // world, "sim"
        p.send, p.back = (torch.full((send_rows, hidden), 7.0, dtype=torch.bfloat16) for _ in range(2))
        p.recv = torch.full((recv_rows, hidden), 7.0, dtype=torch.bfloat16)
        p.splits = [torch.zeros(world, dtype=torch.int64) for _ in range(2)]
        p.recv_splits = [torch.zeros(2, world, dtype=torch.int64) for _ in range(2)]
        p.turn = 0
        p.back_splits, p.back_recv_splits = torch.zeros(world, dtype=torch.int64), torch.zeros(2, world, dtype=torch.int64)
        p.a2a = a2a_for(r)
        paths.append(p)
    return paths


def test_contender_on_simulated_ranks() -> None:
    torch = pytest.importorskip("torch")
    m = load()
    world, tokens, hidden, k, experts = 3, 11, 16, 3, 6
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(tokens, hidden, generator=g).to(torch.bfloat16) for _ in range(world)]
    ids = [torch.rand(tokens, experts, generator=g).topk(k, dim=1).indices for _ in range(world)]
    ws = [torch.softmax(torch.randn(tokens, k, generator=g), 1) for _ in range(world)]
    paths = simulated_paths(m, torch, world, tokens, hidden, k, experts)
    received: list[Any] = [None] * world
    outs: list[Any] = [None] * world

    def rank(r: int) -> None:
        dispatch, layer = paths[r].contender(xs[r], ids[r], ws[r])
        dispatch()
        received[r] = paths[r].received().clone()
        outs[r] = layer()

    run_ranks(rank, world)
    le = experts // world
    for p in range(world):
        # Rank p gets, from each rank q in order, q's (token, choice) rows for its experts, by expert.
        want = torch.cat([xs[q][(ids[q].reshape(-1) == e).nonzero()[:, 0] // k]
                          for q in range(world) for e in range(p * le, (p + 1) * le)])
        assert torch.equal(received[p], want), f"rank {p}: dispatched rows"
        ref = (xs[p].float()[:, None, :].expand(tokens, k, hidden) * ws[p][..., None]).sum(1).to(torch.bfloat16)
        assert torch.equal(outs[p], ref), f"rank {p}: combine"
