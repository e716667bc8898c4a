"""Soak: a seeded random sequence of ironlink collectives for a set time, each checked.

    torchrun --standalone --nproc_per_node=4 tests/gpu/workers/soak.py --minutes 5 --seed 20
    tests/gpu/run.sh soak --minutes 5 --seed 20       # the largest world; --soak-nodes adds --nodes

Every rank draws the same sequence from the seed: batches of 1 to 8 calls launched back to back
(no host sync between them) on one of three heaps, each call one of the host-level ops
(ironlink.all_reduce / all_gather / reduce_scatter in and out of place / all_to_all_v with random
counts) or a device collective launched with a random grid (1 to 132 CTAs) and num_warps (1 to 16)
(all_reduce, broadcast and reduce from a random root, all_to_all); sizes from 1 element to 2 Mi,
fp32 / fp16 / bf16, every reduce op. Inputs are small integers, so every result is exact in every
dtype and is compared bitwise with a float64 reference built from all ranks' inputs (NCCL
all_gather); outputs are poisoned with NaN first. After each batch: the device statuses and
`heap.check()`. Rank 0 prints `soak: N calls in M min, seed S, K mismatches` and writes a JSON
summary ($OUT/soak.json unless --json); the exit status is non-zero on any mismatch or error.

--nodes adds a fourth heap where torch has NVSHMEM: `backend="nvshmem"` as simulated nodes of
world // 2 ranks, on which the batches run the host-level ops only (their hierarchical versions;
compiled at their first launch, so the first such batches are slow).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import sys
import time
from typing import Any, Callable

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the CPU machines have no torch
    torch = None  # type: ignore[assignment]

OPS = ("SUM", "MAX", "MIN", "PROD", "AVG")
HEAP_BYTES = (160 << 20, 96 << 20, 64 << 20)  # three heaps: calls alternate between them
NODES_HEAP_BYTES = 96 << 20  # --nodes: the heap of simulated nodes
# --nodes: the nodes heap's wait timeout at least this: its kernels link NVSHMEM and compile at
# their first launch (7 to 11 s each), in every rank at once, throughout the run (each new variant
# the sequence draws); with ironlink's default 5 s the first run at world 4 timed out on one GPU.
NODES_TIMEOUT_S = 30.0
MAX_ELEMENTS = 2 << 20  # per call: at most 16 MiB of heap (all_to_all's input and output in fp32)
CALL_HEAP_BYTES = 20 << 20  # a batch adds calls while the heap has this much free (it starts empty)
GRIDS = (1, 2, 3, 7, 16, 32, 64, 100, 132)
WARPS = (1, 2, 4, 8, 16)
DEVICE_KINDS = ("dev_all_reduce", "dev_broadcast", "dev_reduce", "dev_all_to_all")
STUCK_S = 90  # seconds without a finished batch before the stacks are printed
HOST_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all_v")


def raw(t: Any) -> Any:
    """The tensor as bytes: the device collectives take an address and a dtype code, so one
    compiled kernel (per num_warps) serves every dtype (Triton specializes on pointer types)."""
    return t.view(torch.uint8)


# --- compiling ahead --------------------------------------------------------------------------
# Each kernel variant is a multi-second compile (the ironlink bitcode is linked and optimized in),
# and the soak can launch dozens: compiled lazily, one rank at a time, they outlasted 8-minute
# runs at world 2 before the first batch ended. So the variants known ahead are compiled first,
# split over the ranks and over processes on each, into the shared Triton cache.


def compile_specs(world: int) -> list[tuple[str, str, int]]:
    """(kernel, dtype, num_warps) the soak launches: the device collectives at every num_warps
    (byte pointers), the host ops' kernels at each dtype and each num_warps their tuning picks at
    this world size."""
    from ironlink.runtime import tuning

    specs = [(kind, "uint8", w) for kind in DEVICE_KINDS for w in WARPS]
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        warps = sorted({tuning.choose(kind, 1 << b, world)[1] for b in range(2, 28)})
        specs += [(kind, d, w) for d in ("float32", "float16", "bfloat16") for w in warps]
    a2a_warps = tuning.all_to_all_v_launch()[1]
    specs += [("all_to_all_v", d, a2a_warps) for d in ("float32", "float16", "bfloat16")]
    return specs


def compile_one(spec: tuple[str, str, int]) -> str:
    """Compiles one variant into the Triton cache (a worker process: no GPU work). '' or why not."""
    import collectives_worker as k
    from ironlink.ops import collectives as ops
    from ironlink.ops import variable_all_to_all
    from ironlink.runtime.pdl import choose_pdl, pdl_launch_options

    kind, dtype, warps = spec
    d, i32, i64 = getattr(torch, dtype), torch.int32, torch.int64
    launch = {"grid": (1,), "num_warps": warps}
    ctx = 1 << 40  # a context address is 64-bit: Triton types an unspecialized int by its value
    kernels: dict[str, Callable[[], Any]] = {
        "dev_all_reduce": lambda: k.all_reduce_k.warmup(ctx, d, 0, 0, 0, 0, i32, **launch),
        "dev_broadcast": lambda: k.broadcast_k.warmup(ctx, d, 0, 0, 0, i32, **launch),
        "dev_reduce": lambda: k.reduce_k.warmup(ctx, d, d, 0, 0, 0, 0, i32, **launch),
        "dev_all_to_all": lambda: k.all_to_all_k.warmup(ctx, d, d, 0, 0, i32, **launch),
        # The variant ironlink.all_reduce launches here (with or without PDL: ironlink.runtime.pdl).
        "all_reduce": lambda: ops._all_reduce_kernel.warmup(ctx, d, 0, 0, i32, **launch, **pdl_launch_options(
            choose_pdl(None, torch.cuda.get_device_capability()[0], "all_reduce"))),
        "all_gather": lambda: ops._all_gather_kernel.warmup(ctx, d, d, 0, i32, **launch),
        "reduce_scatter": lambda: ops._reduce_scatter_kernel.warmup(ctx, d, d, 0, 0, i32, **launch),
        "all_to_all_v": lambda: variable_all_to_all._all_to_all_v_kernel.warmup(ctx, d, 0, i64, d, 0, i64, i64, 0, i32,
                                                                                **launch),
    }
    try:
        kernels[kind]()
        return ""
    except Exception as e:  # noqa: BLE001 - compiling ahead only saves time; the launch compiles it anyway
        return f"{spec}: {type(e).__name__}: {e}"


def compile_ahead(rank: int, world: int) -> tuple[int, float, list[str]]:
    """This rank's share of compile_specs, over worker processes: (variants, seconds, failures)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    mine = compile_specs(world)[rank::world]
    workers = max(1, min(8, (os.cpu_count() or 2) // (2 * world), len(mine)))
    t0 = time.time()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        failures = [f for f in pool.map(compile_one, mine) if f]
    return len(mine), time.time() - t0, failures


def skip_reason() -> str | None:
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no GPU"
    if "RANK" not in os.environ:
        return "not under torchrun (RANK unset)"
    return None


class Soak:
    def __init__(self, heaps: list[Any], seed: int) -> None:
        import collectives_worker  # beside this file: its Triton kernels of the device collectives
        import ironlink
        from ironlink.language import _abi
        from ironlink.runtime.distributed import grid_cap

        self.il, self.abi, self.k = ironlink, _abi, collectives_worker
        self.grid_cap = grid_cap(torch.cuda.current_device())
        self.heaps, self.seed = heaps, seed
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.rng = random.Random(seed)  # the same choices on every rank
        self.gen = torch.Generator(device="cuda").manual_seed(seed * 1009 + self.rank)  # this rank's data
        self.calls = 0
        self.by_kind: dict[str, int] = {}
        self.mismatches: list[str] = []
        self.dtypes = (torch.float32, torch.float16, torch.bfloat16)

    # --- data and references ------------------------------------------------------------------
    def ints(self, n: int, dtype: Any, op: str = "SUM") -> Any:
        """Small integers: sums, products and averages over <= 8 ranks stay exact in bf16."""
        if op == "PROD":
            v = torch.randint(1, 3, (n,), device="cuda", generator=self.gen) * (
                torch.randint(0, 2, (n,), device="cuda", generator=self.gen) * 2 - 1)
        else:
            v = torch.randint(-4, 5, (n,), device="cuda", generator=self.gen) * self.world
        return v.to(dtype)

    def gather64(self, x: Any) -> list[Any]:
        y = x.to(torch.float64)
        out = [torch.empty_like(y) for _ in range(self.world)]
        dist.all_gather(out, y)
        return out

    @staticmethod
    def reduce64(xs: list[Any], op: str) -> Any:
        st = torch.stack(xs)
        return {"SUM": lambda: st.sum(0), "AVG": lambda: st.mean(0), "PROD": lambda: st.prod(0),
                "MAX": lambda: st.max(0).values, "MIN": lambda: st.min(0).values}[op]()

    # --- one call: allocate, launch (no sync), return a check to run after the batch ----------
    def call(self, heap: Any, status: Any) -> tuple[str, Callable[[], None], list[Any]]:
        rng, w, r = self.rng, self.world, self.rank
        # A heap of several nodes: the host ops only (the device kernels here are one-node ones).
        kind = rng.choice(HOST_KINDS if heap.multi_node else HOST_KINDS + DEVICE_KINDS)
        dtype = rng.choice(self.dtypes)
        n = max(1, int(2 ** rng.uniform(0, 22)) // (w if kind in ("all_gather", "reduce_scatter", "dev_all_to_all") else 1))
        n = min(n, MAX_ELEMENTS // w)
        op = rng.choice(OPS)
        grid, warps, root, in_place = rng.choice(GRIDS), rng.choice(WARPS), rng.randrange(w), rng.random() < 0.5
        grid = min(grid, self.grid_cap)  # ranks sharing a GPU: every rank's CTAs resident at once
        label = f"{kind}{'@nodes' if heap.multi_node else ''} {str(dtype)[6:]} n={n}"  # counted apart
        il, abi = self.il, self.abi
        dt = self.k.DT[dtype]
        bufs: list[Any] = []

        def alloc(m: int, d: Any = dtype) -> Any:
            bufs.append(heap.empty((m,), d))
            return bufs[-1]

        if kind in ("all_reduce", "dev_all_reduce"):
            buf = alloc(n)
            x = self.ints(n, dtype, op)
            buf.copy_(x)
            want = self.reduce64(self.gather64(x), op)
            if kind == "all_reduce":
                il.all_reduce(buf, op=op.lower(), heap=heap)
            else:
                self.k.all_reduce_k[(grid,)](heap.ctx, raw(buf), 0, n, abi.REDUCE_OP[op], dt, status, num_warps=warps)
                label += f" grid={grid} warps={warps}"
            return f"{label} {op}", lambda: self.same(buf, want), bufs
        if kind == "all_gather":
            out = alloc(w * n)
            out.fill_(float("nan"))
            inp = out[r * n:(r + 1) * n] if in_place else alloc(n)
            x = self.ints(n, dtype)
            inp.copy_(x)
            want = torch.cat(self.gather64(x))
            il.all_gather(out, inp, heap=heap)
            return f"{label} in_place={in_place}", lambda: self.same(out, want), bufs
        if kind == "reduce_scatter":
            inp = alloc(w * n)
            x = self.ints(w * n, dtype, op)
            inp.copy_(x)
            out = inp[r * n:(r + 1) * n] if in_place else alloc(n)
            if not in_place:
                out.fill_(float("nan"))
            want = self.reduce64(self.gather64(x), op)[r * n:(r + 1) * n]
            il.reduce_scatter(out, inp, op=op.lower(), heap=heap)
            return f"{label} {op} in_place={in_place}", lambda: self.same(out, want), bufs
        if kind == "all_to_all_v":
            return self.all_to_all_v(heap, dtype, label, alloc, bufs)
        label += f" grid={grid} warps={warps}"
        if kind == "dev_broadcast":
            buf = alloc(n)
            x = self.ints(n, dtype)
            buf.copy_(x)
            want = self.gather64(x)[root]
            self.k.broadcast_k[(grid,)](heap.ctx, raw(buf), n, dt, root, status, num_warps=warps)
            return f"{label} root={root}", lambda: self.same(buf, want), bufs
        if kind == "dev_reduce":
            inp, out = alloc(n), alloc(n)
            x = self.ints(n, dtype, op)
            inp.copy_(x)
            out.fill_(float("nan"))
            allx = self.gather64(x)  # on every rank: a collective (only the root's result is checked)
            want = self.reduce64(allx, op) if r == root else torch.full((n,), float("nan"), device="cuda")
            self.k.reduce_k[(grid,)](heap.ctx, raw(inp), raw(out), n, abi.REDUCE_OP[op], dt, root, status, num_warps=warps)
            return f"{label} {op} root={root}", lambda: self.same(out, want), bufs
        inp, out = alloc(w * n), alloc(w * n)  # dev_all_to_all
        x = self.ints(w * n, dtype)
        inp.copy_(x)
        out.fill_(float("nan"))
        allx = self.gather64(x)
        want = torch.cat([allx[p][r * n:(r + 1) * n] for p in range(w)])
        self.k.all_to_all_k[(grid,)](heap.ctx, raw(inp), raw(out), n, dt, status, num_warps=warps)
        return label, lambda: self.same(out, want), bufs

    def all_to_all_v(self, heap: Any, dtype: Any, label: str, alloc: Callable[..., Any],
                     bufs: list[Any]) -> tuple[str, Callable[[], None], list[Any]]:
        w, r = self.world, self.rank
        row, most = self.rng.choice((1, 7, 64, 1000)), self.rng.choice((1, 5, 40))
        counts = torch.tensor([[self.rng.randint(0, most) for _ in range(w)] for _ in range(w)])  # [from, to]
        inp, out = alloc(w * most * row).view(w * most, row), alloc(w * most * row).view(w * most, row)
        send, rc, ro = alloc(w, torch.int64), alloc(w, torch.int64), alloc(w, torch.int64)
        send.copy_(counts[r])
        inp.copy_(self.ints(w * most * row, dtype).view(w * most, row))
        out.fill_(float("nan"))
        recv = counts[:, r]
        want = torch.empty(int(recv.sum()), row, device="cuda", dtype=dtype)
        sent = int(counts[r].sum())
        dist.all_to_all_single(want, inp[:sent].contiguous(), recv.tolist(), counts[r].tolist())
        self.il.all_to_all_v(inp, send, out, rc, ro, heap=heap)

        def check() -> None:
            assert rc.tolist() == recv.tolist(), f"receive counts {rc.tolist()} != {recv.tolist()}"
            assert ro.tolist() == (torch.cumsum(recv, 0) - recv).tolist(), "receive offsets"
            self.same(out[:want.shape[0]], want.to(torch.float64))

        return f"{label} row={row} counts={counts.tolist()}", check, bufs

    @staticmethod
    def same(got: Any, want: Any) -> None:
        g = got.to(torch.float64).reshape(-1)
        wv = want.to(torch.float64).reshape(-1)
        bad = ~((g == wv) | (torch.isnan(g) & torch.isnan(wv)))
        if bad.any():
            i = int(bad.nonzero()[0])
            raise AssertionError(f"{int(bad.sum())} elements differ, first at {i}: {g[i].item()} != {wv[i].item()}")

    # --- the loop ------------------------------------------------------------------------------
    def heap_name(self, heap: Any) -> str:
        """Which of the soak's heaps `heap` is, for messages."""
        return f"heap {self.heaps.index(heap)} of {heap.nbytes >> 20} MiB{' (nodes)' if heap.multi_node else ''}"

    def batch(self) -> None:
        heap = self.rng.choice(self.heaps)
        size = self.rng.randint(1, 8)
        status = torch.zeros(size, self.abi.MAX_CTAS, dtype=torch.int32, device="cuda")
        launched = []
        # The heap starts each batch empty (frees are newest first), so free_bytes is contiguous
        # and the same on every rank.
        while len(launched) < size and heap.free_bytes >= CALL_HEAP_BYTES:
            launched.append(self.call(heap, status[len(launched)]))
        torch.cuda.synchronize()
        try:
            heap.check()  # TIMEOUT or another recorded error ends the soak (the counters now disagree)
        except Exception as e:
            calls = "; ".join(label for label, _, _ in launched)
            raise RuntimeError(f"{type(e).__name__}: {e} [a batch of {len(launched)} on {self.heap_name(heap)}: "
                               f"{calls}]") from e
        bad = status.nonzero()
        if bad.numel():
            raise RuntimeError(f"device status {status[bad[0, 0], bad[0, 1]].item()} in {launched[int(bad[0, 0])][0]}")
        for label, check, bufs in launched:
            self.calls += 1
            kind = label.split()[0]
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
            try:
                check()
            except AssertionError as e:
                self.mismatches.append(f"call {self.calls} on rank {self.rank}: {label}: {e}")
        for _, _, bufs in reversed(launched):
            for b in reversed(bufs):
                heap.free(b)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=20)
    p.add_argument("--json", default=os.path.join(os.environ.get("OUT", "build/gpu-out"), "soak.json"))
    p.add_argument("--nodes", action="store_true", help="add a heap of simulated nodes over NVSHMEM (see above)")
    args = p.parse_args()
    if args.minutes <= 0:
        p.error(f"--minutes must be positive, got {args.minutes}")
    reason = skip_reason()
    if reason:
        print(f"soak: skipped: {reason}", flush=True)
        return 0
    import ironlink

    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    # A step that takes more than STUCK_S seconds prints every thread's Python stack (to the log),
    # again every STUCK_S seconds: a soak cut off by an outer limit says where it was.
    faulthandler.dump_traceback_later(STUCK_S, repeat=True)
    n, seconds, failures = compile_ahead(rank, world)
    for f in failures:
        print(f"soak: compiling ahead failed (compiled at launch instead): {f}", flush=True)
    dist.barrier()
    if rank == 0:
        print(f"soak: compiled {n} kernel variants ahead on rank 0 in {seconds:.0f} s", flush=True)
    # The workers' wait timeout (30 s on shared GPUs, where ranks compile on shared cores).
    from _cases import heap_timeout_s

    timeout_s = heap_timeout_s()
    heaps = [ironlink.SymmetricHeap(b, timeout_s=timeout_s) for b in HEAP_BYTES]
    node_size = None
    if args.nodes:
        import torch.distributed._symmetric_memory as symm_mem

        if world < 2 or not symm_mem.is_nvshmem_available():
            print("soak: --nodes skipped (needs 2 ranks and torch's NVSHMEM)", flush=True)
        else:
            node_size = world // 2
            heaps.append(ironlink.SymmetricHeap(NODES_HEAP_BYTES, backend="nvshmem", node_size=node_size,
                                                timeout_s=max(timeout_s, NODES_TIMEOUT_S)))
    soak = Soak(heaps, args.seed)
    t0, error = time.time(), ""
    go = torch.ones(1, device="cuda")
    shown = t0
    while True:
        if rank == 0 and time.time() - shown >= 30:
            # A run cut off by an outer limit still says how far it got (and whether it is
            # compiling: few calls, many seconds).
            shown = time.time()
            print(f"soak: progress: {soak.calls} calls after {shown - t0:.0f} s", flush=True)
        go.fill_(1.0 if time.time() - t0 < args.minutes * 60 else 0.0)
        dist.broadcast(go, 0)  # rank 0's clock decides, so every rank runs the same batches
        if not go.item():
            break
        try:
            started = time.time()
            soak.batch()
            faulthandler.dump_traceback_later(STUCK_S, repeat=True)  # re-armed: this step ended
            if rank == 0 and time.time() - started > 20:  # a variant not compiled ahead
                print(f"soak: a batch took {time.time() - started:.0f} s (after {soak.calls} calls)", flush=True)
        except Exception as e:  # noqa: BLE001 - reported in the summary; the heaps may be out of step now
            error = f"rank {rank} after {soak.calls} calls: {type(e).__name__}: {e}"
            print(error, flush=True)
            break
    faulthandler.cancel_dump_traceback_later()
    minutes = (time.time() - t0) / 60
    if error:  # the other ranks may be blocked in a heap call: do not close collectively
        print(f"soak: FAILED {error}", flush=True)
        os._exit(1)
    bad = torch.tensor([len(soak.mismatches)], device="cuda")
    dist.all_reduce(bad)
    for h in heaps:
        h.close()
    if rank == 0:
        total = int(bad.item())
        from datetime import datetime, timezone

        from ironlink_bench import git_rev

        summary = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "git_rev": git_rev(),
                   "seed": args.seed, "world": world, "minutes": round(minutes, 2), "calls": soak.calls,
                   "calls_by_kind": soak.by_kind, "mismatches": total, "first_mismatches_rank0": soak.mismatches[:20],
                   "heap_bytes": HEAP_BYTES, "nodes_heap_node_size": node_size,
                   "gpu": torch.cuda.get_device_name()}
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
        for m in soak.mismatches[:20]:
            print(f"MISMATCH {m}")
        print(f"soak: {soak.calls} calls in {minutes:.1f} min, seed {args.seed}, {total} mismatches "
              f"(world {world}; {args.json})", flush=True)
    else:
        for m in soak.mismatches[:5]:
            print(f"MISMATCH {m}")
    dist.destroy_process_group()
    return 1 if int(bad.item()) else 0


if __name__ == "__main__":
    sys.exit(main())
