"""Measures this node's decode paths and writes the decode table of its world size:

    torchrun --nproc_per_node=N -m ironlink.tune [--out PATH] [--hidden 8192] [--quick] [--dtype bf16]

ironlink.all_reduce at 1 KiB to 1 MiB with each path forced (a substituted table),
ironlink.all_reduce_rmsnorm at each token count with each mode that runs at the shape (`mode=`),
and ironlink.matmul_all_reduce at each token count ([tokens, hidden / N] x [hidden / N, hidden]: a
row-parallel projection's shard) with each method (`method=`); each size's candidates in CUDA
graphs, replayed in turns (`timing.GraphRound`: the max over ranks of each rank's median, so
every rank decides on the same numbers). Rank 0 writes the table
(`choose.choose_table`) with the timings behind it, by default where the ops look first
(`decode_table.tuning_dir()`), and prints a summary. One node: the one-shot paths are one node's.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from ..runtime.tuning import decode_table
from .choose import Timings, choose_table, size_text, summary

ALL_REDUCE_SIZES = tuple(1 << k for k in range(10, 21, 2))  # 1 KiB to 1 MiB by powers of 4
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
QUICK_TOKENS = (1, 8, 32, 128, 512, 2048)
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="torchrun --nproc_per_node=N -m ironlink.tune",
        description="Times ironlink.all_reduce's paths and all_reduce_rmsnorm's modes on this node's GPUs and "
                    "writes the decode table of world N, which the ops then read.")
    ap.add_argument("--out", default=None,
                    help=f"the JSON file to write (rank 0); default: decode-wN.json in ${decode_table.TUNING_DIR_ENV}, "
                         "else $XDG_CACHE_HOME/ironlink, else ~/.cache/ironlink, where the ops look first")
    ap.add_argument("--hidden", type=int, default=8192, help="all_reduce_rmsnorm's row length (default 8192)")
    ap.add_argument("--quick", action="store_true", help=f"all_reduce_rmsnorm at tokens {QUICK_TOKENS} only")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    return ap.parse_args(argv)


class Progress:
    """Rank 0's progress, "rmsnorm 5/12 tokens=16": one line rewritten in place on a terminal; a
    line a step where the output goes to a file or a pipe (a log has no carriage returns)."""

    def __init__(self, show: bool, in_place: Optional[bool] = None) -> None:
        self.show = show
        self.in_place = sys.stdout.isatty() if in_place is None else in_place

    def step(self, what: str, i: int, n: int, detail: str) -> None:
        if not self.show:
            return
        line = f"{what} {i}/{n} {detail}"
        if self.in_place:
            print(f"\r{line}".ljust(60), end="" if i < n else "\n", flush=True)
        else:
            print(line, flush=True)


def measure_all_reduce(heap: Any, dtype: Any, progress: Progress) -> dict[int, dict[str, float]]:
    """us of ironlink.all_reduce at each of ALL_REDUCE_SIZES with each path forced; "lamport"
    only where its grid fits (ops/collectives.py runs the library's path where it would not)."""
    import torch

    import ironlink
    from ..runtime import tuning
    from ..runtime.distributed import grid_cap
    from .timing import GraphRound

    world = heap.world_size
    timings: dict[int, dict[str, float]] = {}
    for i, nbytes in enumerate(ALL_REDUCE_SIZES, 1):
        progress.step("all_reduce", i, len(ALL_REDUCE_SIZES), size_text(nbytes))
        buf = heap.zeros(nbytes // torch.tensor([], dtype=dtype).element_size(), dtype)  # zeros stay finite
        timer = GraphRound()
        for path in decode_table.ALL_REDUCE_PATHS:
            if path == "lamport" and -(-nbytes // tuning.AllReduceConfig().lamport_cta_bytes) > grid_cap(heap.device):
                continue
            # The op's path is read from the table when it plans a call: at the capture, here.
            with decode_table.substituted(world, decode_table.DecodeTable(all_reduce=((decode_table.NO_LIMIT, path),))):
                timer.add(lambda: ironlink.all_reduce(buf, heap=heap), nbytes, tag=path)
        timings[nbytes] = {path: round(us, 3) for path, us in timer.run_tagged()}
        heap.free(buf)
    return timings


def measure_rmsnorm(heap: Any, dtype: Any, hidden: int, tokens: Sequence[int],
                    progress: Progress) -> dict[int, dict[str, float]]:
    """us of ironlink.all_reduce_rmsnorm at each token count, each mode that runs at the shape;
    the largest first, so that each mode's workspace is made once, at its largest (`heap_bytes`)."""
    import torch

    import ironlink
    from ..fused.all_reduce_rmsnorm import MODES
    from ..runtime import tuning
    from ..runtime.distributed import sm_share
    from .timing import GraphRound

    sms = sm_share(heap.device)
    timings: dict[int, dict[str, float]] = {}
    for i, t in enumerate(sorted(tokens, reverse=True), 1):
        progress.step("rmsnorm", i, len(tokens), f"tokens={t}")
        x = heap.zeros((t, hidden), dtype)  # zeros: repeated all-reduces keep them finite
        residual = torch.randn(t, hidden, device=x.device).to(dtype)
        weight = torch.ones(hidden, device=x.device, dtype=dtype)
        out = torch.empty_like(residual)
        timer = GraphRound()
        for mode in MODES:
            if tuning.rmsnorm_mode_runs(mode, t, hidden * x.element_size(), heap.world_size, sms):
                # Captured now (`add`): the graph keeps this mode's launch.
                timer.add(lambda: ironlink.all_reduce_rmsnorm(x, residual, weight, 1e-6, out=out, heap=heap, mode=mode),
                          x.nbytes, tag=mode)
        timings[x.nbytes] = {mode: round(us, 3) for mode, us in timer.run_tagged()}
        heap.free(x)
    return timings


def measure_matmul(heap: Any, dtype: Any, hidden: int, tokens: Sequence[int],
                   progress: Progress) -> dict[int, dict[str, float]]:
    """us of ironlink.matmul_all_reduce of [t, hidden / world] x [hidden / world, hidden] at each
    token count t, each method that takes the shape; the largest first (each method's workspace
    made once, at its largest). Keyed by the bytes of out, as the table looks methods up."""
    import torch

    import ironlink
    from ..runtime.tuning.decode_table import MATMUL_METHODS
    from .timing import GraphRound

    k = hidden // heap.world_size
    b = (torch.randn(k, hidden, device=heap.device) * k ** -0.5).to(dtype)
    timings: dict[int, dict[str, float]] = {}
    for i, t in enumerate(sorted(tokens, reverse=True), 1):
        progress.step("matmul", i, len(tokens), f"tokens={t}")
        a = torch.randn(t, k, device=heap.device).to(dtype)
        out = heap.empty((t, hidden), dtype)
        timer = GraphRound()
        for method in MATMUL_METHODS:
            # Captured now (`add`): the graph keeps this method's launch.
            timer.add(lambda: ironlink.matmul_all_reduce(a, b, out=out, heap=heap, method=method), out.nbytes,
                      tag=method)
        timings[out.nbytes] = {method: round(us, 3) for method, us in timer.run_tagged()}
        heap.free(out)
    return timings


def report(path: Path, world: int, ar: Timings, rms: Timings, row_bytes: int, modes: Sequence[str],
           matmul: Optional[Timings] = None, replaced_gpu: Optional[str] = None) -> list[str]:
    """The summary rank 0 prints: each op's choices and runners-up, the file (and the GPU of the
    table it replaced, where another's), how the ops find it."""
    def tokens(nbytes: int) -> str:
        return f"{nbytes // row_bytes} tokens ({size_text(nbytes)})"

    lines = summary("ironlink.all_reduce", ar, decode_table.ALL_REDUCE_PATHS)
    lines += summary("ironlink.all_reduce_rmsnorm", rms, modes, tokens)
    if matmul:
        lines += summary("ironlink.matmul_all_reduce", matmul, decode_table.MATMUL_METHODS, tokens)
    lines.append(f"wrote {path}")
    if replaced_gpu:
        lines.append(f"over a table measured on {replaced_gpu}: where nodes of that GPU share this folder, give each "
                     f"GPU model its own ${decode_table.TUNING_DIR_ENV} and tune each there.")
    if path == decode_table.table_path(decode_table.tuning_dir(), world):
        lines.append(f"ironlink's ops at world {world} read it from there (in processes started from now on).")
    else:
        lines.append(f"the ops read decode-w{world}.json from ${decode_table.TUNING_DIR_ENV} (now "
                     f"{decode_table.tuning_dir()}): move the file there, or point "
                     f"{decode_table.TUNING_DIR_ENV} at a folder holding it under that name.")
    return lines


def heap_bytes(world: int, x_bytes: int) -> int:
    """A heap for x of up to `x_bytes` and the one-node modes' workspaces, each kept in the heap
    and rounded up to a power of two (at most twice its size): "push" and "lamport" 2 (world - 1)
    x each ("push_two_shot" in push's, less than 4 x), "two_shot" less than 4 x; matmul_all_reduce's out (x's shape) and its "push" and
    "lamport" workspaces, 2 (world - 1) out each; with room for the all_reduce's sizes and
    workspace and the split's."""
    return (16 * world + 2) * x_bytes + (256 << 20)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    import ironlink
    from ..fused.all_reduce_rmsnorm import MODES, ONE_NODE_MODES
    from .timing import git_rev

    ironlink.init_distributed()
    world, rank = dist.get_world_size(), dist.get_rank()
    if world < 2:
        sys.exit("ironlink.tune: run it with 2 ranks or more (torchrun --nproc_per_node=N): world 1 exchanges nothing")
    dtype = getattr(torch, DTYPES[args.dtype])
    tokens = QUICK_TOKENS if args.quick else TOKENS
    row_bytes = args.hidden * torch.tensor([], dtype=dtype).element_size()
    heap = ironlink.SymmetricHeap(heap_bytes(world, max(tokens) * row_bytes))
    if heap.multi_node:
        sys.exit("ironlink.tune: measures one node (the one-shot paths are one node's); run it on one")
    progress = Progress(rank == 0)
    ar = measure_all_reduce(heap, dtype, progress)
    rms = measure_rmsnorm(heap, dtype, args.hidden, tokens, progress)
    mm = measure_matmul(heap, dtype, args.hidden, tokens, progress)
    table = choose_table(ar, rms, MODES, [m for m in MODES if m not in ONE_NODE_MODES], mm)
    if rank == 0:
        path = Path(args.out) if args.out else decode_table.table_path(decode_table.tuning_dir(), world)
        info = {"gpu": torch.cuda.get_device_name(), "hidden": args.hidden, "dtype": args.dtype,
                "ironlink_git": git_rev(),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        timings = {"all_reduce": ar, "all_reduce_rmsnorm": rms, "matmul_all_reduce": mm}
        before = decode_table.measured_on(path)
        decode_table.write_file(path, decode_table.document(world, table, info, timings))
        replaced = before if before not in (None, info["gpu"]) else None
        print("\n".join(report(path, world, ar, rms, row_bytes, MODES, mm, replaced)), flush=True)
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
