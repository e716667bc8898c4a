"""Fused ops against their unfused forms, same process, same GPUs, CUDA graphs:

    torchrun --nproc_per_node=4 bench/fused.py --out bench/results/fused-4xh200.json   (bench/run.sh fused)

- allreduce_rmsnorm (tokens x hidden, bf16): ironlink_fused (ironlink.all_reduce_rmsnorm, its default
  mode and PDL setting; ironlink_fused[rows] / [whole] / [push] / [split] each mode without programmatic
  dependent launch, ironlink_fused[rows,pdl] / ... with it, where the GPU has it (sm_90+);
  ironlink_fused[<mode>,fp8] its FP8 output on Hopper, default PDL setting), nccl_torch
  (dist.all_reduce, residual add, F.rms_norm), ironlink_torch (ironlink.all_reduce without PDL
  and the same torch ops; ironlink_torch[pdl] with it), torch_symm_torch (PyTorch's symm_mem
  one_shot_all_reduce and the same torch ops).
- matmul_allreduce ([M, K] x [K, N] per rank, K = 8192 / world): ironlink_fused
  (ironlink.matmul_all_reduce, its default method; ironlink_fused[push] / [tile] each method;
  ironlink_fused[push,one_shot] / [push,two_shot] each kernel of "push", whichever the shape gets),
  nccl_torch (torch.matmul, dist.all_reduce), ironlink_torch (torch.matmul into a heap tensor,
  ironlink.all_reduce); and, to explain the others, the GEMMs alone: torch_matmul, triton_gemm
  (the default method's kernel without communication), triton_gemm[<method>] (the others'),
  triton_gemm[push,one_shot] / [push,two_shot].
- allgather_matmul (a shard [M / world, K] x b [K, N / world], K = N = 8192): ironlink_fused
  (ironlink.all_gather_matmul), nccl_torch (dist.all_gather_into_tensor, torch.matmul),
  torch_symm_fused (torch.ops.symm_mem.fused_all_gather_matmul, where it runs).
- matmul_reducescatter (a [M, K / world] x b [K / world, N], K = N = 8192): ironlink_fused
  (ironlink.matmul_reduce_scatter), nccl_torch (torch.matmul, dist.reduce_scatter_tensor),
  torch_symm_fused (torch.ops.symm_mem.fused_matmul_reduce_scatter, where it runs).
Each point: calls captured in one CUDA graph, median replay, max over ranks; the contenders of one
shape replayed in turns (ironlink_bench.GraphRound), so clock drift over the run falls on each alike.
A benchmark, not a test: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ironlink
from ironlink.runtime import tuning
from ironlink.runtime.heap import DEFAULT_TIMEOUT_S
from ironlink_bench import GraphRound, write_results
from ironlink.fused.all_reduce_rmsnorm import MODES as RMSNORM_MODES
from ironlink.fused.matmul_all_reduce import METHODS
from ironlink.fused.matmul_all_reduce import launch as launch_matmul
from ironlink.fused.matmul_all_reduce import plan as plan_matmul
from ironlink.fused.diagnostics import Diagnostics
from ironlink.runtime.tensor_spec import TensorSpec
from ironlink.runtime.pdl import MIN_MAJOR, choose_pdl

TOKENS = [1, 8, 32, 128, 512, 2048]
MS = [16, 128, 1024, 4096]
SP_MS = [128, 1024, 4096, 16384]  # the sequence-parallel ops' M

GEMM_ONLY = Diagnostics(communicate=False)  # a fused kernel without its exchange: what its time is made of


class FusedBench:
    def __init__(self, heap_bytes: int, timeout_s: float, check_each: bool, contenders: str) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.contenders = re.compile(contenders)  # records only those it finds in a contender's name
        self.heap = ironlink.SymmetricHeap(heap_bytes, timeout_s=timeout_s)
        self.check_each = check_each  # heap.check() after each contender's warm-up and capture
        self.rows: list[dict[str, Any]] = []
        # The current shape's contenders (`record`, each tagged with its row) until they are timed
        # together (`flush`).
        self.round = GraphRound()
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        # Programmatic dependent launch (ironlink.runtime.pdl): what the ops choose by default here, and
        # the settings to measure (both where the GPU has it).
        major = torch.cuda.get_device_capability()[0]
        self.default_pdl = choose_pdl(None, major, "all_reduce_rmsnorm")
        self.pdl_settings = (False, True) if major >= MIN_MAJOR else (False,)

    def record(self, op: str, contender: str, shape: dict[str, int], dtype: str, fn: Callable[[], Any],
               nbytes: int, **extra: Any) -> None:
        """Captures `fn` into the current shape's round; `flush` times the round's contenders in turns."""
        if not self.contenders.search(contender):
            return
        self.round.add(fn, nbytes, tag=({"op": op, "contender": contender, **shape, "dtype": dtype}, shape, extra))
        if self.check_each:
            try:
                self.heap.check()
            except Exception as e:
                raise RuntimeError(f"{op} {contender} {shape}: {e}") from None

    def flush(self) -> None:
        """Times every contender recorded since the last flush side by side (`GraphRound`: clock
        drift over the run falls on each alike) and appends their rows."""
        for (row, shape, extra), us in self.round.run_tagged():
            self.rows.append({**row, "us": round(us, 3), **extra})
            if self.rank == 0:
                print(f"{row['op']:>18} {row['contender']:>22} {shape} {row['dtype']} {us:10.2f} us {extra or ''}",
                      flush=True)
        self.heap.check()

    def rmsnorm(self, tokens: int, hidden: int, dtype: torch.dtype) -> None:
        shape = {"tokens": tokens, "hidden": hidden}
        # Zeros: repeated all-reduces keep them finite (the values do not change the timings).
        x = self.heap.zeros((tokens, hidden), dtype)
        residual = torch.randn(tokens, hidden, device="cuda").to(dtype)
        weight = torch.ones(hidden, device="cuda", dtype=dtype)
        out = torch.empty_like(residual)
        eps, nbytes, dt = 1e-6, x.nbytes, "bf16" if dtype == torch.bfloat16 else "fp16"

        def torch_ops() -> None:
            residual.add_(x)
            F.rms_norm(residual, (hidden,), weight, eps)

        default = tuning.rmsnorm_mode(tokens, hidden * x.element_size(), self.world, self.sms)
        split_fits = tuning.rmsnorm_split_parts(tokens, hidden * x.element_size(), self.world, self.sms) > 1
        for mode in RMSNORM_MODES:
            if mode == "split" and not split_fits:
                continue
            for pdl in self.pdl_settings:
                self.record("allreduce_rmsnorm", f"ironlink_fused[{mode}{',pdl' if pdl else ''}]", shape, dt,
                            lambda: ironlink.all_reduce_rmsnorm(x, residual, weight, eps, out=out, heap=self.heap,
                                                                mode=mode, pdl=pdl), nbytes)

        if split_fits:  # split with the other exchange of its slices (tuning.RMSNORM_SPLIT_LAMPORT)
            flipped = tuning.RmsnormConfig(split_lamport=not tuning.RMSNORM_SPLIT_LAMPORT)
            self.split_other_exchange(shape, dt, nbytes, lambda: ironlink.all_reduce_rmsnorm(
                x, residual, weight, eps, out=out, heap=self.heap, mode="split", pdl=self.default_pdl, config=flipped))
        # Defs, not tuple lambdas: torch_ops returns nothing to put in a tuple.
        def nccl_torch() -> None:
            dist.all_reduce(x)
            torch_ops()

        self.record("allreduce_rmsnorm", "nccl_torch", shape, dt, nccl_torch, nbytes)
        for pdl in self.pdl_settings:
            def ironlink_torch() -> None:
                ironlink.all_reduce(x, heap=self.heap, pdl=pdl)
                torch_ops()

            self.record("allreduce_rmsnorm", f"ironlink_torch{'[pdl]' if pdl else ''}", shape, dt, ironlink_torch,
                        nbytes)
        self.record("allreduce_rmsnorm", "torch_ops", shape, dt, torch_ops, nbytes)
        if torch.cuda.get_device_capability()[0] >= 9:  # the FP8 output (per-token scales) for an FP8 GEMM
            out8 = torch.empty(tokens, hidden, device="cuda", dtype=torch.float8_e4m3fn)
            scale = torch.empty(tokens, device="cuda", dtype=torch.float32)
            default8 = tuning.rmsnorm_mode(tokens, hidden * x.element_size(), self.world, self.sms)
            self.record("allreduce_rmsnorm", f"ironlink_fused[{default8},fp8]", shape, dt,
                        lambda: ironlink.all_reduce_rmsnorm(x, residual, weight, eps, out=out8, heap=self.heap,
                                                            scale=scale), nbytes, pdl=self.default_pdl)
        self.torch_symm(shape, dt, x, torch_ops, nbytes)
        self.flush()
        chosen = f"ironlink_fused[{default}{',pdl' if self.default_pdl else ''}]"
        best = next(r for r in reversed(self.rows) if r["contender"] == chosen)
        self.rows.append({**best, "contender": "ironlink_fused", "mode": default, "pdl": self.default_pdl})
        self.heap.free(x)

    def split_other_exchange(self, shape: dict[str, int], dt: str, nbytes: int, fn: Callable[[], Any]) -> None:
        """Records `fn`, mode split with the exchange of its slices that the tuning does not choose
        (its config flipped: `ironlink_fused[split,lamport]` or `[split,ll]`), with the default PDL
        setting."""
        chosen = tuning.RMSNORM_SPLIT_LAMPORT
        self.record("allreduce_rmsnorm", f"ironlink_fused[split,{'ll' if chosen else 'lamport'}"
                    f"{',pdl' if self.default_pdl else ''}]", shape, dt, fn, nbytes)

    def torch_symm(self, shape: dict[str, int], dt: str, x: torch.Tensor, torch_ops: Callable[[], None],
                   nbytes: int) -> None:
        """torch_symm_torch: PyTorch's symm_mem one_shot_all_reduce, then the same torch ops (where
        this torch build runs it under CUDA graphs; else say why and go on)."""
        import torch.distributed._symmetric_memory as symm_mem

        try:
            buf = symm_mem.empty(x.shape, dtype=x.dtype, device="cuda")
            buf.zero_()
            group = dist.group.WORLD.group_name
            symm_mem.rendezvous(buf, group)

            def run() -> None:
                x.copy_(torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group))
                torch_ops()

            run()
            torch.cuda.synchronize()
            self.record("allreduce_rmsnorm", "torch_symm_torch", shape, dt, run, nbytes)
        except Exception as e:  # not every torch build has it (or captures it)
            if self.rank == 0:
                print(f"allreduce_rmsnorm: torch_symm_torch skipped: {type(e).__name__}: {str(e)[:200]}", flush=True)

    def matmul(self, m: int, n: int, k: int, dtype: torch.dtype, configs: list[tuning.MatmulConfig]) -> None:
        shape = {"M": m, "N": n, "K": k}
        a = torch.randn(m, k, device="cuda").to(dtype)
        b = (torch.randn(k, n, device="cuda") / k ** 0.5).to(dtype)
        out = self.heap.empty((m, n), dtype)
        c = torch.empty(m, n, device="cuda", dtype=dtype)
        nbytes, dt = out.nbytes, "bf16" if dtype == torch.bfloat16 else "fp16"
        default = tuning.matmul_config(m, n, k, self.world)
        specs = [TensorSpec.from_tensor(t, name) for t, name in ((a, "a"), (b, "b"), (out, "out"))]
        method = plan_matmul(*specs, str(self.heap.device), self.world, self.sms).method
        self.record("matmul_allreduce", "ironlink_fused", shape, dt,
                    lambda: ironlink.matmul_all_reduce(a, b, out=out, heap=self.heap), nbytes, method=method,
                    config=list(default))
        for meth in METHODS:
            self.record("matmul_allreduce", f"ironlink_fused[{meth}]", shape, dt,
                        lambda: ironlink.matmul_all_reduce(a, b, out=out, heap=self.heap, method=meth), nbytes)
        for cfg in (c for c in configs if c != default):
            self.record("matmul_allreduce", "ironlink_fused[cfg]", shape, dt,
                        lambda: ironlink.matmul_all_reduce(a, b, out=out, heap=self.heap, config=cfg), nbytes,
                        config=list(cfg))
        self.record("matmul_allreduce", "nccl_torch", shape, dt,
                    lambda: (torch.matmul(a, b, out=c), dist.all_reduce(c)), nbytes)
        self.record("matmul_allreduce", "ironlink_torch", shape, dt,
                    lambda: (torch.matmul(a, b, out=out), ironlink.all_reduce(out, heap=self.heap)), nbytes)
        self.record("matmul_allreduce", "torch_matmul", shape, dt, lambda: torch.matmul(a, b, out=c), nbytes)
        status = torch.zeros(256, dtype=torch.int32, device="cuda")
        # The push method's two kernels whatever tuning.matmul_one_shot picks: one-shot and two-shot.
        push = plan_matmul(*specs, str(self.heap.device), self.world, self.sms, None, "push")
        pacing = tuning.push_pacing(torch.cuda.get_device_capability()[0])  # the measured one, varied below
        for shots, one_shot in (("one_shot", True), ("two_shot", False)):
            p = push._replace(one_shot=one_shot)
            self.record("matmul_allreduce", f"ironlink_fused[push,{shots}]", shape, dt,
                        lambda: launch_matmul(self.heap, p, a, b, out, status), nbytes)
            if one_shot:  # the tail's push and reduce in turn or interleaved (tuning.MATMUL_TAIL_INTERLEAVED)
                for tail in ("serial", "interleaved"):
                    self.record("matmul_allreduce", f"ironlink_fused[push,one_shot,tail_{tail}]", shape, dt,
                                lambda: launch_matmul(self.heap, p, a, b, out, status, replace(
                                    pacing, tail_interleaved=tail == "interleaved")), nbytes)
            elif self.world == 2:  # signals per tile or in batches (tuning.MATMUL_SIGNAL_EVERY)
                for every in sorted({1, 2, 4, 8} | {tuning.MATMUL_SIGNAL_EVERY}):
                    self.record("matmul_allreduce", f"ironlink_fused[push,two_shot,signal_every={every}]", shape, dt,
                                lambda: launch_matmul(self.heap, p, a, b, out, status,
                                                      replace(pacing, signal_every=every)), nbytes)
            # Its GEMM alone (the kernel without communication): what the fused time is made of.
            self.record("matmul_allreduce", f"triton_gemm[push,{shots}]", shape, dt,
                        lambda: launch_matmul(self.heap, p, a, b, out, status, diagnostics=GEMM_ONLY), nbytes)
        # Each method's GEMM alone (its kernel without communication): what the fused time is made of.
        for meth in METHODS:
            p = plan_matmul(*specs, str(self.heap.device), self.world, self.sms, None, meth)
            contender = "triton_gemm" if meth == method else f"triton_gemm[{meth}]"
            self.record("matmul_allreduce", contender, shape, dt,
                        lambda: launch_matmul(self.heap, p, a, b, out, status, diagnostics=GEMM_ONLY), nbytes)
        self.flush()
        if int(status.abs().max()):  # the push kernels launched here without launch_with_status's check
            raise RuntimeError(f"matmul_allreduce push: status {status.tolist()}")
        self.heap.free(out)


class SequenceParallelBench:
    """all_gather + matmul and matmul + reduce_scatter against NCCL + torch.matmul and PyTorch's
    fused ops (symmetric memory, async tensor parallelism)."""

    def __init__(self, b: FusedBench) -> None:
        self.b = b
        import torch.distributed._symmetric_memory as symm_mem

        self.symm_mem = symm_mem
        self.group = dist.group.WORLD.group_name

    def torch_fused(self, op: str, shape: dict[str, int], fn: Callable[[], Any], nbytes: int) -> None:
        if not self.b.contenders.search("torch_symm_fused"):
            return
        try:
            fn()
            torch.cuda.synchronize()
            self.b.record(op, "torch_symm_fused", shape, "bf16", fn, nbytes)
        except Exception as e:  # not every torch build runs them (or captures them): say why, go on
            if self.b.rank == 0:
                print(f"{op}: torch_symm_fused skipped: {type(e).__name__}: {str(e)[:200]}", flush=True)

    def gather_matmul(self, m: int, n: int, k: int) -> None:
        w, op, dtype = self.b.world, "allgather_matmul", torch.bfloat16
        shape = {"M": m, "N": n, "K": k}
        shard = torch.randn(m // w, k, device="cuda").to(dtype)
        bmat = (torch.randn(k, n // w, device="cuda") / k ** 0.5).to(dtype)
        heap = self.b.heap
        a_full = heap.empty((m, k), dtype)
        out = torch.empty(m, n // w, device="cuda", dtype=dtype)
        gathered = torch.empty(m, k, device="cuda", dtype=dtype)
        self.b.record(op, "ironlink_fused", shape, "bf16",
                      lambda: ironlink.all_gather_matmul(shard, bmat, heap=heap, a_full=a_full, out=out), a_full.nbytes,
                      method=tuning.sp_method("all_gather_matmul", m, w))
        for method in tuning.SP_METHOD_NAMES:
            self.b.record(op, f"ironlink_fused[{method}]", shape, "bf16",
                          lambda: ironlink.all_gather_matmul(shard, bmat, heap=heap, a_full=a_full, out=out,
                                                             method=method), a_full.nbytes)
        for name, gather in (("min_chunks=4", tuning.GatherExchange(min_chunks=4)),
                             ("sm_push", tuning.GatherExchange(copy_engine=False))):  # sm_push: the CTAs push the shard
            def gather_call(exchange: tuning.GatherExchange = gather) -> Any:
                return ironlink.all_gather_matmul(shard, bmat, heap=heap, a_full=a_full, out=out, method="kernel",
                                                  exchange=exchange)

            self.b.record(op, f"ironlink_fused[kernel,{name}]", shape, "bf16", gather_call, a_full.nbytes)
        self.b.record(op, "nccl_torch", shape, "bf16",
                      lambda: (dist.all_gather_into_tensor(gathered, shard), torch.matmul(gathered, bmat, out=out)),
                      a_full.nbytes)
        symm = self.symm_mem.empty(m // w, k, dtype=dtype, device="cuda")
        symm.copy_(shard)
        self.symm_mem.rendezvous(symm, self.group)
        self.torch_fused(op, shape, lambda: torch.ops.symm_mem.fused_all_gather_matmul(symm, [bmat], 0, self.group),
                         a_full.nbytes)
        self.b.flush()
        heap.free(a_full)

    def matmul_scatter(self, m: int, n: int, k: int) -> None:
        w, op, dtype = self.b.world, "matmul_reducescatter", torch.bfloat16
        shape = {"M": m, "N": n, "K": k}
        a = torch.randn(m, k // w, device="cuda").to(dtype)
        bmat = (torch.randn(k // w, n, device="cuda") / k ** 0.5).to(dtype)
        out = torch.empty(m // w, n, device="cuda", dtype=dtype)
        full = torch.empty(m, n, device="cuda", dtype=dtype)
        nbytes = full.nbytes
        self.b.record(op, "ironlink_fused", shape, "bf16",
                      lambda: ironlink.matmul_reduce_scatter(a, bmat, heap=self.b.heap, out=out), nbytes,
                      method=tuning.sp_method("matmul_reduce_scatter", m, w))
        for method in tuning.SP_METHOD_NAMES:
            self.b.record(op, f"ironlink_fused[{method}]", shape, "bf16",
                          lambda: ironlink.matmul_reduce_scatter(a, bmat, heap=self.b.heap, out=out, method=method),
                          nbytes)
        exchanges = [("copy_engine", tuning.ScatterExchange(copy_engine_min_rows=0)),  # who moves the partials
                     ("sm_push", tuning.ScatterExchange(copy_engine_min_rows=None)),  # at any M
                     *((f"copy_engine,min_chunks={least}", tuning.ScatterExchange(copy_engine_min_rows=0,
                                                                                   min_chunks=least))
                       for least in (1, 4))]  # the copy engine's chunks a block
        if w == 2:  # the pushing kernel's signals per tile, not in batches (tuning.MATMUL_SIGNAL_EVERY)
            exchanges.append(("sm_push,signal_every=1", tuning.ScatterExchange(copy_engine_min_rows=None,
                                                                                 signal_every=1)))
        for name, scatter in exchanges:
            def scatter_call(exchange: tuning.ScatterExchange = scatter) -> Any:
                return ironlink.matmul_reduce_scatter(a, bmat, heap=self.b.heap, out=out, method="kernel",
                                                      exchange=exchange)

            self.b.record(op, f"ironlink_fused[kernel,{name}]", shape, "bf16", scatter_call, nbytes)
        self.b.record(op, "nccl_torch", shape, "bf16",
                      lambda: (torch.matmul(a, bmat, out=full), dist.reduce_scatter_tensor(out, full)), nbytes)
        self.torch_fused(op, shape,
                         lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, bmat, "sum", 0, self.group), nbytes)
        self.b.flush()


def parse_configs(text: Optional[str]) -> list[tuning.MatmulConfig]:
    """"128,256,64,8,8,3;64,128,64,8,4,4" -> extra matmul configs to measure."""
    if not text:
        return []
    return [tuning.MatmulConfig(*map(int, c.split(","))) for c in text.split(";")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="JSON file to write (rank 0)")
    ap.add_argument("--ops", default="allreduce_rmsnorm,matmul_allreduce,allgather_matmul,matmul_reducescatter")
    ap.add_argument("--sp-ms", default=",".join(map(str, SP_MS)), help="M of the sequence-parallel ops")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k-total", type=int, default=8192, help="K before the split over ranks")
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="the heap's wait timeout")
    ap.add_argument("--contenders", default="", help="a regular expression: time only the contenders it finds")
    ap.add_argument("--check-each", action="store_true",
                    help="check the heap after each contender's warm-up and capture (which one failed)")
    ap.add_argument("--matmul-configs", default=None, help="extra configs: 'BM,BN,BK,GROUP_M,warps,stages;...'")
    args = ap.parse_args()
    ironlink.init_distributed()
    b = FusedBench(4 << 30, args.timeout_s, args.check_each, args.contenders)  # the sequence-parallel ops' workspaces at M = 16384: ~2 GiB
    ops = args.ops.split(",")
    if "allreduce_rmsnorm" in ops:
        for t in map(int, args.tokens.split(",")):
            b.rmsnorm(t, args.hidden, torch.bfloat16)
    if "matmul_allreduce" in ops:
        for m in map(int, args.ms.split(",")):
            b.matmul(m, args.n, args.k_total // b.world, torch.bfloat16, parse_configs(args.matmul_configs))
    if "allgather_matmul" in ops or "matmul_reducescatter" in ops:
        sp = SequenceParallelBench(b)
        for m in map(int, args.sp_ms.split(",")):
            if "allgather_matmul" in ops:
                sp.gather_matmul(m, args.n, args.k_total)
            if "matmul_reducescatter" in ops:
                sp.matmul_scatter(m, args.n, args.k_total)
    write_results(args.out, b.world, b.rows, sms=b.sms)  # sms: the tuning's choices are a function of it
    b.heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
