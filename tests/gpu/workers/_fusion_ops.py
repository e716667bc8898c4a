"""The fusion suite's cases of the fused ops (`tests/gpu/workers/fusion_worker.py` runs them):
all_reduce_rmsnorm in every mode and in PDL chains, matmul_all_reduce, matmul_reduce_scatter and
all_gather_matmul, eager and in CUDA graphs, against float64 references and bitwise equal on
every rank."""

from __future__ import annotations

from typing import Callable, Optional

import torch

import ironlink
from ironlink.runtime import tuning

from _cases import close_to, lamport_slots_empty, same_on_all_ranks  # tests/gpu/workers/, the script's own directory


from _fusion_tiles import TileSuite


class Suite(TileSuite):
    """`TileSuite` with the fused ops' cases."""

    def rmsnorm(self, tokens: int, hidden: int, dtype: torch.dtype, mode: str | None, graph: bool,
                back_to_back: int = 0, separate_residual: bool = False, fp8: bool = False,
                config: tuning.RmsnormConfig | None = None, outside_heap: bool = False) -> None:
        """Eager once, or in a CUDA graph replayed 3 times; with `back_to_back`, a graph of the
        inputs' reset and the op replayed that many times without a host sync, checked at the end.
        `separate_residual`: the sum goes to residual_out, residual stays; `fp8`: out is
        float8_e4m3fn with per-token scales, checked dequantized against the float64 reference;
        `config`: the op's (`tuning.RmsnormConfig`); `outside_heap`: x an ordinary tensor."""
        w, r = self.world, self.rank
        x = self.empty((tokens, hidden), dtype, outside_heap)
        gen = torch.Generator(device="cuda").manual_seed(1234)
        parts = [torch.randn(tokens, hidden, device="cuda", generator=gen).to(dtype) for _ in range(w)]
        res0 = torch.randn(tokens, hidden, device="cuda", generator=gen).to(dtype)
        weight = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=gen)).to(dtype)
        residual = res0.clone()
        res_out = torch.full_like(res0, float("nan")) if separate_residual else residual
        out = torch.empty(tokens, hidden, device="cuda", dtype=torch.float8_e4m3fn if fp8 else dtype)
        scale = torch.empty(tokens, device="cuda", dtype=torch.float32) if fp8 else None
        eps = 1e-6

        def prepare() -> None:
            x.copy_(parts[r])
            residual.copy_(res0)

        def check() -> None:
            want_res = sum(p.double() for p in parts) + res0.double()
            var = want_res.pow(2).mean(-1, keepdim=True)
            want = want_res * torch.rsqrt(var + eps) * weight.double()
            close_to(res_out, want_res, dtype, "residual")
            if separate_residual:
                assert torch.equal(residual, res0), "residual changed though residual_out was given"
            if fp8:
                assert scale is not None
                amax = want.abs().amax(-1)
                assert ((scale.double() - amax / 448).abs() <= 2e-2 * amax / 448).all(), "per-token scales"
                got = out.double() * scale.double()[:, None]  # e4m3 keeps 3 mantissa bits
                assert ((got - want).abs() <= 0.07 * amax[:, None] + 1e-6).all(), "fp8 out, dequantized"
                same_on_all_ranks(scale)
            else:
                close_to(out, want, dtype, "out")
            same_on_all_ranks(out)
            same_on_all_ranks(res_out)

        def run() -> None:
            ironlink.all_reduce_rmsnorm(x, residual, weight, eps, out=out, heap=self.heap, mode=mode,
                                        residual_out=res_out if separate_residual else None, scale=scale,
                                        config=config)

        try:
            if back_to_back:
                prepare()
                run()
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    prepare()
                    run()
                for _ in range(back_to_back):
                    g.replay()
                torch.cuda.synchronize()
                self.heap.check()
                check()
            else:
                self.replays(run, graph, prepare, check)
            if mode in ("lamport", "split"):
                lamport_slots_empty(self.heap, "all_reduce_rmsnorm", [dtype])
        finally:
            self.release(x)

    def rmsnorm_pdl_chain(self, tokens: int, hidden: int, dtype: torch.dtype, mode: str | None, steps: int = 6,
                          replays: int = 200) -> None:
        """Programmatic dependent launch (ironlink.language.pdl) against none. A chain of dependent launches:
        step i is all_reduce_rmsnorm(src -> dst), the residual carried from step to step, then
        ironlink.all_reduce(dst, "avg"), and dst is the next step's src. Run eagerly and as a CUDA
        graph (inputs reset inside it) replayed `replays` times back to back, with PDL off, on,
        and alternating by step (every on/off transition). Every result must be bitwise the
        eager PDL-off one, on every rank: a kernel that read its inputs (the previous kernel's
        out, the residual of two kernels back) before they were complete would differ."""
        w, r = self.world, self.rank
        bufs = [self.heap.empty((tokens, hidden), dtype) for _ in range(2)]
        gen = torch.Generator(device="cuda").manual_seed(4321)
        parts = [torch.randn(tokens, hidden, device="cuda", generator=gen).to(dtype) for _ in range(w)]
        res0 = torch.randn(tokens, hidden, device="cuda", generator=gen).to(dtype)
        weight = (1 + 0.1 * torch.randn(hidden, device="cuda", generator=gen)).to(dtype)
        residual = torch.empty_like(res0)

        def chain(pdl_at: Callable[[int], bool]) -> torch.Tensor:
            src, dst = bufs
            src.copy_(parts[r])
            residual.copy_(res0)
            for i in range(steps):
                ironlink.all_reduce_rmsnorm(src, residual, weight, 1e-6, out=dst, heap=self.heap, mode=mode,
                                            pdl=pdl_at(i))
                if i + 1 < steps:
                    ironlink.all_reduce(dst, op="avg", heap=self.heap, pdl=pdl_at(i))
                    src, dst = dst, src
            return dst

        variants: dict[str, Callable[[int], bool]] = {"off": lambda i: False, "on": lambda i: True,
                                                      "alternating": lambda i: i % 2 == 0}
        want: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        try:
            for name, pdl_at in variants.items():
                final = chain(pdl_at)  # eagerly: also compiles the variant outside capture
                torch.cuda.synchronize()
                self.heap.check()
                got = [(f"{name} eager", final.clone(), residual.clone())]
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    final = chain(pdl_at)
                for _ in range(replays):
                    g.replay()
                torch.cuda.synchronize()
                self.heap.check()
                got.append((f"{name} graph x{replays}", final.clone(), residual.clone()))
                del g
                if want is None:
                    want = got[0][1:]
                    assert torch.isfinite(want[0].float()).all() and torch.isfinite(want[1].float()).all()
                    same_on_all_ranks(want[0])
                    same_on_all_ranks(want[1])
                for what, out, res in got:
                    assert torch.equal(out, want[0]), f"PDL {what}: out differs bitwise from PDL off"
                    assert torch.equal(res, want[1]), f"PDL {what}: residual differs bitwise from PDL off"
        finally:
            for b in bufs:
                self.heap.free(b)

    def replays(self, run: Callable[[], object], graph: bool, prepare: Callable[[], None],
                check: Callable[[], None]) -> None:
        """`run` once eagerly, or captured in a CUDA graph and replayed 3 times; `prepare` before
        each (and before the capture's warm-up), `check` after each."""
        reps = 1
        if graph:
            prepare()
            run()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                run()
            reps = 3
        for _ in range(reps):
            prepare()
            g.replay() if graph else run()
            torch.cuda.synchronize()
            self.heap.check()
            check()

    def operands(self, m: int, n: int, k: int, dtype: torch.dtype, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every rank's a [m, k] and b [k, n] (same on all ranks: each computes its references)."""
        gen = torch.Generator(device="cuda").manual_seed(seed)
        a_all = [torch.randn(m, k, device="cuda", generator=gen).to(dtype) for _ in range(self.world)]
        b_all = [(torch.randn(k, n, device="cuda", generator=gen) / k ** 0.5).to(dtype) for _ in range(self.world)]
        return a_all, b_all

    @staticmethod
    def nan_fill(*outputs: torch.Tensor) -> Callable[[], None]:
        """A `prepare` that sets the outputs to NaN: a tile never written shows."""
        def fill() -> None:
            for t in outputs:
                t.fill_(float("nan"))
        return fill

    # Back-to-back launches (`launches`, 1 or a power of two so the scaling is exact) take inputs
    # scaled by 1, 2, ...: a tile summed late or read early shows in the last result.

    def matmul(self, m: int, n: int, k: int, dtype: torch.dtype, graph: bool, launches: int = 1,
               method: Optional[str] = None, b_row_major: bool = False,
               exchange: Optional[tuning.PushPacing] = None, outside_heap: bool = False) -> None:
        a_all, b_all = self.operands(m, n, k, dtype, 99)
        # b column-major by default: strides are honoured (and the TMA path reads b's transpose).
        b = b_all[self.rank] if b_row_major else b_all[self.rank].t().contiguous().t()
        out = self.empty((m, n), dtype, outside_heap)
        a_scaled = [a_all[self.rank] * (i + 1) for i in range(launches)]

        def check() -> None:
            close_to(out, sum(x.double() @ y.double() for x, y in zip(a_all, b_all)) * launches, dtype)
            same_on_all_ranks(out)

        try:
            self.replays(lambda: [ironlink.matmul_all_reduce(x, b, out=out, heap=self.heap, method=method,
                                                             exchange=exchange)
                                  for x in a_scaled], graph, self.nan_fill(out), check)
            lamport_slots_empty(self.heap, "matmul_all_reduce", [dtype])
        finally:
            self.release(out)

    def matmul_scatter(self, m: int, n: int, k: int, dtype: torch.dtype, graph: bool, method: str,
                       launches: int = 1, exchange: Optional[tuning.ScatterExchange] = None) -> None:
        w, r = self.world, self.rank
        a_all, b_all = self.operands(m, n, k, dtype, 98)
        b = b_all[r].t().contiguous().t()
        out = torch.empty(m // w, n, device="cuda", dtype=dtype)
        a_scaled = [a_all[r] * (i + 1) for i in range(launches)]

        def check() -> None:
            ref = sum(x.double() @ y.double() for x, y in zip(a_all, b_all)) * launches
            close_to(out, ref[r * m // w:(r + 1) * m // w], dtype)

        self.replays(lambda: [ironlink.matmul_reduce_scatter(x, b, heap=self.heap, out=out, method=method,
                                                             exchange=exchange)
                              for x in a_scaled],
                     graph, self.nan_fill(out), check)

    def gather_matmul(self, rows: int, n: int, k: int, dtype: torch.dtype, graph: bool, method: str,
                      launches: int = 1, contiguous: bool = False, outside_heap: bool = False) -> None:
        """contiguous=False: a column-major shard (strides are honoured; the kernel method's CTAs
        push it); True: a row-major one, which the kernel method is asked to move by the copy engine.
        `outside_heap`: a_full an ordinary tensor."""
        w, r = self.world, self.rank
        shards, b_all = self.operands(rows, n, k, dtype, 97)
        b = b_all[r]
        a_full = self.empty((w * rows, k), dtype, outside_heap)
        out = torch.empty(w * rows, n, device="cuda", dtype=dtype)
        shard_t = shards[r].contiguous() if contiguous else shards[r].t().contiguous().t()
        a_scaled = [shard_t * (i + 1) for i in range(launches)]

        def check() -> None:
            want = torch.cat(shards) * launches
            assert torch.equal(a_full, want), "a_full is not the shards in rank order"
            close_to(out, want.double() @ b.double(), dtype)  # out differs by rank: b is this rank's

        try:
            exchange = tuning.GatherExchange(copy_engine=True) if contiguous else None
            self.replays(lambda: [ironlink.all_gather_matmul(x, b, heap=self.heap, a_full=a_full, out=out, method=method,
                                                             exchange=exchange)
                                  for x in a_scaled], graph, self.nan_fill(a_full, out), check)
        finally:
            self.release(a_full)
