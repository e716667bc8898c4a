"""The benchmarks' harness: the graph timer (`GraphRound`, `time_graph`: CUDA graphs, median replay,
max over ranks, every rank's replay started together), an eager timer for contenders a graph
cannot hold, the JSON writer with the run header every result file carries (`write_results`,
`run_info`), the sizes the collectives' benchmarks sweep, and small helpers the probes share.

Not part of the wheel: the bench programs (and the tutorial's timers) import it as `ironlink_bench`
from bench/ (their own folder; the probes in bench/probes/ put it on sys.path; or the PYTHONPATH
that tests/gpu/setup_native.sh sets). The collectives' benchmark itself is bench/allreduce.py.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import triton

# The graph timer and the revision a run records live in the package (the tuner's, `python -m
# ironlink.tune`); the bench programs import them from here.
from ironlink.tune.timing import GraphRound, git_rev, iters_reps, time_graph  # noqa: F401

# The message sizes the collectives' benchmarks sweep (bench/allreduce.py, bench/backends.py).
SIZES = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 2 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30]


def time_eager(fn: Callable[[], None], reps: int = 20) -> float:
    """Median microseconds per call of `fn` run eagerly (for contenders a CUDA graph cannot hold:
    they read counts back to the host), max over ranks. Each call starts after a barrier."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    t = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def randn_bf16(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> Any:
    """bf16 normal values times `scale`, drawn on the GPU from `seed` (the same on every rank)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)


def slowest_rank_median(runs: list[dict[str, Any]],
                        key: Callable[[dict[str, Any]], float]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The timeline probes' summary of repeated traced launches: (of every rank's median run by
    `key`, the largest; every rank's median, in rank order). Every rank gets both."""
    mine = sorted(runs, key=key)[len(runs) // 2]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return max(gathered, key=key), gathered


def record_row(rows: list[dict[str, Any]], row: dict[str, Any]) -> None:
    """Appends `row` to `rows`; rank 0 also prints it as one JSON line (a probe's progress)."""
    rows.append(row)
    if dist.get_rank() == 0:
        print(json.dumps(row), flush=True)


def write_results(path: Optional[str], world: int, rows: list[dict[str, Any]], **extra: Any) -> None:
    """Rank 0 writes the run header (`run_info`), `extra` fields and `rows` as JSON to `path`
    (nothing when None)."""
    if dist.get_rank() != 0 or not path:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({**run_info(world), **extra, "results": rows}, f, indent=1)


def run_info(world: int) -> dict[str, Any]:
    """What every benchmark JSON records about its run: date, GPU, world size, revision, versions,
    method, environment."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "world_size": world,
        "git_rev": git_rev(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "method": ("CUDA graph of 20 calls (5 above 16 MiB), 15 (7) timed replays, median per call, max over ranks; "
                   "each replay started on every rank together (a device sleep, then a one-element NCCL all-reduce: "
                   "ironlink.tune.timing.replay_us); "
                   "where a program times contenders together (GraphRound), their replays in turns"),
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
    }
