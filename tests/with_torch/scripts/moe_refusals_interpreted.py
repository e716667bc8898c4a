"""MoeExchange on the CPU, what it refuses, chooses and reports (`world` simulated ranks in one
process, Triton kernels in the interpreter as in moe_interpreted.py, whose harness _moe_sim.py
this shares): arguments refused with the words that name them, heap_bytes equal to what is
allocated, the path chosen for a heap and a token count, the capacity error naming the expert
and its rows, out-of-range expert ids reported by their rank on the direct and low-latency
paths, the deferred receive's misuses and a sender that never comes (TIMEOUT), and a failed
barrier that moves no row. Exits non-zero with a message on the first mismatch."""

from __future__ import annotations

import sys

import torch

from ironlink.language import _abi
from ironlink.runtime.errors import IronlinkError
from ironlink.moe import MoeConfig, MoeExchange
from ironlink.moe import exchange as exchange_mod
from ironlink.runtime.tuning.moe import DEFAULT_MOE_CONFIG as DEFAULT

from _moe_sim import (FakeHeap, SimHeap, _bytes, _scaled_rows, direct_layer, layer,  # tests/with_torch/scripts/, beside
                      low_latency_layer, sim_heaps)

FP8 = torch.float8_e4m3fn
WORLD, TOKENS, HIDDEN, K, EXPERTS = 3, 9, 36, 3, 6  # hidden not a multiple of 8: padded rows


def refusals_and_choices(world: int, tokens: int, hidden: int, k: int, experts: int) -> None:
    """Bad arguments refused with words that name them, heap_bytes exact, the path each heap and
    token count gets."""
    try:
        MoeExchange(FakeHeap(0, world), tokens, 200, k, experts, dispatch_dtype=FP8)
        raise AssertionError("fp8 dispatch accepted hidden = 200")
    except ValueError as e:
        assert "multiple of 128" in str(e), str(e)
    m = MoeExchange(FakeHeap(0, world), tokens, hidden, k, experts)
    x, w = torch.zeros(tokens, hidden, dtype=torch.bfloat16), torch.ones(tokens, k)
    for idx, wts, words in ((w, w, "topk_idx must hold integers"), (w.long(), w.long(), "topk_weights must be floating")):
        try:
            m.dispatch(x, idx, wts)
            raise AssertionError(f"accepted; wanted {words!r}")
        except TypeError as e:
            assert words in str(e), str(e)
    for w, h, kk, fp8 in ((3, 36, 3, False), (2, 256, 5, True), (4, 8192, 8, False)):
        fh = FakeHeap(0, w)
        MoeExchange(fh, 5, h, kk, 4 * w, dispatch_dtype=FP8 if fp8 else None)
        want = exchange_mod._heap_bytes(w, 5, h, kk, fp8, FakeHeap.ALIGN, path="relay")
        assert fh.allocated == want, f"heap_bytes {want} != the {fh.allocated} bytes allocated (world {w}, hidden {h})"
    for kwargs, heap, words in (({"sms": -1}, FakeHeap(0, world), "sms must be"),
                                ({"path": "ring"}, FakeHeap(0, world), "path must be"),
                                ({"path": "direct"}, FakeHeap(0, world), "needs a heap of one node"),
                                ({"path": "low_latency"}, FakeHeap(0, world), "needs a heap of one node"),
                                ({"path": "low_latency", "recv_capacity": 8}, sim_heaps(world, 1 << 20)[0],
                                 "no recv_capacity")):
        try:
            MoeExchange(heap, tokens, hidden, k, experts, **kwargs)
            raise AssertionError(f"accepted {kwargs}")
        except ValueError as e:
            assert words in str(e), str(e)
    assert MoeExchange(FakeHeap(0, world), tokens, hidden, k, experts).path == "relay"
    # One node: low_latency for few tokens (MoeConfig.low_latency_max_tokens; an fp8 dispatch
    # too), else direct, and direct for a given recv_capacity; a config's own limit.
    heap = sim_heaps(world, 64 << 20)[0]
    few, many = DEFAULT.low_latency_max_tokens, DEFAULT.low_latency_max_tokens + 1
    assert MoeExchange(heap, few, hidden, k, experts, sms=1).path == "low_latency"
    assert MoeExchange(heap, many, hidden, k, experts).path == "direct"
    assert MoeExchange(heap, few, 256, k, experts, dispatch_dtype=FP8).path == "low_latency"
    assert MoeExchange(heap, many, 256, k, experts, dispatch_dtype=FP8).path == "direct"
    assert MoeExchange(heap, few, hidden, k, experts, recv_capacity=8).path == "direct"
    for n, limit, chosen in ((few, few - 1, "direct"), (many, many, "low_latency")):
        assert MoeExchange(heap, n, hidden, k, experts, config=MoeConfig(low_latency_max_tokens=limit)).path == chosen
    for bad, words in (({"pull_rows": 3}, "a power of two"), ({"row_block": 0}, "must be at least 1")):
        try:
            MoeConfig(**bad)
            raise AssertionError(f"MoeConfig accepted {bad}")
        except ValueError as e:
            assert words in str(e), str(e)
    try:
        MoeExchange(FakeHeap(0, world), tokens, 256, k, experts, dispatch_dtype=FP8, config=MoeConfig(row_block=64))
        raise AssertionError("fp8 dispatch accepted row_block = 64")
    except ValueError as e:
        assert "at least 128" in str(e), str(e)
    print("ok: fp8 dispatch refuses hidden = 200; dispatch refuses float ids and integer weights; heap_bytes exact; "
          "bad sms / path / config refused")


def capacity_error(world: int, tokens: int, hidden: int, k: int, experts: int) -> None:
    """A recv_x too small for expert 0's rows: CAPACITY_EXCEEDED names the expert and its rows."""
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


def deferred_receive_errors() -> None:
    """A low-latency dispatch with its receive deferred (`LowLatencyPath.send`): another dispatch
    or a combine before its receive hook, or the hook twice, raise RuntimeError and launch
    nothing; a receive whose peer never sent times out (TIMEOUT in the context and in every CTA's
    status) instead of reading its landing rows."""
    world, tokens, hidden, k, experts = 2, 6, 40, 2, 4
    heaps = sim_heaps(world, exchange_mod._heap_bytes(world, tokens, hidden, k, False, SimHeap.ALIGN,
                                                      path="low_latency"))
    ms = [MoeExchange(sh, tokens, hidden, k, experts, path="low_latency") for sh in heaps]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    ids = torch.rand(tokens, experts, generator=g).topk(k, dim=1).indices
    w = torch.softmax(torch.randn(tokens, k, generator=g), 1)
    ll = ms[0].low_latency
    lay, receive = ll.send(x, ids, w, tokens, False)  # rank 1 never sends
    calls = ll.dispatch_calls.clone()
    for what, call in (("dispatch", lambda: ll.dispatch(x, ids, w, tokens, False, phase=1)),
                       ("combine", lambda: ll.combine(torch.zeros(ms[0].capacity, hidden, dtype=torch.bfloat16), lay,
                                                      tokens, False, phase=1))):
        try:
            call()
            raise AssertionError(f"{what} ran before the receive hook")
        except RuntimeError as e:
            assert "receive hook has not been called" in str(e), str(e)
    assert torch.equal(ll.dispatch_calls, calls), "a refused call launched"
    receive(False)
    timeout = _abi.STATUS["TIMEOUT"]
    assert ll.sim_status[:ll.ctas].tolist() == [timeout] * ll.ctas, ll.sim_status[:ll.ctas].tolist()
    error = ll.sim_ctx.view(torch.int32)[_abi.CONTEXT_FIELDS["error"][0] // 4]
    assert int(error) == timeout, f"context error {int(error)}, not TIMEOUT"
    try:
        receive(False)
        raise AssertionError("the receive hook ran twice")
    except RuntimeError as e:
        assert "already called" in str(e), str(e)
    print("ok: deferred receive: dispatch / combine before the hook and a second hook refused; no sender: TIMEOUT")


def low_latency_errors(world: int, tokens: int, hidden: int, k: int, experts: int) -> None:
    """Low-latency path: out-of-range ids skipped and reported by the rank that sent them (combine
    as the relay path's); an expert chosen more than once by every token overflows its block of
    recv_x (world * max_tokens rows): CAPACITY_EXCEEDED names it, the rows past it dropped."""
    nbytes = exchange_mod._heap_bytes(world, tokens, hidden, k, False, SimHeap.ALIGN, path="low_latency")
    ms = [MoeExchange(sh, tokens, hidden, k, experts, path="low_latency") for sh in sim_heaps(world, nbytes)]
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(tokens, hidden, generator=g).to(torch.bfloat16) for _ in range(world)]
    ids = [torch.tensor([[0, 2, 4]] * tokens) for _ in range(world)]
    ids[1][3, 2], ids[1][5, 0] = experts, -1
    ws = [torch.full((tokens, k), 1 / k) for _ in range(world)]
    outs = low_latency_layer(ms, xs, ids, ws)[2]
    relay = [MoeExchange(FakeHeap(r, world), tokens, hidden, k, experts) for r in range(world)]
    want = layer(relay, xs, ids, ws)[2]
    for r in range(world):
        assert torch.equal(_bytes(outs[r]), _bytes(want[r])), f"low-latency path, rank {r}: combine differs from relay"
    try:
        ms[1].check()
        raise AssertionError("rank 1: no error for 2 out-of-range ids")
    except IronlinkError as e:
        assert "held 2 expert ids" in str(e), str(e)
    for m in ms:
        m.check()  # cleared; the others had none
    ids = [torch.zeros(tokens, k, dtype=torch.int64) for _ in range(world)]  # expert 0, k times a token
    low_latency_layer(ms, xs, ids, ws)
    try:
        ms[0].check()
        raise AssertionError("rank 0: no CAPACITY_EXCEEDED for expert 0")
    except IronlinkError as e:
        want_words = f"expert 0 received {world * tokens * k} rows but its block of recv_x holds {world * tokens}"
        assert "CAPACITY_EXCEEDED" in str(e) and want_words in str(e), str(e)
    for m in ms:
        m.check()
    print("ok: low-latency path: out-of-range ids reported by their rank, an expert past its block named")


def direct_errors(world: int, tokens: int, hidden: int, k: int, experts: int) -> None:
    """Direct path: out-of-range ids reported by the rank that sent them; the capacity error."""
    nbytes = exchange_mod._heap_bytes(world, tokens, hidden, k, False, SimHeap.ALIGN)
    ms = [MoeExchange(sh, tokens, hidden, k, experts, recv_capacity=4) for sh in sim_heaps(world, nbytes)]
    xs = [torch.ones(tokens, hidden, dtype=torch.bfloat16) for _ in range(world)]
    ids = [torch.tensor([[0, 2, 4]] * tokens) for _ in range(world)]
    ids[1][3, 2], ids[1][5, 0] = experts, -1
    ws = [torch.full((tokens, k), 1 / k) for _ in range(world)]
    _, _, outs = direct_layer(ms, xs, ids, ws)
    relay = [MoeExchange(FakeHeap(r, world), tokens, hidden, k, experts, recv_capacity=4) for r in range(world)]
    _, _, want = layer(relay, xs, ids, ws)
    for r in range(world):  # out-of-range ids skipped and rows past the capacity left out alike
        assert torch.equal(_bytes(outs[r]), _bytes(want[r])), f"direct path, rank {r}: combine differs from relay"
    for r, words in ((0, "expert 0 (26 rows)"), (1, "held 2 expert ids"), (1, "expert 2 (27 rows)"),
                     (2, "expert 4 (26 rows)")):
        try:
            ms[r].check()
            raise AssertionError(f"rank {r}: no error; wanted {words!r}")
        except IronlinkError as e:
            assert words in str(e), str(e)
    for m in ms:
        m.check()  # cleared
    print("ok: direct path: out-of-range ids reported by their rank, capacity error names expert 0 (26 rows)")


def direct_failed_barrier_moves_nothing() -> None:
    """Direct path: every CTA's barrier failing, as every CTA's does on a heap whose ranks
    allocated differently (HEAP_ASYMMETRIC), moves no row: recv_x stays as constructed (zeros),
    every expert count is 0, no rank's `back` is written, and the failure stays recorded. (The
    simulated barrier fails where the test wrote a failure into the status words.)"""
    world, tokens, hidden, k, experts = 2, 6, 36, 2, 4
    nbytes = exchange_mod._heap_bytes(world, tokens, hidden, k, False, SimHeap.ALIGN)
    ms = [MoeExchange(sh, tokens, hidden, k, experts, path="direct") for sh in sim_heaps(world, nbytes)]
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(tokens, hidden, generator=g).to(torch.bfloat16) for _ in range(world)]
    ids = [torch.rand(tokens, experts, generator=g).topk(k, dim=1).indices for _ in range(world)]
    ws = [torch.softmax(torch.randn(tokens, k, generator=g), 1) for _ in range(world)]
    code = _abi.STATUS["HEAP_ASYMMETRIC"]
    for m in ms:
        m.direct.back.fill_(7.0)
        m.direct.sim_status.fill_(code)
    recvs, counts, _ = direct_layer(ms, xs, ids, ws)
    for r, m in enumerate(ms):
        assert not recvs[r].any(), f"rank {r}: rows reached recv_x after a failed barrier"
        assert not counts[r].any(), f"rank {r}: expert counts {counts[r].tolist()} after a failed barrier"
        assert bool((m.direct.back == 7.0).all()), f"rank {r}: `back` written after a failed barrier"
        assert bool((m.direct.sim_status == code).all()), f"rank {r}: the failure was not kept"
    # A dispatch that went through, then a combine whose first barrier fails (a peer lost in
    # between): no rank stores into a peer's `back`.
    for m, x, i, w in zip(ms, xs, ids, ws):
        m.direct.sim_status.zero_()
        m._stage(x, i, w)
    for m in ms:
        m.direct.gather(False)
    lays = [m.direct.place(False) for m in ms]
    assert all(lay.counts.any() for lay in lays), "the dispatch moved no row"
    for m in ms:
        m.direct.back.fill_(7.0)
        m.direct.sim_status.fill_(_abi.STATUS["TIMEOUT"])
    for m, lay in zip(ms, lays):
        m.direct.push(_scaled_rows(m, lay.counts), lay, False)
    for r, m in enumerate(ms):
        assert bool((m.direct.back == 7.0).all()), f"rank {r}: `back` written after combine's failed barrier"
    print("ok: direct path: a failed barrier (HEAP_ASYMMETRIC on every CTA) moves no row; a combine whose "
          "barrier failed stores nothing into the peers")


def main() -> int:
    shape = (WORLD, TOKENS, HIDDEN, K, EXPERTS)
    refusals_and_choices(*shape)
    capacity_error(*shape)
    direct_errors(*shape)
    low_latency_errors(*shape)
    deferred_receive_errors()
    direct_failed_barrier_moves_nothing()
    print("done: every MoE refusal above ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
