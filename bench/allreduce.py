"""Side-by-side benchmark of the collectives: ironlink vs NCCL (torch.distributed) vs torch symm_mem,
same GPUs, same run:

    torchrun --nproc_per_node=8 bench/allreduce.py --out bench/results/allreduce-8xh200.json   (bench/run.sh)

Each point: `ITERS` calls captured in one CUDA graph, the graph replayed `REPS` times, each replay
timed with device events; the point is the median replay / ITERS, the maximum over ranks
(ironlink_bench's timer). The contenders of one size and dtype (all_reduce's; all_gather's and
reduce_scatter's together) are replayed in turns (`GraphRound`), so clock drift over the run falls
on each alike. Reported as us, algbw and busbw (nccl-tests conventions: all_reduce busbw = algbw *
2(n-1)/n, all_gather and reduce_scatter busbw = algbw * (n-1)/n) and the ratio to NCCL (NCCL time
/ ours). A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import ironlink
import ironlink.language as il
from ironlink import _native
from ironlink.language import _abi
from ironlink.runtime import tuning
from ironlink.runtime.heap import DEFAULT_SCRATCH_BYTES
from ironlink.runtime.tuning import FORCED_LIMITS, decode_table
from ironlink_bench import SIZES, GraphRound, write_results

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# The public op is also timed without programmatic dependent launch up to this size (contender
# "ironlink_op[no_pdl]"), where the launch is a large part of a call.
OP_NO_PDL_MAX_BYTES = 1 << 16
# Up to this size the public op is also timed with the other choice of its lamport-slot path
# (the decode table's all_reduce path, `decode_table.table_for`): contender "ironlink_op[lamport]" or
# "ironlink_op[library]" (the device library's all-reduce).
OP_LAMPORT_MAX_BYTES = 256 << 10
# Up to this size the public op is also timed on a plain CUDA tensor (contender
# "ironlink_op[any_tensor]", issue 63): the lamport path takes it where it is, the device library's
# all-reduce stages it through a heap workspace (two copies, `runtime.staging`).
OP_ANY_TENSOR_MAX_BYTES = 16 << 20
# ironlink launch configurations tried at each size: (CTAs, num_warps).
CONFIGS = [(8, 4), (32, 4), (64, 8), (132, 8), (132, 16)]
# The sizes at which each all-reduce algorithm is worth measuring (each is forced through the
# context's limits, `tuning.FORCED_LIMITS`) ...
ALGORITHMS: dict[str, Callable[[int], bool]] = {
    "one_shot_ll": lambda n: n <= (1 << 20),
    "two_shot_ll": lambda n: (16 << 10) <= n <= (16 << 20),
    "two_shot": lambda n: n >= (64 << 10),
}
# ... and all_gather / reduce_scatter over LL packets or over the buffers (size of the whole buffer).
GATHER_ALGORITHMS: dict[str, Callable[[int], bool]] = {"ll": lambda n: n <= (4 << 20), "bulk": lambda n: True}


@ironlink.jit
@triton.jit
def _all_reduce(ctx, buf, n, dt, status):
    tl.store(status + tl.program_id(0), il.symm_all_reduce(ctx, buf, 0, n, 0, dt))


@triton.jit
def _empty(status):
    # The launch floor: what a graph replay of a kernel that does no communication costs.
    tl.store(status + tl.program_id(0), 0)


@ironlink.jit
@triton.jit
def _all_gather(ctx, inp, out, n, dt, status):
    tl.store(status + tl.program_id(0), il.symm_all_gather(ctx, inp, out, n, dt))


@ironlink.jit
@triton.jit
def _reduce_scatter(ctx, inp, out, n, dt, status):
    tl.store(status + tl.program_id(0), il.symm_reduce_scatter(ctx, inp, out, n, 0, dt))


class Bench:
    def __init__(self, max_bytes: int, scratch_bytes: int, lamport_grids: tuple[tuple[int, int], ...] = ()) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # (bytes a CTA, warps) of the public op's lamport path to time beside the tuned one.
        self.lamport_grids = lamport_grids
        self.group_name = dist.group.WORLD.group_name
        self.max_bytes = max_bytes
        self.heap = ironlink.SymmetricHeap(3 * max_bytes + (64 << 20), scratch_bytes=scratch_bytes)
        self.default_limits = self.heap.algorithm_limits  # the tuned ones, restored for the public op
        self.status = torch.zeros(256, dtype=torch.int32, device="cuda")
        self.rows: list[dict[str, Any]] = []

    def algorithm(self, limits: tuple[int, int], ctas: int, nbytes: int) -> str:
        """The all-reduce algorithm the device picks under `limits` (the device's own rule)."""
        return str(_native.all_reduce_algorithm(self.world, self.heap.scratch_bytes, *limits, ctas, nbytes))

    def record(self, coll: str, dt: str, nbytes: int, who: str, config: str, us: float) -> dict[str, Any]:
        algbw = nbytes / us / 1e3  # GB/s
        factor = 2 * (self.world - 1) / self.world if coll == "all_reduce" else (self.world - 1) / self.world
        row = {"collective": coll, "dtype": dt, "bytes": nbytes, "contender": who, "config": config,
               "us": round(us, 3), "algbw_GBs": round(algbw, 2), "busbw_GBs": round(algbw * factor, 2)}
        self.rows.append(row)
        return row

    def check(self, status: torch.Tensor) -> None:
        torch.cuda.synchronize()
        bad = status[status != 0]
        if bad.numel():
            raise RuntimeError(f"ironlink returned statuses {bad.unique().tolist()}")

    def with_limits(self, limits: tuple[int, int, int]) -> Callable[[], None]:
        """A GraphRound `before` that sets the heap's algorithm limits to `limits`: the device reads
        them from the context at each replay, and the contenders of a round force different ones."""
        return lambda: self.heap.set_algorithm_limits(*limits)

    def all_reduce(self, dt: str, nbytes: int) -> None:
        """Every contender of this size and dtype in one GraphRound; the rows after it."""
        dtype = DTYPES[dt]
        n = nbytes // torch.tensor([], dtype=dtype).element_size()
        x = torch.randn(n, device="cuda").to(dtype)
        code = _abi.DTYPE["BFLOAT16" if dtype == torch.bfloat16 else "FLOAT32"]
        timer = GraphRound()
        # Contender -> (config, its index in the round; None: the best grid config, known after it).
        added: dict[str, tuple[str, Optional[int]]] = {}
        t = x.clone()
        added["nccl"] = ("ring/auto", timer.add(lambda: dist.all_reduce(t), nbytes))
        if nbytes == SIZES[0]:
            added["empty_kernel"] = ("8x4", timer.add(lambda: _empty[(8,)](self.status, num_warps=4), nbytes))
        buf = self.heap.empty((n,), dtype)
        buf.copy_(x)
        # A row of statuses per grid config: replayed in turns, each keeps its own last call's.
        status = torch.zeros(len(ALGORITHMS) * len(CONFIGS), *self.status.shape, dtype=self.status.dtype,
                             device="cuda")
        grids: list[tuple[str, str, int]] = []  # (algorithm, grid config, index in the round)
        for alg, worth in ALGORITHMS.items():
            if not worth(nbytes):
                continue
            limits = FORCED_LIMITS[alg]
            for ctas, warps in CONFIGS:
                if self.algorithm(limits[:2], ctas, nbytes) != alg:
                    continue  # its packets do not fit this grid's scratch

                # Defaults bind this config: the round keeps the function until `run`. A def, not a
                # lambda: mypy cannot type a lambda with defaults (python/mypy#15459).
                def launch(ctas: int = ctas, warps: int = warps, st: torch.Tensor = status[len(grids)]) -> None:
                    _all_reduce[(ctas,)](self.heap.ctx, buf, n, code, st, num_warps=warps)

                i = timer.add(launch, nbytes, before=self.with_limits(limits))
                grids.append((alg, f"{ctas}x{warps}", i))
        added["ironlink"] = ("", None)
        # What a user's call gets: the public op, its own launch and algorithm choice (the tuned
        # limits), with programmatic dependent launch where the GPU has it (the default) and, for
        # small messages, without it.
        tuned = self.with_limits(self.default_limits)
        added["ironlink_op"] = ("", timer.add(lambda: ironlink.all_reduce(buf, heap=self.heap), nbytes, before=tuned))
        if nbytes <= OP_NO_PDL_MAX_BYTES:
            added["ironlink_op[no_pdl]"] = ("", timer.add(lambda: ironlink.all_reduce(buf, heap=self.heap, pdl=False),
                                                          nbytes, before=tuned))
        if nbytes <= OP_ANY_TENSOR_MAX_BYTES:
            plain = x.clone()  # not the heap's
            added["ironlink_op[any_tensor]"] = ("", timer.add(lambda: ironlink.all_reduce(plain, heap=self.heap), nbytes,
                                                              before=tuned))
        if nbytes <= OP_LAMPORT_MAX_BYTES:
            added.update(self.op_other_path(timer, buf, nbytes, tuned))
        if tuning.all_reduce_takes_lamport(nbytes, self.world):
            added.update(self.op_lamport_grids(timer, buf, nbytes, tuned))
        if nbytes <= (256 << 20):
            import torch.distributed._symmetric_memory as symm_mem

            s = symm_mem.empty(n, dtype=dtype, device="cuda")
            symm_mem.rendezvous(s, self.group_name)
            s.copy_(x)
            if nbytes <= (16 << 20):
                added["symm_one_shot"] = ("", timer.add(
                    lambda: torch.ops.symm_mem.one_shot_all_reduce(s, "sum", self.group_name), nbytes))
            added["symm_two_shot"] = ("", timer.add(
                lambda: torch.ops.symm_mem.two_shot_all_reduce_(s, "sum", self.group_name), nbytes))
        us = timer.run()
        self.heap.set_algorithm_limits(*self.default_limits)  # the last replay's forced ones otherwise
        self.check(status)
        self.heap.check()
        self.heap.free(buf)
        best: Optional[tuple[str, float, str]] = None
        for alg, cfg, i in grids:
            row = self.record("all_reduce", dt, nbytes, "ironlink_cfg", cfg, us[i])
            row["algorithm"] = alg
            if best is None or us[i] < best[1]:
                best = (cfg, us[i], alg)
        assert best is not None
        times = {who: best[:2] if i is None else (cfg, us[i]) for who, (cfg, i) in added.items()}
        for who, (cfg, us_who) in times.items():
            row = self.record("all_reduce", dt, nbytes, who, cfg, us_who)
            row["vs_nccl"] = round(times["nccl"][1] / us_who, 3)
            if who == "ironlink":
                row["algorithm"] = best[2]

    def op_other_path(self, timer: "GraphRound", buf: torch.Tensor, nbytes: int,
                      tuned: Callable[[], None]) -> dict[str, tuple[str, Optional[int]]]:
        """The public op captured with the other choice of its lamport-slot path than the decode
        table's for this size: the choice is made at capture, so a table with the other path is
        substituted around it alone."""
        world = dist.get_world_size()
        chosen = tuning.all_reduce_takes_lamport(nbytes, world)
        flipped = decode_table.table_for(world)._replace(all_reduce=((nbytes, "library" if chosen else "lamport"),))
        with decode_table.substituted(world, flipped):
            i = timer.add(lambda: ironlink.all_reduce(buf, heap=self.heap), nbytes, before=tuned)
        return {f"ironlink_op[{'library' if chosen else 'lamport'}]": ("", i)}

    def op_lamport_grids(self, timer: "GraphRound", buf: torch.Tensor, nbytes: int,
                         tuned: Callable[[], None]) -> dict[str, tuple[str, Optional[int]]]:
        """The public op's lamport path captured with each of `lamport_grids` (bytes a CTA, warps)
        instead of the tuning's: contenders "ironlink_op[lamport BYTESxWARPS]"."""
        added: dict[str, tuple[str, Optional[int]]] = {}
        for cta_bytes, warps in self.lamport_grids:
            grid = tuning.AllReduceConfig(lamport_cta_bytes=cta_bytes, lamport_warps=warps)
            i = timer.add(lambda grid=grid: ironlink.all_reduce(buf, heap=self.heap, config=grid), nbytes, before=tuned)
            added[f"ironlink_op[lamport {cta_bytes}x{warps}]"] = ("", i)
        return added

    def gather_scatter(self, dt: str, nbytes: int) -> None:
        """all_gather and reduce_scatter of `nbytes` total output / input per rank, every contender
        of both in one GraphRound; the rows after it."""
        dtype = DTYPES[dt]
        esize = torch.tensor([], dtype=dtype).element_size()
        n = nbytes // esize // self.world  # per-rank block
        if n == 0:
            return
        code = _abi.DTYPE["BFLOAT16" if dtype == torch.bfloat16 else "FLOAT32"]
        full = torch.randn(n * self.world, device="cuda").to(dtype)
        part = full[:n].clone()
        out = torch.empty_like(full)
        timer = GraphRound()
        i_ag = timer.add(lambda: dist.all_gather_into_tensor(out, part), nbytes)
        red = torch.empty_like(part)
        i_rs = timer.add(lambda: dist.reduce_scatter_tensor(red, full), nbytes)
        big = self.heap.empty((n * self.world,), dtype)
        small = self.heap.empty((n,), dtype)
        big.copy_(full)
        small.copy_(part)
        # Rows of statuses, two per grid config: replayed in turns, each keeps its own last call's.
        status = torch.zeros(2 * len(GATHER_ALGORITHMS) * len(CONFIGS), *self.status.shape, dtype=self.status.dtype,
                             device="cuda")
        # (algorithm, grid config, all_gather's index in the round, reduce_scatter's)
        grids: list[tuple[str, str, int, int]] = []
        for alg, worth in GATHER_ALGORITHMS.items():
            if not worth(nbytes):
                continue
            limits = FORCED_LIMITS["gather_" + alg]
            gather_max = limits[2]
            for ctas, warps in CONFIGS:
                got = _native.gather_algorithm(self.world, self.heap.scratch_bytes, gather_max, ctas, nbytes, n * esize)
                if got != alg:
                    continue  # its packets do not fit this grid's scratch

                # Defaults bind this config: the round keeps the functions until `run`. Defs, not
                # lambdas: mypy cannot type a lambda with defaults (python/mypy#15459).
                def gather(ctas: int = ctas, warps: int = warps, st: torch.Tensor = status[2 * len(grids)]) -> None:
                    _all_gather[(ctas,)](self.heap.ctx, small, big, n, code, st, num_warps=warps)

                ag = timer.add(gather, nbytes, before=self.with_limits(limits))

                def scatter(ctas: int = ctas, warps: int = warps,
                            st: torch.Tensor = status[2 * len(grids) + 1]) -> None:
                    _reduce_scatter[(ctas,)](self.heap.ctx, big, small, n, code, st, num_warps=warps)

                rs = timer.add(scatter, nbytes, before=self.with_limits(limits))
                grids.append((alg, f"{ctas}x{warps}", ag, rs))
        us = timer.run()
        self.heap.set_algorithm_limits(*self.default_limits)  # the last replay's forced ones otherwise
        self.check(status)
        self.heap.free(small)
        self.heap.free(big)
        best_ag: Optional[tuple[float, str, str]] = None
        best_rs: Optional[tuple[float, str, str]] = None
        for alg, cfg, ag, rs in grids:
            best_ag = (us[ag], cfg, alg) if best_ag is None or us[ag] < best_ag[0] else best_ag
            best_rs = (us[rs], cfg, alg) if best_rs is None or us[rs] < best_rs[0] else best_rs
        assert best_ag is not None and best_rs is not None
        for coll, nccl, ours in (("all_gather", us[i_ag], best_ag), ("reduce_scatter", us[i_rs], best_rs)):
            self.record(coll, dt, nbytes, "nccl", "", nccl)["vs_nccl"] = 1.0
            row = self.record(coll, dt, nbytes, "ironlink", ours[1], ours[0])
            row["vs_nccl"] = round(nccl / ours[0], 3)
            row["algorithm"] = ours[2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="JSON file to write (rank 0)")
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    ap.add_argument("--min-bytes", type=int, default=0)
    ap.add_argument("--sizes", default=None,
                    help="comma-separated message sizes in bytes instead of the standard list (A/B runs)")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--skip-gather-scatter", action="store_true")
    ap.add_argument("--scratch-mib", type=int, default=DEFAULT_SCRATCH_BYTES >> 20, help="scratch region per rank")
    ap.add_argument("--lamport-grids", default="",
                    help="comma-separated BYTESxWARPS (bytes a CTA, warps) of the op's lamport path to time "
                         "beside the tuned grid, e.g. 1024x2,4096x8")
    args = ap.parse_args()
    ironlink.init_distributed()
    grids = tuple((int(g.split("x")[0]), int(g.split("x")[1])) for g in args.lamport_grids.split(",") if g)
    b = Bench(args.max_bytes, args.scratch_mib << 20, grids)
    listed = [int(s) for s in args.sizes.split(",")] if args.sizes else SIZES
    sizes = [s for s in listed if args.min_bytes <= s <= args.max_bytes]
    for dt in args.dtypes.split(","):
        for nbytes in sizes:
            b.all_reduce(dt, nbytes)
            if not args.skip_gather_scatter:
                b.gather_scatter(dt, nbytes)
            if b.rank == 0:
                for r in b.rows:
                    if r["bytes"] == nbytes and r["dtype"] == dt and r["contender"] != "ironlink_cfg":
                        print(f"{r['collective']:>14} {dt} {nbytes:>11} {r['contender']:>14} {r['config']:>6} "
                              f"{r['us']:>10.2f} us {r['busbw_GBs']:>8.1f} GB/s  x{r.get('vs_nccl', 0):.2f}", flush=True)
    write_results(args.out, b.world, b.rows, scratch_bytes=b.heap.scratch_bytes)
    b.heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
