"""`make test-rust`: what `cargo test --workspace` runs, each test binary pinned to one CPU, one
binary a CPU at a time.

Why: the simulator runs every simulated GPU thread as an OS thread, and its CTA barriers wake
them by the hundred; on two CPUs the wake-ups cross between them. Measured on the 2-core CI
machine (debug build): tile_ll took 11.1 s on both CPUs and 12.1 s pinned to one, using 11.6
CPU-seconds where it used 17.6; hierarchical_collectives on CPU 0 while collectives then
hierarchical ran on CPU 1 took 157 s together, where the three took 220 s one after the other
and 217 s side by side unpinned.

    python3 tests/run_rust.py [--toolchain 1.93.0] [cargo test arguments after --]

Builds every test target (`cargo test --workspace --no-run`), runs the binaries from a queue
(the longest first: LONGEST) on as many lanes as this process may use CPUs, each lane pinned to
one, prints each binary's output when it ends, then the doc tests; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import NamedTuple, Optional

# The test binaries that take longest, longest first (pinned to one CPU of the CI machine, dev
# build, the device crate at opt-level 1: 99, 52, 34, 30, 16, 8, 6 s): started first so that the
# lanes end together.
LONGEST = ("hierarchical_collectives", "collectives", "hierarchical", "hierarchical_tiles", "misuse",
           "tile_ll", "tile_all_reduce", "all_to_all_v")


class Binary(NamedTuple):
    name: str
    path: str
    cwd: str  # the package's directory, where cargo runs its tests


class Outcome(NamedTuple):
    binary: Binary
    code: int
    seconds: float
    output: str


def cargo(toolchain: Optional[str]) -> list[str]:
    return ["cargo"] + ([f"+{toolchain}"] if toolchain else [])


def test_binaries(toolchain: Optional[str]) -> list[Binary]:
    """Builds the workspace's test targets; their binaries, LONGEST first."""
    out = subprocess.run(cargo(toolchain) + ["test", "-q", "--workspace", "--no-run", "--message-format=json"],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    found = []
    for line in out.splitlines():
        msg = json.loads(line) if line.startswith("{") else {}
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["profile"]["test"]:
            found.append(Binary(msg["target"]["name"], msg["executable"], os.path.dirname(msg["manifest_path"])))
    rank = {name: i for i, name in enumerate(LONGEST)}
    return sorted(found, key=lambda b: rank.get(b.name, len(LONGEST)))


# A simulated node's signal regions are 21.7 MB a rank (abi signal::FULL_BYTES), mostly never
# touched. After the first such block is freed glibc raises its mmap threshold above it, and from
# then on each node's zeroed allocation comes from the heap and is cleared byte by byte (12 % of
# hierarchical_collectives' cycles). A fixed threshold keeps them on fresh zero pages: 24.2 -> 20.4 s
# for its all_gather test pinned to one CPU.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 << 10)}


def run_pinned(b: Binary, cpu: int, args: list[str]) -> Outcome:
    env = dict(os.environ, CARGO_MANIFEST_DIR=b.cwd, **MALLOC_ENV)
    t0 = time.monotonic()
    p = subprocess.run([b.path] + args, cwd=b.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    return Outcome(b, p.returncode, time.monotonic() - t0, p.stdout)


def run_lanes(binaries: list[Binary], cpus: list[int], args: list[str]) -> list[Outcome]:
    todo: "queue.Queue[Binary]" = queue.Queue()
    for b in binaries:
        todo.put(b)
    done: list[Outcome] = []
    lock = threading.Lock()

    def lane(cpu: int) -> None:
        while True:
            try:
                b = todo.get_nowait()
            except queue.Empty:
                return
            o = run_pinned(b, cpu, args)
            with lock:
                done.append(o)
                print(f"-- {b.name}: {'ok' if o.code == 0 else f'FAILED (exit {o.code})'} in {o.seconds:.1f} s "
                      f"on CPU {cpu}", flush=True)
                if o.code != 0:
                    print(o.output, flush=True)

    lanes = [threading.Thread(target=lane, args=(cpu,)) for cpu in cpus]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--toolchain", default=None, help="rustup toolchain (cargo +TOOLCHAIN)")
    ap.add_argument("args", nargs="*", help="arguments for each test binary (after --), e.g. a name filter")
    opts = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    binaries = test_binaries(opts.toolchain)
    t0 = time.monotonic()
    done = run_lanes(binaries, cpus, ["-q"] + opts.args)
    failed = [o.binary.name for o in done if o.code != 0]
    print(f"-- {len(done)} test binaries on {len(cpus)} CPU(s) in {time.monotonic() - t0:.1f} s"
          f"{': FAILED ' + ' '.join(failed) if failed else ''}", flush=True)
    doc = subprocess.run(cargo(opts.toolchain) + ["test", "-q", "--workspace", "--doc"])
    return 1 if failed or doc.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
