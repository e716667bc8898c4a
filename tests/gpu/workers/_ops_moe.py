"""The ops suite's exchange cases (`tests/gpu/workers/ops_worker.py` runs them): all_to_all_v
against dist.all_to_all_single, and MoeExchange on every path against the rows every rank routes
and a float64 reference."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

import ironlink

from _cases import (expert_rows, expert_scales, heap_timeout_s, moe_routing,  # the script's own directory
                    moe_scaled_layer)

from _ops_suite import Suite


def counts_matrix(world: int, seed: int, most: int) -> Any:
    """[world, world] int64 rows rank q sends rank p: the same on every rank (a shared seed)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, most + 1, (world, world), generator=g)


def all_to_all_v_case(s: Suite, row: int, dtype: Any, seeds: tuple[int, ...], graph: bool, out_rows: int = 0) -> None:
    """ironlink.all_to_all_v against dist.all_to_all_single with host splits (bit-exact), receive
    counts and offsets exact; with `graph`, one capture replayed with every seed's counts (written
    into send_counts between replays); `out_rows` too small: CAPACITY_EXCEEDED raised."""
    world, me, heap = s.world, dist.get_rank(), s.heap
    most = 40
    in_rows = world * most
    cap = out_rows or world * most
    inp = heap.empty((in_rows, row), dtype)
    out = heap.empty((cap, row), dtype)
    send = heap.empty((world,), torch.int64)
    rc, ro = heap.empty((world,), torch.int64), heap.empty((world,), torch.int64)
    try:
        run = lambda: ironlink.all_to_all_v(inp, send, out, rc, ro, heap=heap)  # noqa: E731
        g = None
        for i, seed in enumerate(seeds):
            m = counts_matrix(world, seed, most)
            send.copy_(m[me])
            inp.copy_(torch.randn(in_rows, row, device="cuda").to(dtype))
            out.fill_(float("nan"))
            if graph and g is None:
                run()
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    run()
                out.fill_(float("nan"))
            if out_rows:
                run()
                torch.cuda.synchronize()
                try:
                    heap.check()
                    raise AssertionError("no CAPACITY_EXCEEDED for an output too small")
                except ironlink.IronlinkError as e:
                    assert "CAPACITY_EXCEEDED" in str(e), str(e)
                assert rc.tolist() == m[:, me].tolist(), "receive counts not written on a capacity error"
                return
            g.replay() if graph else run()
            torch.cuda.synchronize()
            heap.check()
            recv = m[:, me]
            total = int(recv.sum())
            want = torch.empty(total, row, device="cuda", dtype=dtype)
            sent = int(m[me].sum())
            dist.all_to_all_single(want, inp[:sent].contiguous(), recv.tolist(), m[me].tolist())
            assert rc.tolist() == recv.tolist(), f"receive counts {rc.tolist()} != {recv.tolist()}"
            assert ro.tolist() == (torch.cumsum(recv, 0) - recv).tolist(), "receive offsets"
            assert torch.equal(out[:total], want), f"rows differ from all_to_all_single (seed {seed}, step {i})"
    finally:
        for t in (ro, rc, send, out, inp):
            heap.free(t)


FP8_CHECK_ROWS = 16384  # rows per block of the fp8 reference check


def moe_case(s: Suite, tokens: int, skewed: bool, graph: bool, capacity: int = 0, fp8: bool = False,
             shape: tuple[int, int, int] = (256, 4, 0), heap: Any = None, seeds: tuple[int, ...] = (1, 2, 3),
             sms: Optional[int] = None, path: Optional[str] = None, deferred: bool = False,
             x_in_heap: bool = False) -> None:
    """ironlink.MoeExchange: dispatch against the rows every rank routes here (all_gather of x and
    topk_idx, bit-exact, grouped by local expert), combine of y = recv_x * (global expert + 1)
    against a float64 reference; with `graph`, one capture replayed with new routing; with
    `capacity`, a too-small receive buffer gives CAPACITY_EXCEEDED. With `fp8`, the fp8 dispatch:
    its rows and scales bit-exact against `fp8_quantize_reference` of the routed rows, y and the
    reference made from the dequantized rows. `shape`: (hidden, top-k, experts; 0: max(2 * world, 8)),
    on `heap` (default: the suite's); `sms`: the MoeExchange's SM budget; `path` its path (the
    low-latency path's rows within an expert compared in any order). `deferred`: dispatch with
    return_recv_hook=True, and between the send and the hook a kernel of the peers' that signals
    and waits on tiles (the deferred receive polls its rows as they land, whatever runs between).
    `x_in_heap`: x a heap tensor (the direct path pulls its rows in place)."""
    from _fusion_kernels import meet_on_tiles  # tests/gpu/workers/, beside this file
    from ironlink.moe import fp8_dequantize, fp8_quantize_reference
    from ironlink.language._abi import MAX_CTAS, MAX_TILES

    world, me, heap = s.world, dist.get_rank(), heap or s.heap
    hidden, k, experts = shape[0], shape[1], shape[2] or max(2 * world, 8)
    le = experts // world
    moe = ironlink.MoeExchange(heap, tokens, hidden, k, experts, recv_capacity=capacity or None,
                               dispatch_dtype=torch.float8_e4m3fn if fp8 else None, sms=sms, path=path)
    assert path is None or moe.path == path
    x = heap.empty((tokens, hidden), torch.bfloat16) if x_in_heap else torch.empty(tokens, hidden, device="cuda",
                                                                                  dtype=torch.bfloat16)
    if x_in_heap and moe.direct is not None and not fp8:
        assert moe.direct.rows_in_place(x) is not None, "x in the heap, yet its rows would be staged"
    idx = torch.empty(tokens, k, device="cuda", dtype=torch.int64)
    wts = torch.empty(tokens, k, device="cuda", dtype=torch.float32)
    scale = torch.empty(moe.capacity, 1, device="cuda", dtype=torch.bfloat16)

    def route(seed: int) -> None:
        g = torch.Generator(device="cuda").manual_seed(seed * 100 + me)
        for static, drawn in zip((x, idx, wts), moe_routing(g, tokens, hidden, experts, k, skewed)):
            static.copy_(drawn)

    tile_status = torch.zeros(moe.sms, device="cuda", dtype=torch.int32)

    def layer() -> Any:
        if deferred:
            recv_x, counts, offsets, handle, hook = moe.dispatch(x, idx, wts, check=not graph and not capacity,
                                                                 return_recv_hook=True)
            assert moe.low_latency is not None
            grid = moe.low_latency.ctas
            meet_on_tiles[(grid,)](heap.ctx, MAX_TILES - MAX_CTAS, tile_status)
            hook()
        else:
            recv_x, counts, offsets, handle = moe.dispatch(x, idx, wts, check=not graph and not capacity)
        scale.copy_(expert_scales(moe, counts))  # expert e of this rank scales its rows by (global id + 1)
        rows = fp8_dequantize(*recv_x, torch.bfloat16) if fp8 else recv_x
        out = moe.combine(rows * scale, handle, check=not graph)
        return recv_x, counts, offsets, out

    try:
        if capacity:
            route(1)
            ids = [torch.empty_like(idx) for _ in range(world)]
            dist.all_gather(ids, idx)
            here = [sum(int(((i == e).any(1)).sum()) for i in ids) for e in range(me * le, (me + 1) * le)]
            try:
                moe.dispatch(x, idx, wts, check=True)
                assert sum(here) <= capacity, f"no CAPACITY_EXCEEDED for {sum(here)} rows into {capacity}"
            except ironlink.IronlinkError as e:
                crossing = next(e for e in range(le) if sum(here[:e + 1]) > capacity)
                assert sum(here) > capacity, f"CAPACITY_EXCEEDED for {sum(here)} rows into {capacity}: {e}"
                assert "CAPACITY_EXCEEDED" in str(e), str(e)
                assert f"expert {me * le + crossing} ({here[crossing]} rows)" in str(e), str(e)
            moe.check()  # the error was cleared
            return
        g = None
        for seed in seeds:
            route(seed)
            if graph and g is None:
                layer()
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    captured = layer()
                route(seed)
            if graph:
                g.replay()
                recv_x, counts, offsets, out = captured
            else:
                recv_x, counts, offsets, out = layer()
            torch.cuda.synchronize()
            moe.check()
            xs = [torch.empty_like(x) for _ in range(world)]
            ids = [torch.empty_like(idx) for _ in range(world)]
            dist.all_gather(xs, x)
            dist.all_gather(ids, idx)
            want = []
            for e in range(me * le, (me + 1) * le):
                for q in range(world):
                    flat = ids[q].reshape(-1)
                    want.append(xs[q][(flat == e).nonzero()[:, 0] // k])
            want_rows = torch.cat(want)
            n = want_rows.shape[0]
            assert counts.sum().item() == n, f"{counts.tolist()} rows for {n} routed here"
            if moe.path == "low_latency":  # expert blocks, rows in arrival order
                packed = torch.cumsum(counts, 0) - counts
                got_rows, ref_rows = recv_x, want_rows
                if fp8:  # each row's bytes and scales as one row of 2-byte words
                    q_ref, s_ref = fp8_quantize_reference(want_rows)
                    got_rows = torch.cat([recv_x[0].view(torch.int16), recv_x[1].view(torch.int16)], 1)
                    ref_rows = torch.cat([q_ref.view(torch.int16), s_ref.view(torch.int16)], 1)
                for e, (a, b) in enumerate(zip(expert_rows(got_rows, counts, offsets),
                                               expert_rows(ref_rows, counts, packed))):
                    assert torch.equal(a, b), f"expert {me * le + e}: dispatched rows differ from the routing"
            if fp8 and moe.path != "low_latency":
                # Row by row (in blocks: the fp32 temporaries of every routed row at hidden 8192
                # took 16 GiB at world 4); each row's quantization is its own.
                for lo in range(0, n, FP8_CHECK_ROWS):
                    hi = min(n, lo + FP8_CHECK_ROWS)
                    q_ref, s_ref = fp8_quantize_reference(want_rows[lo:hi])
                    assert torch.equal(recv_x[0][lo:hi].view(torch.uint8), q_ref.view(torch.uint8)), \
                        f"fp8 rows {lo}..{hi} differ"
                    assert torch.equal(recv_x[1][lo:hi], s_ref), f"fp8 scales of rows {lo}..{hi} differ from the reference"
            elif moe.path != "low_latency":
                assert torch.equal(recv_x[:n], want_rows), "dispatched rows differ from the routing"
            xr = fp8_dequantize(*fp8_quantize_reference(x)) if fp8 else x  # what the experts saw
            ref = torch.zeros(tokens, hidden, dtype=torch.float64, device="cuda")  # one choice at a time: [T, H]
            for j in range(k):
                ref += xr.double() * ((idx[:, j].double() + 1) * wts[:, j].double())[:, None]
            s.close("combine", out, ref, torch.bfloat16)
            again = layer()[3] if not graph else out
            assert torch.equal(again, out), "combine differs run to run"
            torch.cuda.synchronize()
            assert not tile_status.any(), f"the kernel on the dispatch's tiles: statuses {tile_status.tolist()}"
    finally:
        moe.close()
        if x_in_heap:
            heap.free(x)


def moe_paths_case(s: Suite, tokens: int, skewed: bool, fp8: bool) -> None:
    """The direct path (peer loads and stores; every SM, and an 8-SM budget) gives the relay
    path's (two all_to_all_v) recv_x (and fp8 scales), expert counts, offsets and combined rows
    bit for bit, on the same routing (top-8, so a token takes several rows on one rank); the
    low-latency path (not fp8) its counts, each expert's rows (in any order: by expert block) and
    combined rows."""
    world, me = s.world, dist.get_rank()
    hidden, k, experts = 512, 8, max(4 * world, 16)
    x, idx, wts = moe_routing(torch.Generator(device="cuda").manual_seed(41 + me), tokens, hidden, experts, k, skewed)
    results = []
    for path, sms in (("relay", None), ("direct", None), ("direct", 8)):
        moe = ironlink.MoeExchange(s.heap, tokens, hidden, k, experts, path=path, sms=sms,
                                   dispatch_dtype=torch.float8_e4m3fn if fp8 else None)
        try:
            assert moe.path == path
            results.append(moe_scaled_layer(moe, x, idx, wts))
        finally:
            moe.close()
    for name, res in zip(("direct", "direct on 8 SMs"), results[1:]):
        for i, (a, b) in enumerate(zip(res, results[0])):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{name}: output {i} differs from the relay path's"
    moe = ironlink.MoeExchange(s.heap, tokens, hidden, k, experts, path="low_latency",
                               dispatch_dtype=torch.float8_e4m3fn if fp8 else None)
    try:
        low_latency = moe_scaled_layer(moe, x, idx, wts)
    finally:
        moe.close()
    # The low-latency path fills an expert's block in arrival order: compare each expert's rows
    # as sets (an fp8 row with its scale, dequantized: the scale travels with the row).
    (recv, counts, offsets, out), (relay_recv, relay_counts, relay_offsets, relay_out) = (
        moe_received_rows(res) for res in (low_latency, results[0]))
    assert torch.equal(counts, relay_counts), "low_latency: expert counts differ from the relay path's"
    for e, (a, b) in enumerate(zip(expert_rows(recv, counts, offsets),
                                   expert_rows(relay_recv, relay_counts, relay_offsets))):
        assert torch.equal(a, b), f"low_latency: expert {e}'s rows differ from the relay path's"
    assert torch.equal(out.view(torch.uint8), relay_out.view(torch.uint8)), "low_latency: combine differs from relay"


def moe_received_rows(result: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(recv_x rows, counts, offsets, combine's output) of a `moe_scaled_layer` result; an fp8
    dispatch's rows dequantized with their scales (bf16)."""
    if len(result) == 5:
        from ironlink.moe import fp8_dequantize

        return (fp8_dequantize(result[0], result[1], torch.bfloat16), *result[2:])
    return tuple(result)


# The largest shape MoeExchange promises: tokens per rank, hidden, top-k (of 256 experts).
LIMITS = (16384, 8192, 8)


def moe_limits_case(s: Suite, fp8: bool) -> None:
    """moe_case at LIMITS, one expert taking every first choice, on a heap of exactly
    `MoeExchange.heap_bytes` (which this also checks)."""
    tokens, hidden, k = LIMITS
    experts = 256 // s.world * s.world
    nbytes = ironlink.MoeExchange.heap_bytes(s.world, tokens, hidden, k, fp8=fp8)
    heap = ironlink.SymmetricHeap(nbytes, timeout_s=heap_timeout_s())
    try:
        moe_case(s, tokens, True, graph=False, fp8=fp8, shape=(hidden, k, experts), heap=heap, seeds=(1,))
        heap.check()
    finally:
        heap.close()
        torch.cuda.empty_cache()


def limits_case_bytes(world: int, fp8: bool) -> int:
    """About what moe_limits_case holds on one rank at its peak: the heap, the received rows
    (world x tokens x top-k at most) twice (recv_x and the scaled rows the combine takes), x, the
    gathered xs, the output and the float64 reference (8 x tokens x hidden bf16s), and with fp8 16
    GiB of dequantization temporaries. Anchored on two runs where ranks shared one H200: world 8
    without fp8 (20.8 GiB a rank, then 16 more asked for) and world 4 with fp8 (31 GiB a rank,
    then out of memory) ran out; world 4 without fp8 fit."""
    tokens, hidden, k = LIMITS
    rows = 2 * world * tokens * k * hidden * 2
    inputs = (world + 8) * tokens * hidden * 2
    return ironlink.MoeExchange.heap_bytes(world, tokens, hidden, k, fp8=fp8) + rows + inputs + (16 << 30) * fp8


def moe_bad_ids_case(s: Suite) -> None:
    """Out-of-range expert ids (rank 0: one past the last expert and a negative one) are not sent,
    `check()` raises INVALID_ARGUMENT with their number on rank 0 only, and the other choices
    arrive: every rank's expert counts are those of the valid ids."""
    world, me, heap = s.world, dist.get_rank(), s.heap
    tokens, hidden, k, experts = 48, 256, 4, max(2 * world, 8)
    le = experts // world
    moe = ironlink.MoeExchange(heap, tokens, hidden, k, experts)
    try:
        g = torch.Generator(device="cuda").manual_seed(77 + me)
        x = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16)
        idx = torch.rand(tokens, experts, device="cuda", generator=g).topk(k, dim=1).indices
        if me == 0:
            idx[0, 0], idx[5, 3] = experts, -3
        wts = torch.full((tokens, k), 1.0 / k, device="cuda")
        _, counts, _, _ = moe.dispatch(x, idx, wts)
        torch.cuda.synchronize()
        ids = [torch.empty_like(idx) for _ in range(world)]
        dist.all_gather(ids, idx)
        want = [sum(int((i == e).sum()) for i in ids) for e in range(me * le, (me + 1) * le)]
        assert counts.tolist() == want, f"expert counts {counts.tolist()} != {want} (valid ids only)"
        try:
            moe.check()
            assert me != 0, "no INVALID_ARGUMENT for 2 out-of-range expert ids"
        except ironlink.IronlinkError as e:
            assert me == 0 and "INVALID_ARGUMENT" in str(e) and f"held 2 expert ids outside [0, {experts})" in str(e), \
                str(e)
        moe.check()  # cleared
    finally:
        moe.close()
