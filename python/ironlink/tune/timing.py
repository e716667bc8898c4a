"""The project's graph timer (the tuner's, and bench/ironlink_bench.py's, which the benchmarks
import it through) and the revision a measurement records. Needs torch, a GPU and a process
group; `import ironlink.tune` does not import this module."""

from __future__ import annotations

import os
import statistics
import subprocess
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist


# Calls per graph and timed replays: fewer for large messages, whose calls take milliseconds.
def iters_reps(nbytes: int) -> tuple[int, int]:
    return (20, 15) if nbytes <= (16 << 20) else (5, 7)


def captured(fn: Callable[[], Any], calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` calls of `fn`, after three warm-up calls on a side stream (the
    first call compiles and makes workspaces, which a capture cannot), replayed once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


# Device cycles each rank's stream sleeps before the ranks meet on the device: about 1 ms on an
# H100 / H200 (1.7-2 GHz), longer than the host barrier's release skew (42-95 us measured on 4
# H200s, session 43) plus the time a host takes to queue the meeting and the replay behind it.
ALIGNED_START_SLEEP_CYCLES = 2_000_000


def replay_us(g: torch.cuda.CUDAGraph, aligned: bool = True) -> float:
    """Microseconds of one replay of `g` (device events around it), started after a barrier of
    the ranks.

    A host barrier (`dist.barrier`) releases the ranks tens of microseconds apart, and a graph of
    collectives started that way holds the skew once: its first call waits for the last rank's,
    which a 20-call graph adds to every call's time (2-5 us a call at world 4). With `aligned`
    (the default) every rank's stream first sleeps, so that each host has queued the rest before
    its GPU gets there, then the ranks meet in a one-element NCCL all-reduce on the device; the
    timed replay starts when that returns, on every rank within the all-reduce's own release
    skew, as the layers of a model's step run in step. `aligned=False` times from the host
    barrier (what this timer did before 2026-11-28; bench/probes/decode_probe.py reports both)."""
    dist.barrier()
    if aligned:
        torch.cuda._sleep(ALIGNED_START_SLEEP_CYCLES)
        dist.all_reduce(_meeting_token())
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000


_MEETING: dict[int, torch.Tensor] = {}


def _meeting_token() -> torch.Tensor:
    """The one-element tensor the ranks meet on, one per device (made once: an allocation in the
    timed path would put the caching allocator between the ranks)."""
    dev = torch.cuda.current_device()
    if dev not in _MEETING:
        _MEETING[dev] = torch.zeros(1, device="cuda")
    return _MEETING[dev]


class GraphRound:
    """Contenders timed side by side: each is captured into its own CUDA graph when added (`add`),
    then `run` replays them in turns, every round in a rotated order, and returns each one's
    median microseconds per call, max over ranks. A GPU's clocks drift over a long run (a GEMM
    heats it until power caps the clock): timed one after another, the first contender would get
    the cool GPU; in turns, the drift falls on all of them alike. Every rank must add the same
    contenders in the same order (the replays of collectives meet their peers')."""

    def __init__(self) -> None:
        # (graph, calls in it, replays, the function: it keeps what its graph reads alive until `run`,
        # what runs before each replay, the caller's tag)
        self.graphs: list[tuple[torch.cuda.CUDAGraph, int, int, Callable[[], Any], Optional[Callable[[], None]],
                                Any]] = []

    def add(self, fn: Callable[[], Any], nbytes: int, before: Optional[Callable[[], None]] = None,
            tag: Any = None) -> int:
        """Warms `fn` up, captures `iters_reps(nbytes)[0]` calls of it into a graph; returns its index.
        `before` (host code, untimed) runs first and again before each replay: for state the
        graph's kernels read at run time that other contenders change (a heap context's algorithm
        limits). `tag`: anything, handed back with the time by `run_tagged`."""
        if before is not None:
            before()
        iters, reps = iters_reps(nbytes)
        self.graphs.append((captured(fn, iters), iters, reps, fn, before, tag))
        return len(self.graphs) - 1

    def run(self) -> list[float]:
        """Times every graph added (the most replays any asked for each), then drops them."""
        return [us for _, us in self.run_tagged()]

    def run_tagged(self) -> list[tuple[Any, float]]:
        """`run`, each time with the tag its graph was added with."""
        n = len(self.graphs)
        times: list[list[float]] = [[] for _ in range(n)]
        for r in range(max((g[2] for g in self.graphs), default=0)):
            for i in [(r + j) % n for j in range(n)]:  # rotated: each contender leads a round in turn
                g, iters, _, _, before, _ = self.graphs[i]
                if before is not None:
                    before()
                times[i].append(replay_us(g) / iters)
        tags = [graph[5] for graph in self.graphs]
        self.graphs.clear()
        if n == 0:
            return []
        t = torch.tensor([statistics.median(ts) for ts in times], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return list(zip(tags, t.tolist()))


def time_graph(fn: Callable[[], None], nbytes: int) -> float:
    """Median microseconds per call of `fn` under CUDA-graph replay, max over ranks (a
    `GraphRound` of one)."""
    timer = GraphRound()
    timer.add(fn, nbytes)
    return timer.run()[0]


# Written by `make wheel` beside the bitcode it packs (`git describe --always --dirty`): the
# revision the device code was built from, carried to the GPU machine with build/, whose copy of
# the tree may hold a stale .git. Where the package runs from its checkout (python/ on PYTHONPATH).
BUILD_REV = Path(__file__).resolve().parents[3] / "build" / "git_rev"


def git_rev() -> str:
    """$IRONLINK_GIT_REV, else build/git_rev of this checkout, else `git rev-parse` here."""
    rev = os.environ.get("IRONLINK_GIT_REV")
    if rev:
        return rev
    if BUILD_REV.is_file():
        return BUILD_REV.read_text().strip()
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


__all__ = ["ALIGNED_START_SLEEP_CYCLES", "BUILD_REV", "GraphRound", "captured", "git_rev", "iters_reps", "replay_us", "time_graph"]
