"""GPU suite of the host-level ops (ironlink.all_reduce / all_gather / reduce_scatter /
all_to_all_v and MoeExchange).

    torchrun --standalone --nproc_per_node=8 tests/gpu/workers/ops_worker.py    # tests/gpu/run.sh ops

One process per GPU. Each case fills heap tensors with fresh random data, runs the ironlink call
and the same collective through torch.distributed (NCCL), and compares: all_gather bitwise (a
copy), reductions against NCCL run on the inputs upcast to fp32 (NCCL reduces bf16 in bf16 step by
step, ironlink in fp32 with one rounding, so their bf16 outputs may differ by an ulp). bf16 and
fp32, messages of 1 KiB to 64 MiB plus an odd element count, in-place variants, the lamport and
hierarchical all-reduce paths, tensors outside the heap, all three calls captured in one CUDA graph
and replayed with new data. all_to_all_v bit-exact against dist.all_to_all_single (rows of any
width, in a CUDA graph with counts changed between replays, over capacity). MoeExchange's dispatch
bit-exact and combine against a float64 reference on every path (relay, direct, low-latency, the
receive deferred), fp8 dispatch, CUDA graphs, an SM budget, over capacity, out-of-range expert ids
and the largest promised shape. Then the argument errors. Rank 0 prints
"== ops world N: X passed, Y failed =="; the exit status is non-zero on failure. Without torch,
CUDA or torchrun it prints why it skipped and exits 0.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

import ironlink  # torch-free: importable where the suite then skips
from ironlink.runtime.distributed import ranks_per_gpu

try:
    import torch
    import torch.distributed as dist
    from _cases import (SMALL, Cases, expert_rows, expert_scales, heap_timeout_s,  # tests/gpu/workers/, the script's own directory
                        lamport_slots_empty, moe_routing, moe_scaled_layer, peers_still_in, renewed, same_on_all_ranks,
                        small)
except ImportError:  # the CPU machines have no torch
    torch = None  # type: ignore[assignment]
    Cases = object  # type: ignore[assignment,misc]

MESSAGE_BYTES = [1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26]  # 1 KiB .. 64 MiB
ODD_ELEMENTS = 1003  # not a multiple of 16 bytes, of the world size or of a CTA's share


def skip_reason() -> str | None:
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return "not under torchrun (RANK/WORLD_SIZE unset)"
    return None


class Suite(Cases):
    def __init__(self, heap: Any) -> None:
        super().__init__(renew=self.renew_heap)
        self.heap = heap
        self.world = dist.get_world_size()
        # Max error relative to the largest magnitude: ironlink rounds once from fp32 (bf16: half an
        # ulp), the fp32 reference differs from ironlink's fp32 sum only in summation order.
        self.tol = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}

    def renew_heap(self) -> None:
        """A new heap of the same size after a case that raised IronlinkError (collective): a
        timeout leaves the old one's counters disagreeing (docs/device-api.md)."""
        self.heap = renewed(self.heap)

    # --- helpers -----------------------------------------------------------------------------

    def alloc(self, n: int, dtype: Any) -> Any:
        return self.heap.empty((n,), dtype)

    def free(self, *ts: Any) -> None:
        # Allocation order must stay the same on every rank even after a failed case, so every
        # case frees in `finally`, newest first.
        for t in ts:
            if t is not None:
                self.heap.free(t)

    @staticmethod
    def data(n: int, dtype: Any) -> Any:
        return (torch.randn(n, device="cuda") * 2).to(dtype)

    def close(self, what: str, got: Any, want: Any, dtype: Any) -> None:
        g, w = got.double(), want.double()
        assert not torch.isnan(g).any(), f"{what}: NaN in the output (an element was not written)"
        scale = w.abs().max().clamp_min(1e-30)
        err = ((g - w).abs().max() / scale).item()
        assert err <= self.tol[dtype], f"{what}: max rel error {err:.3e} > {self.tol[dtype]}"

    @staticmethod
    def nccl_op(op: str) -> Any:
        return {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
                "prod": dist.ReduceOp.PRODUCT, "avg": dist.ReduceOp.AVG}[op]

    def ref_all_reduce(self, x: Any, op: str) -> Any:
        peers_still_in()  # NCCL's reference: not with a peer that failed the case already
        r = x.float().clone()
        dist.all_reduce(r, op=self.nccl_op(op))
        return r

    def ref_reduce_scatter(self, full: Any, n: int, op: str) -> Any:
        peers_still_in()  # NCCL's reference: not with a peer that failed the case already
        r = torch.empty(n, dtype=torch.float32, device="cuda")
        dist.reduce_scatter_tensor(r, full.float().contiguous(), op=self.nccl_op(op))
        return r

    def ref_all_gather(self, x: Any) -> Any:
        peers_still_in()  # NCCL's reference: not with a peer that failed the case already
        r = torch.empty(self.world * x.numel(), dtype=x.dtype, device="cuda")
        dist.all_gather_into_tensor(r, x.contiguous())
        return r

    # --- cases -------------------------------------------------------------------------------
    def all_reduce(self, n: int, dtype: Any, op: str) -> None:
        buf = None
        try:
            buf = self.alloc(n, dtype)
            x = self.data(n, dtype)
            buf.copy_(x)
            want = self.ref_all_reduce(x, op)
            # heap= given: under --only this may be the suite's first call (CPU tests check that
            # later calls find the heap alone).
            ironlink.all_reduce(buf, op=op, heap=self.heap, check=True)
            torch.cuda.synchronize()
            if op == "max":  # exact in any dtype
                assert torch.equal(buf.float(), want), "max differs from NCCL's"
            else:
                self.close(f"all_reduce {op}", buf, want, dtype)
        finally:
            self.free(buf)

    def all_reduce_outside_heap(self, n: int, dtype: Any, graph: bool) -> None:
        """An ordinary CUDA tensor (not of the heap), eagerly or replayed in a CUDA graph with new
        data each time: the lamport sizes take it where it is, the larger ones stage it through a
        heap workspace; the sum is NCCL's and the heap's free bytes change only by that
        workspace (made at the first call)."""
        t = torch.empty(n, dtype=dtype, device="cuda")
        for replay in range(3 if graph else 1):
            x = self.data(n, dtype)
            want = self.ref_all_reduce(x, "sum")
            t.copy_(x)
            if graph and replay == 0:
                ironlink.all_reduce(t, heap=self.heap, check=True)  # outside capture: workspaces made
                t.copy_(x)
                free = self.heap.free_bytes
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    ironlink.all_reduce(t, heap=self.heap)
                assert self.heap.free_bytes == free, "capture took heap memory"
            if graph:
                g.replay()
            else:
                ironlink.all_reduce(t, heap=self.heap, check=True)
            torch.cuda.synchronize()
            self.heap.check()
            self.close(f"all_reduce of a tensor outside the heap (replay {replay})", t, want, dtype)

    def gather_scatter_outside_heap(self, n: int, dtype: Any) -> None:
        """all_gather and reduce_scatter of ordinary CUDA tensors (staged through heap workspaces,
        as their torch operators stage): NCCL's results."""
        inp = self.data(n, dtype)
        out = torch.empty(self.world * n, dtype=dtype, device="cuda")
        ironlink.all_gather(out, inp, heap=self.heap, check=True)
        assert torch.equal(out, self.ref_all_gather(inp)), "all_gather of tensors outside the heap"
        full = self.data(self.world * n, dtype)
        part = torch.empty(n, dtype=dtype, device="cuda")
        ironlink.reduce_scatter(part, full, heap=self.heap, check=True)
        self.close("reduce_scatter of tensors outside the heap", part, self.ref_reduce_scatter(full, n, "sum"), dtype)
        self.heap.check()

    def all_reduce_lamport(self, n: int, dtype: Any, op: str, replays: int = 0) -> None:
        """The op through lamport slots (forced here at every size it takes): eagerly, then with
        `replays`, captured once and replayed with new data each time (a slot left full by one
        call would hand a later one stale data); bitwise the same on every rank, and every slot
        empty again at the end."""
        from ironlink.runtime.tuning import decode_table

        buf = None
        forced = decode_table.table_for(self.world)._replace(all_reduce=((decode_table.NO_LIMIT, "lamport"),))
        try:
            with decode_table.substituted(self.world, forced):
                buf = self.alloc(n, dtype)
                src = torch.empty(n, dtype=dtype, device="cuda")

                def step() -> None:
                    buf.copy_(src)
                    ironlink.all_reduce(buf, op=op, heap=self.heap)

                g = None
                for i in range(1 + replays):
                    src.copy_(self.data(n, dtype))
                    want = self.ref_all_reduce(src, op)
                    if g is None:
                        step()
                    else:
                        g.replay()
                    torch.cuda.synchronize()
                    if op in ("max", "min"):  # exact in any dtype
                        assert torch.equal(buf.float(), want), f"call {i}: {op} differs from NCCL's"
                    else:
                        self.close(f"call {i}: all_reduce {op}", buf, want, dtype)
                    same_on_all_ranks(buf)
                    if i == 0 and replays:
                        g = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(g):
                            step()
                del g
                self.heap.check()
                lamport_slots_empty(self.heap, "all_reduce", [dtype])
        finally:
            self.free(buf)

    def all_reduce_hierarchical(self, n: int, dtype: Any, op: str) -> None:
        """`symm_all_reduce_hierarchical` on this one-node heap (a two-shot all-reduce): against
        NCCL, and bitwise equal on every rank."""
        buf = None
        try:
            buf = self.alloc(n, dtype)
            x = self.data(n, dtype)
            buf.copy_(x)
            want = self.ref_all_reduce(x, op)
            status = torch.full((4,), -100, dtype=torch.int32, device=buf.device)
            _hierarchical_kernel[(4,)](self.heap.ctx, buf, n, reduce_op_code(op), status)
            torch.cuda.synchronize()
            assert status.tolist() == [0] * 4, f"statuses {status.tolist()}"
            self.close(f"all_reduce_hierarchical {op}", buf, want, dtype)
            same_on_all_ranks(buf)
        finally:
            self.free(buf)

    def all_gather(self, n: int, dtype: Any, in_place: bool) -> None:
        out = inp = None
        try:
            out = self.alloc(self.world * n, dtype)
            out.fill_(float("nan"))
            x = self.data(n, dtype)
            if in_place:
                view = out[self.rank * n : (self.rank + 1) * n]
            else:
                inp = view = self.alloc(n, dtype)
            view.copy_(x)
            want = self.ref_all_gather(x)
            ironlink.all_gather(out, view, check=True)
            torch.cuda.synchronize()
            assert torch.equal(out, want), "all_gather differs from NCCL's"
        finally:
            self.free(inp, out)

    def reduce_scatter(self, n: int, dtype: Any, op: str, in_place: bool) -> None:
        inp = out = None
        try:
            inp = self.alloc(self.world * n, dtype)
            full = self.data(self.world * n, dtype)
            inp.copy_(full)
            if in_place:
                view = inp[self.rank * n : (self.rank + 1) * n]
            else:
                out = view = self.alloc(n, dtype)
                view.fill_(float("nan"))
            want = self.ref_reduce_scatter(full, n, op)
            ironlink.reduce_scatter(view, inp, op=op, check=True)
            torch.cuda.synchronize()
            self.close(f"reduce_scatter {op}", view, want, dtype)
        finally:
            self.free(out, inp)

    def cuda_graph(self, dtype: Any, n: int) -> None:
        """All three calls captured once (after a warm-up outside capture), replayed with new data."""
        w = self.world
        ar = ag_out = ag_in = rs_in = rs_out = None
        try:
            ar, ag_out, ag_in = self.alloc(w * n, dtype), self.alloc(w * n, dtype), self.alloc(n, dtype)
            rs_in, rs_out = self.alloc(w * n, dtype), self.alloc(n, dtype)
            src_ar, src_ag, src_rs = (torch.empty(m, dtype=dtype, device="cuda") for m in (w * n, n, w * n))

            def step() -> None:  # copy-ins are captured too: each replay reads the sources anew
                ar.copy_(src_ar)
                ag_in.copy_(src_ag)
                rs_in.copy_(src_rs)
                ironlink.all_reduce(ar)
                ironlink.all_gather(ag_out, ag_in)
                ironlink.reduce_scatter(rs_out, rs_in)

            for s in (src_ar, src_ag, src_rs):
                s.copy_(self.data(s.numel(), dtype))
            step()  # warm-up: compiles the kernels for these exact arguments
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                with torch.cuda.graph(g, stream=stream):
                    step()
                    try:  # rejected before anything is launched, so the capture stays valid
                        ironlink.all_reduce(ar, check=True)
                        raise AssertionError("check=True was accepted during capture")
                    except ValueError as e:
                        assert "heap.check()" in str(e), str(e)
            torch.cuda.current_stream().wait_stream(stream)
            for replay in range(3):
                for s in (src_ar, src_ag, src_rs):
                    s.copy_(self.data(s.numel(), dtype))
                wants = (self.ref_all_reduce(src_ar, "sum"), self.ref_all_gather(src_ag),
                         self.ref_reduce_scatter(src_rs, n, "sum"))
                self.heap.barrier()
                g.replay()
                torch.cuda.synchronize()
                self.close(f"replay {replay} all_reduce", ar, wants[0], dtype)
                assert torch.equal(ag_out, wants[1]), f"replay {replay}: all_gather differs"
                self.close(f"replay {replay} reduce_scatter", rs_out, wants[2], dtype)
            del g
            self.heap.check()  # nothing recorded (no timeouts)
        finally:
            self.free(rs_out, rs_in, ag_in, ag_out, ar)

    def argument_errors(self) -> None:
        """Rejected on the host, before any launch (so no rank waits for the others)."""
        foreign = torch.zeros(64, dtype=torch.bfloat16, device="cuda")
        try:
            ironlink.all_reduce(foreign)
            raise AssertionError("a tensor outside the heap was accepted")
        except ironlink.IronlinkError as e:
            assert "knows of" in str(e) or "not in a live allocation" in str(e), str(e)
        a = b = c = None
        try:
            a, b = self.alloc(8 * self.world, torch.bfloat16), self.alloc(7, torch.bfloat16)
            c = self.heap.empty((16,), torch.int32)
            for call, err, words in [
                (lambda: ironlink.all_gather(a, b), ValueError, "world size x inp's elements"),
                (lambda: ironlink.reduce_scatter(b, a), ValueError, "world size x out's elements"),
                (lambda: ironlink.all_reduce(c), TypeError, "int32"),
                (lambda: ironlink.all_reduce(a.view(2, -1).t()), ValueError, "contiguous"),
                (lambda: ironlink.all_reduce(a, op="mean"), ValueError, "op must be one of"),
            ]:
                try:
                    call()
                    raise AssertionError(f"accepted; wanted {err.__name__} with {words!r}")
                except err as e:
                    assert words in str(e), str(e)
        finally:
            self.free(c, b, a)


if torch is not None:
    import triton.language as tl

    import ironlink.typed as ilt
    from ironlink.runtime.tensor_spec import reduce_op_code

    # The hierarchical algorithm pinned on this one-node heap (P2P bitcode).
    @ironlink.jit(several_nodes=True)
    def _hierarchical_kernel(ctx, buf, n, op, status):
        tl.store(status + tl.program_id(0), ilt.all_reduce(ctx, buf, n, op))


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


def main() -> int:
    reason = skip_reason()
    if reason:
        print(f"== ops: skipped ({reason}) ==", flush=True)
        return 0
    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(4321 + rank)
    heap = ironlink.SymmetricHeap(320 << 20, timeout_s=heap_timeout_s())
    s = Suite(heap)
    t0 = time.time()

    def first_call_names_heap() -> None:
        # No heap passed yet in this process: the error asks for heap=; then it is remembered.
        x = heap.zeros((256,), torch.float32)
        try:
            try:
                ironlink.all_reduce(x)
                raise AssertionError("a heap no call had named was found")
            except ironlink.IronlinkError as e:
                assert "heap=" in str(e), str(e)
            x.fill_(1.0)
            ironlink.all_reduce(x, heap=heap, check=True)
            ironlink.all_reduce(x, check=True)  # found from the tensor now
            torch.cuda.synchronize()
            assert torch.equal(x, torch.full_like(x, float(world * world))), "sum of sums"
        finally:
            heap.free(x)

    s.run("first call needs heap=, later calls find it", first_call_names_heap)
    for dtype in (torch.bfloat16, torch.float32):
        esize = torch.tensor([], dtype=dtype).element_size()
        counts = [b // esize for b in small(MESSAGE_BYTES, MESSAGE_BYTES[:2])] + [ODD_ELEMENTS * world]
        for total in counts:
            per_rank = total // world
            label = f"{dtype} {total * esize} B"
            s.run(f"all_reduce sum {label}", lambda: s.all_reduce(total, dtype, "sum"))
            s.run(f"all_gather {label}", lambda: s.all_gather(per_rank, dtype, False))
            s.run(f"reduce_scatter sum {label}", lambda: s.reduce_scatter(per_rank, dtype, "sum", False))
        n = (1 << 20) // esize
        for op in ("max", "avg"):
            s.run(f"all_reduce {op} {dtype} 1 MiB", lambda: s.all_reduce(n, dtype, op))
            s.run(f"reduce_scatter {op} {dtype} 1 MiB", lambda: s.reduce_scatter(n // world, dtype, op, False))
        # Through lamport slots: one CTA (1 element, 1 KiB), a ragged last CTA, the most CTAs.
        lamport_counts = [1, 1024 // esize, 5000, (256 << 10) // esize]
        for n_lamport in small(lamport_counts, lamport_counts[:3]):
            for op in ("sum", "max", "min", "prod", "avg"):
                s.run(f"all_reduce lamport {op} {dtype} {n_lamport} elements",
                      lambda: s.all_reduce_lamport(n_lamport, dtype, op))
        s.run(f"all_reduce lamport sum {dtype} 16 KiB: 300 graph replays with new data",
              lambda: s.all_reduce_lamport((16 << 10) // esize, dtype, "sum", replays=300))
        for op in ("sum", "avg"):
            s.run(f"all_reduce_hierarchical {op} {dtype} (one node: two-shot)",
                  lambda: s.all_reduce_hierarchical(300001, dtype, op))
        for nbytes in (1024, 64 << 10, 4 << 20):  # lamport sizes (taken where they are), then staged
            for graph in (False, True):
                s.run(f"all_reduce sum {dtype} {nbytes} B outside the heap{' in a CUDA graph' if graph else ''}",
                      lambda: s.all_reduce_outside_heap(nbytes // esize, dtype, graph))
        s.run(f"all_gather and reduce_scatter {dtype} outside the heap", lambda: s.gather_scatter_outside_heap(4099, dtype))
        s.run(f"all_gather in place {dtype}", lambda: s.all_gather(4099, dtype, True))
        s.run(f"reduce_scatter in place {dtype}", lambda: s.reduce_scatter(4099, dtype, "sum", True))
        s.run(f"cuda graph {dtype} small", lambda: s.cuda_graph(dtype, 300))
        if not SMALL:
            s.run(f"cuda graph {dtype} 1 MiB per rank", lambda: s.cuda_graph(dtype, (1 << 20) // esize))
    for dtype in (torch.bfloat16, torch.float32):
        for row in small((7, 4096), (7,)):
            s.run(f"all_to_all_v {dtype} row {row}", lambda: all_to_all_v_case(s, row, dtype, (1, 2, 3), graph=False))
        s.run(f"all_to_all_v {dtype} in a CUDA graph, counts changed between replays",
              lambda: all_to_all_v_case(s, 1000, dtype, (4, 5, 6), graph=True))
    for tokens, skewed in ((37, False), (256, True)):
        s.run(f"moe dispatch/combine {tokens} tokens {'skewed' if skewed else 'uniform'}",
              lambda: moe_case(s, tokens, skewed, graph=False))
    s.run("moe dispatch/combine in a CUDA graph, routing changed between replays",
          lambda: moe_case(s, 64, False, graph=True))
    s.run("moe over capacity", lambda: moe_case(s, 64, True, graph=False, capacity=32))
    for tokens, skewed, fp8 in ((300, False, False), (256, True, False), (256, True, True)):
        s.run(f"moe direct path = relay path bitwise, {tokens} tokens{' skewed' if skewed else ''}{' fp8' if fp8 else ''}",
              lambda: moe_paths_case(s, tokens, skewed, fp8))
    s.run("moe on an 8-SM budget in a CUDA graph, routing changed between replays",
          lambda: moe_case(s, 64, True, graph=True, sms=8))
    for tokens, skewed in ((37, False), (128, True)):
        s.run(f"moe low-latency path {tokens} tokens {'skewed' if skewed else 'uniform'}",
              lambda: moe_case(s, tokens, skewed, graph=False, path="low_latency"))
    s.run("moe low-latency path in a CUDA graph, routing changed between replays",
          lambda: moe_case(s, 64, False, graph=True, path="low_latency"))
    s.run("moe low-latency path fp8 dispatch 64 tokens skewed",
          lambda: moe_case(s, 64, True, graph=False, fp8=True, path="low_latency"))
    # x in the heap: the direct path pulls its rows in place (no stage copy).
    s.run("moe direct path, x in the heap, 300 tokens skewed",
          lambda: moe_case(s, 300, True, graph=False, path="direct", x_in_heap=True))
    s.run("moe direct path, x in the heap, in a CUDA graph, routing changed between replays",
          lambda: moe_case(s, 64, False, graph=True, path="direct", x_in_heap=True))
    # The receive deferred (return_recv_hook) past a kernel on the low-latency kernels' tile indices.
    s.run("moe low-latency path, receive deferred, 128 tokens skewed",
          lambda: moe_case(s, 128, True, graph=False, path="low_latency", deferred=True))
    s.run("moe low-latency path, receive deferred, fp8, in a CUDA graph, routing changed between replays",
          lambda: moe_case(s, 64, False, graph=True, fp8=True, path="low_latency", deferred=True))
    s.run("moe out-of-range expert ids", lambda: moe_bad_ids_case(s))
    s.run("moe fp8 dispatch 256 tokens skewed", lambda: moe_case(s, 256, True, graph=False, fp8=True))
    if not SMALL:
        for fp8 in (False, True):
            name = (f"moe at the limits: {LIMITS[0]} tokens, hidden {LIMITS[1]}, top-{LIMITS[2]} of 256 experts, "
                    f"skewed{', fp8' if fp8 else ''}")
            need = limits_case_bytes(s.world, fp8) * ranks_per_gpu()
            have = torch.cuda.get_device_properties(0).total_memory
            if need > have:
                if rank == 0:
                    print(f"skipped: {name}: {ranks_per_gpu()} rank(s) on a GPU need about {need / 2**30:.0f} GiB "
                          f"of its {have / 2**30:.0f} GiB")
                continue
            s.run(name, lambda: moe_limits_case(s, fp8))
    for path in ("low_latency", "direct"):
        s.run(f"moe fp8 dispatch in a CUDA graph, routing changed between replays, {path} path",
              lambda: moe_case(s, 64, False, graph=True, fp8=True, path=path))
    s.run("all_to_all_v over capacity", lambda: all_to_all_v_case(s, 64, torch.bfloat16, (7,), graph=False, out_rows=5))
    s.run("argument errors", s.argument_errors)
    s.run("heap.check() is clean", lambda: s.heap.check())
    s.heap.close()
    code = s.report("ops", world, t0)
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
