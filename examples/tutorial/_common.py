"""What every lesson shares, so that each lesson file shows only its idea: starting the process
group and the symmetric heap, timing, agreeing on the result and printing the lesson's one line.

Each lesson runs as `torchrun --nproc_per_node=N examples/tutorial/0X_....py`. Rank 0 prints

    04 ring all-gather: ok (world 4), 31.2 us; ironlink.all_gather 12.9 us

and, when $IRONLINK_TUTORIAL_JSON names a file, appends one row per measured variant to it
(bench/report/tutorial_table.py makes docs/tutorial.md's table from such files).

torch is imported inside functions (and inside each lesson's main) so that CI, which has Triton
but no torch, can import the lessons and compile their kernels (tests/compile/test_tutorial_compile.py).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

# NVLink multicast stays off for NCCL and torch alike (ironlink never uses it).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import ironlink  # noqa: E402

# The benchmark harness (bench/ironlink_bench.py: its timers) is not part of the package; the
# lessons take it from this checkout.
BENCH_DIR = str(Path(__file__).resolve().parents[2] / "bench")


def _harness() -> Any:
    if BENCH_DIR not in sys.path:
        sys.path.append(BENCH_DIR)
    import ironlink_bench  # imports the compiled extension: only where a lesson runs

    return ironlink_bench


@dataclass
class Lesson:
    rank: int
    world: int
    heap: Any  # ironlink.SymmetricHeap: every tensor a kernel reaches on a peer lives in it
    status: Any  # torch.Tensor: one int32 per CTA: what each CTA's ironlink calls returned (0 = OK)


def start(heap_bytes: Union[int, Callable[[int], int]]) -> Lesson:
    """One process per GPU: the process group, then a symmetric heap of `heap_bytes` per rank
    (or of `heap_bytes(world)`, for a lesson whose library op's workspace grows with the world)."""
    import torch
    import torch.distributed as dist

    ironlink.init_distributed()  # this rank's GPU (LOCAL_RANK), then the NCCL group on it
    heap = ironlink.SymmetricHeap(heap_bytes if isinstance(heap_bytes, int) else heap_bytes(dist.get_world_size()))
    status = torch.zeros(1024, dtype=torch.int32, device="cuda")
    return Lesson(dist.get_rank(), dist.get_world_size(), heap, status)


def time_us(fn: Callable[[], Any], nbytes: int) -> float:
    """Median microseconds per call of `fn` replayed in a CUDA graph, the slowest rank's."""
    return _harness().time_graph(fn, nbytes)


def all_ranks_ok(ok: bool) -> bool:
    """True only if every rank says ok."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if ok else 0], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def finish(lesson: Lesson, number: str, title: str, ok: bool, nbytes: int, ours: dict[str, float],
           library: str, library_us: float) -> None:
    """Checks the statuses, prints rank 0's line, records the rows, closes everything; exits 1
    unless every rank was right. `ours` names each variant the lesson timed ("" for one)."""
    import torch
    import torch.distributed as dist

    torch.cuda.synchronize()
    ok = ok and bool((lesson.status == 0).all())
    try:
        lesson.heap.check()
    except ironlink.IronlinkError as e:
        print(f"rank {lesson.rank}: {e}", flush=True)
        ok = False
    ok = all_ranks_ok(ok)
    if lesson.rank == 0:
        times = ", ".join(f"{name + ' ' if name else ''}{us:.1f} us" for name, us in ours.items())
        print(f"{number} {title}: {'ok' if ok else 'FAILED'} (world {lesson.world}), {times}; "
              f"{library} {library_us:.1f} us", flush=True)
        record(lesson.world, number, title, nbytes, ours, library, library_us)
    lesson.heap.close()
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


def record(world: int, number: str, title: str, nbytes: int, ours: dict[str, float], library: str,
           library_us: float) -> None:
    """Appends this lesson's rows to $IRONLINK_TUTORIAL_JSON (a JSON document with "results")."""
    path = os.environ.get("IRONLINK_TUTORIAL_JSON")
    if not path:
        return
    import torch

    git_rev = _harness().git_rev

    doc: dict[str, Any] = {"results": []}
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    doc.setdefault("date", now)
    for variant, us in ours.items():
        doc["results"].append({"lesson": number, "title": title, "variant": variant, "world": world, "bytes": nbytes,
                               "us": round(us, 2), "library": library, "library_us": round(library_us, 2),
                               "gpu": torch.cuda.get_device_name(), "git_rev": git_rev(), "date": now})
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
