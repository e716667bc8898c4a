"""The ops suite's collective cases (`tests/gpu/workers/ops_worker.py` runs them): ironlink.all_reduce,
all_gather and reduce_scatter against NCCL, on the lamport and hierarchical paths, outside the heap,
in CUDA graphs, and the argument errors."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import triton.language as tl

import ironlink
import ironlink.typed as ilt
from ironlink.runtime.tensor_spec import reduce_op_code

from _cases import Cases, lamport_slots_empty, peers_still_in, renewed, same_on_all_ranks  # the script's own directory

MESSAGE_BYTES = [1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26]  # 1 KiB .. 64 MiB
ODD_ELEMENTS = 1003  # not a multiple of 16 bytes, of the world size or of a CTA's share


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


# The hierarchical algorithm pinned on this one-node heap (P2P bitcode).
@ironlink.jit(several_nodes=True)
def _hierarchical_kernel(ctx, buf, n, op, status):
    tl.store(status + tl.program_id(0), ilt.all_reduce(ctx, buf, n, op))
