"""MoeExchange's routing, layout, kernels and capacity check on the CPU: `world` simulated ranks in
one process, Triton kernels in the interpreter (TRITON_INTERPRET=1, set by tests/test_moe_cpu.py
before Triton is imported), the two all_to_all_v exchanges done in Python between the ranks'
buffers. Checks dispatch bit-exact against the routing, combine against a float64 reference, and
the capacity error. Exits non-zero with a message on the first mismatch."""

from __future__ import annotations

import sys
from typing import Any

import torch

from ironlink.errors import IronlinkError
from ironlink.moe import MoeExchange


class FakeHeap:
    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world_size, self.device = rank, world, torch.device("cpu")

    def empty(self, shape: Any, dtype: Any) -> Any:
        return torch.full(shape, 7, dtype=dtype)  # not zero: unwritten rows must not look right

    def free(self, t: Any) -> None:
        pass

    def check(self) -> None:
        pass


def exchange(send: list[tuple[Any, Any]], recv: list[tuple[Any, Any, Any]]) -> None:
    """all_to_all_v between simulated ranks: send[q] = (rows, counts), recv[p] = (out, counts,
    offsets); rank q's rows for p follow its rows for ranks < p."""
    world = len(send)
    for p, (out, counts, offsets) in enumerate(recv):
        at = 0
        for q, (rows, sent) in enumerate(send):
            first = int(sent[:p].sum())
            n = int(sent[p])
            out[at:at + n] = rows[first:first + n]
            counts[q], offsets[q] = n, at
            at += n
    assert world == len(recv)


def layer(ms: list[MoeExchange], xs: list[Any], ids: list[Any], ws: list[Any]) -> tuple[list[Any], ...]:
    """dispatch, y = recv_x * (global expert + 1), combine, on every simulated rank."""
    packed = [m._pack(x, i, w) for m, x, i, w in zip(ms, xs, ids, ws)]
    exchange([(m.send_buf, m.send_counts) for m in ms], [(m.recv_buf, m.recv_counts, m.recv_offsets) for m in ms])
    outs, recvs, counts = [], [], []
    handles = []
    for m, (t, send_row) in zip(ms, packed):
        c, off, slot, weight, received = m._layout()
        recvs.append(m.recv_x.clone())
        counts.append(c)
        e_of_row = torch.searchsorted(torch.cumsum(c, 0), torch.arange(m.capacity), right=True)
        scale = (m.rank * m.local_experts + e_of_row.clamp(max=m.local_experts - 1) + 1).to(m.dtype)[:, None]
        from ironlink.moe import Handle
        handles.append(Handle(t, send_row, slot, weight, received))
        m._reduce_here((m.recv_x * scale).contiguous(), handles[-1])
    exchange([(m.back_send, m.recv_counts) for m in ms], [(m.back_recv, m.back_counts, m.back_offsets) for m in ms])
    for m, h in zip(ms, handles):
        outs.append(m._sum_ranks(h))
    return recvs, counts, outs


def main() -> int:
    world, tokens, hidden, k, experts = 3, 9, 36, 3, 6  # hidden not a multiple of 8: padded rows
    le = experts // world
    for skewed in (False, True):
        g = torch.Generator().manual_seed(5 + skewed)
        ms = [MoeExchange(FakeHeap(r, world), tokens, hidden, k, experts) for r in range(world)]
        xs = [torch.randn(tokens - r, hidden, generator=g).to(torch.bfloat16) for r in range(world)]
        scores = [torch.rand(x.shape[0], experts, generator=g) for x in xs]
        if skewed:
            for s in scores:
                s[:, 0] += 10
        ids = [s.topk(k, dim=1).indices for s in scores]
        ws = [torch.softmax(torch.randn(x.shape[0], k, generator=g), 1) for x in xs]
        recvs, counts, outs = layer(ms, xs, ids, ws)
        for p in range(world):
            want = [xs[q][(ids[q] == e).any(1)] for e in range(p * le, (p + 1) * le) for q in range(world)]
            rows = torch.cat(want)
            n = rows.shape[0]
            assert int(counts[p].sum()) == n, f"rank {p}: expert counts {counts[p].tolist()} for {n} rows"
            assert torch.equal(recvs[p][:n], rows), f"rank {p}: dispatched rows differ from the routing"
            ref = (xs[p].double()[:, None, :] * (ids[p].double() + 1)[..., None] * ws[p].double()[..., None]).sum(1)
            err = ((outs[p].double() - ref).abs().max() / ref.abs().max()).item()
            assert err < 2e-2, f"rank {p}: combine rel error {err:.3e}"
        again = layer(ms, xs, ids, ws)[2]
        assert all(torch.equal(a, b) for a, b in zip(again, outs)), "combine differs run to run"
        print(f"ok: {'skewed' if skewed else 'uniform'}: world {world}, rows per rank {[int(c.sum()) for c in counts]}")
    # Capacity: expert 0 takes every first choice; rank 0's 4-row recv_x overflows on expert 0.
    ms = [MoeExchange(FakeHeap(r, world), tokens, hidden, k, experts, recv_capacity=4) for r in range(world)]
    xs = [torch.ones(tokens, hidden, dtype=torch.bfloat16) for _ in range(world)]
    ids = [torch.tensor([[0, 2, 4]] * tokens) for _ in range(world)]
    ws = [torch.full((tokens, k), 1 / k) for _ in range(world)]
    recvs, counts, _ = layer(ms, xs, ids, ws)
    try:
        ms[0].check()
        raise AssertionError("no CAPACITY_EXCEEDED for 27 rows into a 4-row recv_x")
    except IronlinkError as e:
        assert "CAPACITY_EXCEEDED" in str(e) and "expert 0 (27 rows)" in str(e), str(e)
    ms[0].check()  # cleared
    print("ok: capacity error names expert 0 and its 27 rows; only 4 rows written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
