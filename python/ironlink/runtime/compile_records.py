"""A program's Triton kernels compiled ahead from records of its earlier runs, and recorded as it
runs (`compile_ahead` does both jobs; this module says where the records are and when).

`init_distributed()` calls `start_program` once the process group is up, so every program that
begins with it (the benchmarks, the tuner, the examples and the tutorial) takes part:

- `$IRONLINK_COMPILE_AHEAD` (a folder): the program's records there (`record_name`, and the
  per-rank files `<name>.rank<R>.jsonl.gz`) are compiled first, each rank a share over worker
  processes, into the Triton cache the launches read. The ranks do not wait for each other
  after: a rank done first may compile a kernel again that a peer is still compiling (seconds),
  where a barrier would hang a rank whose peers found no record (another node's folder).
- `$IRONLINK_COMPILE_RECORD` (a folder): each rank adds every kernel it compiles to its own file
  there as it compiles it (so a run stopped by a time limit still leaves one), each rank's since
  some kernels take the rank as a constexpr.

Neither is set by default. A record only saves time: whatever goes wrong compiling ahead or
writing a record is printed and the program goes on (its kernels compile at their launch). The
GPU suites keep their own records, filed by case (tests/gpu/workers/_cases.py), under the same
names.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from . import compile_ahead

ENV_AHEAD = "IRONLINK_COMPILE_AHEAD"
ENV_RECORD = "IRONLINK_COMPILE_RECORD"


def _folder_of(env: str) -> Optional[Path]:
    value = os.environ.get(env)
    return Path(value) if value else None


def program_name() -> str:
    """The running program's name: its script's stem, or the module run by ``python -m``
    (``ironlink.tune``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return spec.name.removesuffix(".__main__")
    return Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "python"


def record_name(program: str, world: int, shared: bool, arch: int) -> str:
    """The record of `program` at `world` ranks on sm_`arch`, ranks sharing GPUs or not (PDL is
    off where they share, so some kernels differ): ``fused-w4-sm90.jsonl.gz``."""
    return f"{program}-w{world}{'-shared' if shared else ''}-sm{arch}.jsonl.gz"


def _stem(name: str) -> str:
    return name.removesuffix(".jsonl.gz")


def records_of(folder: Path, name: str) -> list[compile_ahead.Entry]:
    """The entries of record `name` in `folder` and of its per-rank files, each kernel once."""
    files = [folder / name, *sorted(folder.glob(f"{_stem(name)}.rank*.jsonl.gz"))]
    return compile_ahead.unique([e for f in files for e in compile_ahead.read(f)])


def nearest_record(folder: Path, program: str, world: int, shared: bool, arch: int) -> str:
    """The name of `program`'s record to compile ahead from `folder` (`records_of` reads it and
    its per-rank files): this setting's where the folder holds it, else the one of ranks that
    shared GPUs where these do not, or the other way (PDL is off where ranks share a GPU, so the
    decode kernels differ; the rest are the same kernels), else this setting's. A world's first
    run on its own GPUs thus compiles ahead what a run on shared GPUs recorded."""
    for each in (shared, not shared):
        name = record_name(program, world, each, arch)
        if (folder / name).is_file() or any(folder.glob(f"{_stem(name)}.rank*.jsonl.gz")):
            return name
    return record_name(program, world, shared, arch)


def compile_share(entries_of: Callable[[], list[compile_ahead.Entry]], rank: int, world: int, local_world: int,
                  arch: int) -> tuple[list[compile_ahead.Entry], compile_ahead.Summary]:
    """Compiles rank `rank`'s share of the entries `entries_of()` reads (every `world`-th), over
    the processes its share of this node's cores allows; prints why any was not compiled. The
    entries and what was done: whatever goes wrong (a record unreadable too) is a failure there,
    never an exception, since compiling ahead only saves time."""
    started = time.time()
    try:
        entries = entries_of()
        done = compile_ahead.compile_ahead(entries[rank::world], arch, compile_ahead.processes_for(local_world))
    except Exception as e:  # noqa: BLE001 - the kernels compile at their launch instead
        entries, done = [], compile_ahead.Summary(0, time.time() - started, [f"{type(e).__name__}: {e}"])
    for failure in done.failures[:3]:
        print(f"ironlink: [rank {rank}] compile ahead: not compiled: {failure}", file=sys.stderr, flush=True)
    return entries, done


_started = False
_recorder: Optional[compile_ahead.Recorder] = None  # this process's, while it records


def start_program(rank: int, world: int, local_world: int, shared: bool,
                  arch: int) -> Optional[compile_ahead.Summary]:
    """Compiles this rank's share of the program's records ahead and starts recording, as
    $IRONLINK_COMPILE_AHEAD and $IRONLINK_COMPILE_RECORD say (module docs); once a process. The
    summary of compiling ahead, or None where there was none."""
    global _started, _recorder
    if _started:
        return None
    _started = True
    name = record_name(program_name(), world, shared, arch)
    done = None
    ahead = _folder_of(ENV_AHEAD)
    if ahead is not None:
        nearest = nearest_record(ahead, program_name(), world, shared, arch)
        entries, done = compile_share(lambda: records_of(ahead, nearest), rank, world, local_world, arch)
        if rank == 0 and entries:
            print(f"ironlink: compiled ahead {len(entries)} kernels of {_stem(nearest)} in {ahead} over {world} ranks; "
                  f"rank 0's share ({done.compiled} compiled, {len(done.failures)} not) in {done.seconds:.1f} s",
                  file=sys.stderr, flush=True)
    folder = _folder_of(ENV_RECORD)
    if folder is not None:
        _recorder = compile_ahead.Recorder(folder / f"{_stem(name)}.rank{rank}.jsonl.gz")
        _recorder.start()
    return done


__all__ = ["ENV_AHEAD", "ENV_RECORD", "compile_share", "nearest_record", "program_name", "record_name", "records_of",
           "start_program"]
