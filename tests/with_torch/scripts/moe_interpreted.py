"""MoeExchange's routing, layout, kernels and capacity check on the CPU: `world` simulated ranks in
one process, Triton kernels in the interpreter (TRITON_INTERPRET=1, set by tests/with_torch/test_interpreted.py
before Triton is imported), the two all_to_all_v exchanges done in Python between the ranks'
buffers. Checks dispatch bit-exact against the routing and combine against a float64 reference; for
the fp8 dispatch, the rows and scales bit-exact against
`fp8_quantize_reference` (torch's own fp8 conversion), every bf16 value up to 448 quantized as
torch does, and the dequantized rows within fp8's rounding. The direct path (one-node heaps,
peer loads and stores through simulated arenas) and the low-latency path bitwise against the
relay path. What MoeExchange refuses, chooses and reports: moe_refusals_interpreted.py. Harness:
_moe_sim.py, beside this file. Exits non-zero with a message on the first mismatch."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import torch

from ironlink.runtime.errors import IronlinkError
from ironlink.moe import MoeExchange, fp8_dequantize, fp8_quantize_reference
from ironlink.moe import exchange as exchange_mod
from ironlink.runtime.tuning.moe import DEFAULT_MOE_CONFIG as DEFAULT
from ironlink.language._flags import EMPTY_BITS

from _moe_sim import (FakeHeap, SimHeap, _bytes, direct_layer, exchange, layer,  # tests/with_torch/scripts/, beside
                      low_latency_layer, pack, relays, sim_heaps)

FP8 = torch.float8_e4m3fn


def check_fp8(recv: Any, rows: Any, n: int, p: int) -> Any:
    """recv = (fp8 rows, scales) of rank p against `rows` (its n routed bf16 rows): bit-exact
    against the torch reference, dequantized within fp8's rounding; the dequantized rows."""
    q, scales = recv[0][:n], recv[1][:n]
    q_ref, s_ref = fp8_quantize_reference(rows)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), f"rank {p}: fp8 rows differ from the reference"
    assert torch.equal(scales, s_ref), f"rank {p}: fp8 scales differ from the reference"
    deq, x = fp8_dequantize(q, scales).double(), rows.double()
    # e4m3 keeps 3 mantissa bits: within 2^-4 of |x| (normal), or half a subnormal step (2^-10) of
    # the scaled value; 1e-6 for the rounding of the scale and its inverse.
    s = scales.double().repeat_interleave(128, 1)
    bad = (deq - x).abs() > x.abs() * (2 ** -4 + 1e-6) + s * 2 ** -10
    assert not bad.any(), f"rank {p}: {int(bad.sum())} dequantized values outside fp8's rounding"
    return deq


def fp8_every_value() -> None:
    """Every bf16 value of magnitude <= 448, both signs (zeros and subnormals included), through
    pack_rows_fp8: each 128-channel group holds 448 (scale 1: the value itself is rounded) and 127
    of them; the bytes must equal torch's float8_e4m3fn conversion, ties to even included."""
    hidden = 2048
    pos = torch.arange(0, 0x43E0 + 1, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)  # 0 .. 448
    values = torch.cat([pos, -pos])
    groups = -(-values.numel() // 127)
    tokens = -(-groups * 128 // hidden)
    g = torch.zeros(tokens * hidden // 128, 128, dtype=torch.bfloat16)
    g[:, 0] = 448
    g[:groups, 1:].reshape(-1)[:values.numel()] = values
    x = g.reshape(tokens, hidden)
    m = MoeExchange(FakeHeap(0, 1), tokens, hidden, 1, 1, dispatch_dtype=FP8)
    t, _ = pack(m, x, torch.zeros(tokens, 1, dtype=torch.int64), torch.ones(tokens, 1))
    send_buf = relays([m])[0].send_buf
    q = send_buf[:t].view(torch.uint8)[:, :hidden]
    scales = send_buf[:t].view(torch.float32)[:, m.scale_col // 2:m.scale_col // 2 + hidden // 128]
    q_ref, s_ref = fp8_quantize_reference(x)
    assert torch.equal(s_ref, torch.ones_like(s_ref)) and torch.equal(scales, s_ref), "scales of 448-max groups"
    diff = (q != q_ref.view(torch.uint8)).nonzero()
    assert diff.numel() == 0, (f"{diff.shape[0]} fp8 codes differ from torch's, first: x = {x[tuple(diff[0])].item()}: "
                               f"{q[tuple(diff[0])].item():#x} != {q_ref.view(torch.uint8)[tuple(diff[0])].item():#x}")
    print(f"ok: fp8: all {values.numel()} bf16 values with |x| <= 448 quantize as torch's float8_e4m3fn")


def reference_send_rows(ids: Any, world: int, le: int) -> Any:
    """[T, world]: each token's send row (rank-major, token order), -1 where it does not go; ids
    outside [0, world * le) go nowhere."""
    goes = torch.zeros(world, ids.shape[0], dtype=torch.int64)
    for t, row in enumerate(ids.tolist()):
        for e in row:
            if 0 <= e < world * le:
                goes[e // le, t] = 1
    flat = goes.view(-1)
    return torch.where(goes > 0, (torch.cumsum(flat, 0) - flat).view(world, -1), -1).t()


def sorts_match_reference() -> None:
    """The counting sorts against torch's stable argsort, over many blocks per program (a small
    one-hot block), top-5 with repeated experts in a token and out-of-range ids (skipped, counted,
    reported by check)."""
    world, tokens, hidden, k, experts = 3, 40, 16, 5, 12
    le = experts // world
    small = replace(DEFAULT, one_hot=64)  # 1 or 2 rows per block: every program walks several blocks
    ms = [MoeExchange(FakeHeap(r, world), tokens, hidden, k, experts, config=small) for r in range(world)]
    g = torch.Generator().manual_seed(11)
    xs = [torch.randn(tokens, hidden, generator=g).to(torch.bfloat16) for _ in range(world)]
    ids = [torch.randint(0, experts, (tokens, k), generator=g) for _ in range(world)]
    ids[1][3, 2], ids[1][7, 0], ids[2][0, 4] = experts, -1, 1000  # 3 out-of-range ids
    ws = [torch.rand(tokens, k, generator=g) for _ in range(world)]
    rs = relays(ms)
    packed = [pack(m, x, i, w) for m, x, i, w in zip(ms, xs, ids, ws)]
    for r, (rp, (_, send_row)) in enumerate(zip(rs, packed)):
        want = reference_send_rows(ids[r], world, le)
        assert torch.equal(send_row, want), f"rank {r}: send rows differ from the reference"
        assert torch.equal(rp.send_counts, (want >= 0).sum(0)), f"rank {r}: send counts"
    exchange([(p.send_buf, p.send_counts) for p in rs], [(p.recv_buf, p.recv_counts, p.recv_offsets) for p in rs])
    for r, (m, rp) in enumerate(zip(ms, rs)):
        counts, offsets, slot, weight, received = rp.place()[:5]
        n = int(received)
        raw = rp.recv_buf.view(torch.int32)[:n, m.meta_col // 2:m.meta_col // 2 + k].to(torch.int64)
        assert bool((((raw >= 0) & (raw < experts)) | (raw == -1)).all()), f"rank {r}: an out-of-range id travelled"
        got = raw - r * le
        local = (got >= 0) & (got < le)
        key = torch.where(local, got, le).reshape(-1)
        order = torch.argsort(key, stable=True)[:int(local.sum())]
        want_slot = torch.full((n * k,), -1, dtype=torch.int64)
        want_slot[order] = torch.arange(order.numel())
        assert torch.equal(slot[:n].reshape(-1), want_slot), f"rank {r}: slots differ from a stable argsort"
        assert torch.equal(counts, torch.bincount(key, minlength=le + 1)[:le]), f"rank {r}: expert counts"
        assert torch.equal(offsets, torch.cumsum(counts, 0) - counts), f"rank {r}: expert offsets"
        weights = rp.recv_buf.view(torch.float32)[:n, m.meta_col // 2 + k:m.meta_col // 2 + 2 * k]
        assert torch.equal(weight[:n], weights), f"rank {r}: weights"
        assert torch.equal(m.recv_x[:order.numel()], rp.recv_buf[order // k, :hidden]), f"rank {r}: recv_x rows"
    for r, bad in ((0, 0), (1, 2), (2, 1)):
        try:
            ms[r].check()
            assert bad == 0, f"rank {r}: no error for {bad} out-of-range ids"
        except IronlinkError as e:
            assert f"held {bad} expert ids outside [0, {experts})" in str(e) and "INVALID_ARGUMENT" in str(e), str(e)
    print("ok: counting sorts match a stable argsort (top-5, repeated experts, 3 out-of-range ids reported)")


def same_on_direct_path(world: int, tokens: int, h: int, k: int, experts: int, fp8: bool, xs: list[Any],
                        ids: list[Any], ws: list[Any], relay: tuple[list[Any], ...]) -> None:
    """The direct path (simulated one-node heaps, peer loads and stores through the arenas) gives
    the relay path's recv_x (and scales), expert counts and combined rows bit for bit, three times:
    x staged, and x in the heap (runs 0 and 2: bf16 rows pulled in place, `rows_in_place`).
    Each rank has allocated a tensor of another size first: the exchange's buffers, which peers
    reach at this rank's offsets, must not follow the ranks' own tensors (`heap.empty(at_top=True)`)."""
    nbytes = exchange_mod._heap_bytes(world, tokens, h, k, fp8, SimHeap.ALIGN)
    heaps = sim_heaps(world, nbytes + tokens * h * 2 + (world + 1) * SimHeap.ALIGN)
    own = [sh.empty((1 + r * SimHeap.ALIGN,), torch.uint8) for r, sh in enumerate(heaps)]  # r + 1 units
    ms = [MoeExchange(sh, tokens, h, k, experts, dispatch_dtype=FP8 if fp8 else None, path="direct")
          for sh in heaps]
    assert all(sh.allocated - sh.ALIGN * (r + 1) == nbytes for r, sh in enumerate(heaps)), \
        "heap_bytes (direct) != the bytes allocated"
    del own
    assert all(m.ctas == m.direct.grid() == 2 for m in ms), [m.ctas for m in ms]  # simulated: 2 CTAs, one per "SM"
    in_heap = [sh.empty(tuple(x.shape), x.dtype).copy_(x) for sh, x in zip(heaps, xs)]
    for m, x in zip(ms, in_heap):  # in place: bf16 rows of whole 16-byte units (hidden 36 is staged)
        assert (m.direct.rows_in_place(x) is not None) == (not fp8 and x.shape[0] > 0 and h * 2 % 16 == 0), h
    for run, rows in enumerate((2, 1, 4)):  # pull_rows: two rows in flight per program, then one, then four
        for m in ms:
            m.direct.rows_in_flight = rows
            # From the second run, rows in several chunks (masked at the end).
            m.direct.config = replace(DEFAULT, pull_block=16, push_block=16) if run else DEFAULT
        recvs, counts, outs = direct_layer(ms, xs if run == 1 else in_heap, ids, ws)
        for p in range(world):
            want = relay[0][p] if fp8 else (relay[0][p],)
            got = recvs[p] if fp8 else (recvs[p],)
            for a, b in zip(got, want):
                assert torch.equal(_bytes(a), _bytes(b)), f"direct path, rank {p}, run {run}: recv_x differs from relay"
            assert torch.equal(counts[p], relay[1][p]), f"direct path, rank {p}: expert counts differ from relay"
            assert torch.equal(_bytes(outs[p]), _bytes(relay[2][p])), f"direct path, rank {p}, run {run}: combine differs"
        for m in ms:
            m.check()


def same_on_low_latency_path(world: int, tokens: int, h: int, k: int, experts: int, xs: list[Any], ids: list[Any],
                             ws: list[Any], relay: tuple[list[Any], ...], fp8: bool = False) -> None:
    """The low-latency path (simulated one-node heaps, peer stores through the arenas): each
    received token's row in its expert's block of recv_x at the row its slot names (fp8: its
    bytes and scales those of `fp8_quantize_reference`), the blocks filled from their first row,
    the relay path's expert counts and combined rows bit for bit; four layers in a row (each of
    the COPIES of its buffers, the first twice), the second with its receive deferred; after each,
    every copy but the one that call used is empty wherever a peer writes. Each rank has allocated
    a tensor of another size first, as on the direct path."""
    nbytes = exchange_mod._heap_bytes(world, tokens, h, k, fp8, SimHeap.ALIGN, path="low_latency")
    heaps = sim_heaps(world, nbytes + world * SimHeap.ALIGN)
    for r, sh in enumerate(heaps):
        sh.empty((1 + r * SimHeap.ALIGN,), torch.uint8)  # r + 1 units, kept
    ms = [MoeExchange(sh, tokens, h, k, experts, path="low_latency", dispatch_dtype=FP8 if fp8 else None)
          for sh in heaps]
    assert all(sh.allocated - sh.ALIGN * (r + 1) == nbytes for r, sh in enumerate(heaps)), \
        "heap_bytes (low_latency) != the bytes allocated"
    le, block = experts // world, world * tokens
    assert all(m.capacity == le * block for m in ms)
    for run in range(4):
        recvs, counts, outs, lays = low_latency_layer(ms, xs, ids, ws, deferred=run == 1)
        for p, m in enumerate(ms):
            others_empty(m, p, world, run % 3, f"run {run}")
        for p, m in enumerate(ms):
            assert torch.equal(counts[p], relay[1][p]), f"low-latency path, rank {p}, run {run}: expert counts differ"
            assert torch.equal(lays[p].offsets, torch.arange(le) * block), f"rank {p}: expert offsets"
            assert int(lays[p].received) == sum(x.shape[0] for x in xs), f"rank {p}: tokens received"
            taken = []
            for q in range(world):
                for t in range(xs[q].shape[0]):
                    for j in range(k):
                        e, s = int(ids[q][t, j]), int(lays[p].slot[q * tokens + t, j])
                        if p * le <= e < (p + 1) * le:
                            assert (s - (e - p * le) * block) in range(int(counts[p][e - p * le])), (p, q, t, j, s)
                            if fp8:
                                q_ref, s_ref = fp8_quantize_reference(xs[q][t:t + 1])
                                assert torch.equal(recvs[p][0][s].view(torch.uint8), q_ref[0].view(torch.uint8)), \
                                    f"rank {p}: fp8 recv_x row {s} is not token {t} of {q} quantized"
                                assert torch.equal(recvs[p][1][s], s_ref[0]), f"rank {p}: fp8 scales of row {s}"
                            else:
                                assert torch.equal(recvs[p][s], xs[q][t]), \
                                    f"rank {p}: recv_x row {s} is not token {t} of {q}"
                            taken.append(s)
                        else:
                            assert s == -1, f"rank {p}: slot {s} for another rank's expert"
            assert len(set(taken)) == len(taken) == int(counts[p].sum()), f"rank {p}: rows taken twice or left out"
            assert torch.equal(_bytes(outs[p]), _bytes(relay[2][p])), f"low-latency path, rank {p}, run {run}: combine"
        for m in ms:
            m.check()


def others_empty(m: MoeExchange, rank: int, world: int, used: int, what: str) -> None:
    """Every copy of `m`'s low-latency buffers but `used` holds "empty" wherever a peer writes:
    what a call read is emptied in the next, so nothing is left for a later call."""
    ll = m.low_latency
    assert ll is not None
    payload = ll.landing.view(torch.int8)[..., :m.hidden] if m.fp8 else ll.landing.view(torch.int16)[..., :m.hidden]
    empty_payload = EMPTY_BITS[8] if m.fp8 else EMPTY_BITS[16]
    for c in range(ll.landing.shape[0]):
        if c == used:
            continue
        for q in range(world):
            if q == rank:  # a CTA's rows for itself are stored and read at its own address, never polled
                continue
            where = f"{what}, rank {rank}, copy {c}, from rank {q}"
            assert bool((payload[c, q] == empty_payload).all()), f"{where}: landing rows left"
            assert bool((ll.landing.view(torch.int32)[c, q, :, m.meta_col // 2:] == EMPTY_BITS[32]).all()), \
                f"{where}: ids, weights or scales left"
            assert bool((ll.back.view(torch.int16)[c, q] == EMPTY_BITS[16]).all()), f"{where}: combine rows left"
            for name, words in (("dispatch", ll.counts), ("combine", ll.back_counts)):
                low = words[c, q].view(torch.int32).view(-1, 2)[:, 0]
                assert bool((low == EMPTY_BITS[32]).all()), f"{where}: {name} count words left"


def top8_world2() -> None:
    """World 2, top-8 of 16 experts (4 choices of a token on a rank, on average): the direct path
    against the relay path, bit for bit."""
    world, tokens, hidden, k, experts = 2, 12, 72, 8, 16
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(tokens - 3 * r, hidden, generator=g).to(torch.bfloat16) for r in range(world)]
    ids = [torch.rand(x.shape[0], experts, generator=g).topk(k, dim=1).indices for x in xs]
    ws = [torch.softmax(torch.randn(x.shape[0], k, generator=g), 1) for x in xs]
    for _ in range(2):
        ms = [MoeExchange(FakeHeap(r, world), tokens, hidden, k, experts) for r in range(world)]  # recv_x zeros
        relay = layer(ms, xs, ids, ws)
        same_on_direct_path(world, tokens, hidden, k, experts, False, xs, ids, ws, relay)
        same_on_low_latency_path(world, tokens, hidden, k, experts, xs, ids, ws, relay)
        xs[1], ids[1], ws[1] = xs[1][:0], ids[1][:0], ws[1][:0]  # a rank without tokens still takes part
    print("ok: direct and low-latency paths = relay path at world 2, top-8 of 16, and with a rank of no tokens")


def main() -> int:
    world, tokens, hidden, k, experts = 3, 9, 36, 3, 6  # hidden not a multiple of 8: padded rows
    le = experts // world
    for fp8, skewed in ((False, False), (False, True), (True, False), (True, True)):
        h = 256 if fp8 else hidden  # fp8: a multiple of 128 (two scale groups)
        g = torch.Generator().manual_seed(5 + skewed)
        ms = [MoeExchange(FakeHeap(r, world), tokens, h, k, experts, dispatch_dtype=FP8 if fp8 else None)
              for r in range(world)]
        xs = [torch.randn(tokens - r, h, generator=g).to(torch.bfloat16) for r in range(world)]
        if fp8:  # groups of very different magnitude, an all-zero group and tiny values (fp8 subnormals)
            for r, x in enumerate(xs):
                x[:, :128] *= 1000.0
                x[0, 128:] = 0
                x[1, 128:] *= 1e-3
                x[2 % x.shape[0], 130] = 1e-9
                x[2 % x.shape[0], 131] = -1e-9  # fp8 -0.0 (0x80): the low-latency path carries it as it is
        scores = [torch.rand(x.shape[0], experts, generator=g) for x in xs]
        if skewed:
            for s in scores:
                s[:, 0] += 10
        ids = [s.topk(k, dim=1).indices for s in scores]
        ws = [torch.softmax(torch.randn(x.shape[0], k, generator=g), 1) for x in xs]
        if skewed:  # the pack kernels read any integer ids and any float weights
            ids, ws = [i.to(torch.int32) for i in ids], [w.to(torch.bfloat16) for w in ws]
        recvs, counts, outs = layer(ms, xs, ids, ws)
        for p in range(world):
            want = [xs[q][(ids[q] == e).any(1)] for e in range(p * le, (p + 1) * le) for q in range(world)]
            rows = torch.cat(want)
            n = rows.shape[0]
            assert int(counts[p].sum()) == n, f"rank {p}: expert counts {counts[p].tolist()} for {n} rows"
            if fp8:
                check_fp8(recvs[p], rows, n, p)
            else:
                assert torch.equal(recvs[p][:n], rows), f"rank {p}: dispatched rows differ from the routing"
            # The experts saw the dequantized rows: the reference starts from those.
            x = fp8_dequantize(*fp8_quantize_reference(xs[p])) if fp8 else xs[p]
            ref = (x.double()[:, None, :] * (ids[p].double() + 1)[..., None] * ws[p].double()[..., None]).sum(1)
            err = ((outs[p].double() - ref).abs().max() / ref.abs().max()).item()
            assert err < 2e-2, f"rank {p}: combine rel error {err:.3e}"
        again = layer(ms, xs, ids, ws)[2]
        assert all(torch.equal(a, b) for a, b in zip(again, outs)), "combine differs run to run"
        same_on_direct_path(world, tokens, h, k, experts, fp8, xs, ids, ws, (recvs, counts, outs))
        same_on_low_latency_path(world, tokens, h, k, experts, xs, ids, ws, (recvs, counts, outs), fp8)
        print(f"ok: {'fp8 ' if fp8 else ''}{'skewed' if skewed else 'uniform'}: world {world}, rows per rank "
              f"{[int(c.sum()) for c in counts]}")
    fp8_every_value()
    sorts_match_reference()
    top8_world2()
    print("done: every MoE check above ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
