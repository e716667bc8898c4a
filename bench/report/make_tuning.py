"""Writes python/ironlink/runtime/tuning_table.py (launch configs of the host-level collectives) from benchmark JSON.

    python bench/report/make_tuning.py                         # newest bench/results/*.json
    python bench/report/make_tuning.py bench/results/a.json    # one file per world size (later files win)

Input: what ``bench/allreduce.py`` writes. ``all_reduce`` has one "ironlink_cfg" row per
(dtype, bytes, config "CTAsxWARPS"); ``all_gather``/``reduce_scatter`` have only the best config
per (dtype, bytes), as "ironlink" rows. Per collective and size we keep the fastest config over
all dtypes (the device code's work depends on bytes, not dtype), merge neighbouring sizes that
chose the same config, and write a table per world size (`ironlink.tuning.choose` reads it).
A benchmark of older device code (device/src changed since its git revision) is refused: its
best configs were the best for other algorithms.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
OUT = REPO / "python" / "ironlink" / "runtime" / "tuning_table.py"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def _load_abi() -> Any:
    """python/ironlink/language/_abi.py (generated from device/src), loaded by path: importing the
    package would need triton, and this script runs without it."""
    spec = importlib.util.spec_from_file_location("ironlink_abi", REPO / "python" / "ironlink" / "language" / "_abi.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAX_CTAS: int = _load_abi().MAX_CTAS

Table = list[tuple[int, int, int]]  # (max_bytes, ctas, num_warps), ascending max_bytes


def parse_config(config: str) -> tuple[int, int]:
    """"132x8" -> (132, 8)."""
    ctas, _, warps = config.partition("x")
    try:
        return int(ctas), int(warps)
    except ValueError:
        raise ValueError(f"config {config!r} is not CTAsxWARPS") from None


def first_config(rows: list[dict[str, Any]]) -> str:
    """The first config the benchmark tried (its CONFIGS[0]), from the order of the cfg rows.

    ironlink_bench's all_gather/reduce_scatter keep `min(best or (us, ""), (us, cfg))`, so when
    the first config wins, the recorded config is "": that empty string means this config."""
    for r in rows:
        if r["contender"] == "ironlink_cfg" and r["config"]:
            return str(r["config"])
    raise ValueError("no ironlink_cfg rows: cannot tell which config an empty 'config' stands for")


def best_per_size(rows: list[dict[str, Any]], collective: str) -> dict[int, tuple[float, str, str]]:
    """bytes -> (us, config, algorithm) of the fastest ironlink config measured for `collective`,
    any dtype (algorithm "" where the file does not say)."""
    contender = "ironlink_cfg" if collective == "all_reduce" else "ironlink"
    best: dict[int, tuple[float, str, str]] = {}
    empty = None
    for r in rows:
        if r["collective"] != collective or r["contender"] != contender:
            continue
        config = r["config"]
        if not config:
            empty = empty or first_config(rows)
            config = empty
        nbytes, us = int(r["bytes"]), float(r["us"])
        if nbytes not in best or us < best[nbytes][0]:
            best[nbytes] = (us, config, str(r.get("algorithm", "")))
    return best


def measured(best: dict[int, tuple[float, str, str]]) -> bool:
    """Whether the rows say which algorithm won (older files do not)."""
    return bool(best) and all(alg for _, _, alg in best.values())


def winning_run(best: dict[int, tuple[float, str, str]], alg: str, start: int = 0) -> tuple[int, int]:
    """From the `start`-th measured size on, the run of sizes at which `alg` won: its largest size
    (0 if the run is empty) and the index just after it."""
    sizes = sorted(best)
    upto, i = 0, start
    while i < len(sizes) and best[sizes[i]][2] == alg:
        upto, i = sizes[i], i + 1
    return upto, i


def gather_ll_max(*bests: dict[int, tuple[float, str, str]]) -> int:
    """The largest measured size up to which LL won without interruption for every one of the
    given collectives (all_gather, reduce_scatter); 0 if the rows carry no algorithm."""
    if not all(measured(best) for best in bests):
        return 0
    return min(winning_run(best, "ll")[0] for best in bests)


def algorithm_limits(best: dict[int, tuple[float, str, str]]) -> tuple[int, int] | None:
    """(ar_one_shot_max_bytes, ar_ll_max_bytes) for the heap's all-reduce limits: the largest
    measured sizes up to which one-shot LL, then LL of either kind, won without interruption. None if the rows carry
    no algorithm (older files)."""
    if not measured(best):
        return None
    ar_one_shot_max_bytes, i = winning_run(best, "one_shot_ll")
    two_shot_ll_max_bytes, _ = winning_run(best, "two_shot_ll", i)
    return ar_one_shot_max_bytes, two_shot_ll_max_bytes or ar_one_shot_max_bytes


def make_table(best: dict[int, tuple[float, str, str]]) -> Table:
    """Sorted (max_bytes, ctas, warps); runs of sizes with the same config keep only their largest."""
    table: Table = []
    for nbytes in sorted(best):
        ctas, warps = parse_config(best[nbytes][1])
        entry = (nbytes, max(1, min(MAX_CTAS, ctas)), warps)
        if table and table[-1][1:] == entry[1:]:
            table[-1] = entry
        else:
            table.append(entry)
    return table


def tables_from(docs: Iterable[dict[str, Any]]) -> tuple[dict[str, dict[int, Table]], dict[int, tuple[int, int, int]]]:
    """Per collective and world size, the config table; per world size, the algorithm limits
    (ar_one_shot_max_bytes, ar_ll_max_bytes, gather_ll_max_bytes), where the file says which
    all-reduce algorithm won."""
    out: dict[str, dict[int, Table]] = {c: {} for c in COLLECTIVES}
    limits: dict[int, tuple[int, int, int]] = {}
    for doc in docs:
        world = int(doc["world_size"])
        bests = {c: best_per_size(doc["results"], c) for c in COLLECTIVES}
        for c, best in bests.items():
            if best:
                out[c][world] = make_table(best)
        if (lim := algorithm_limits(bests["all_reduce"])) is not None:
            limits[world] = (*lim, gather_ll_max(bests["all_gather"], bests["reduce_scatter"]))
    missing = [c for c, t in out.items() if not t]
    if missing:
        raise ValueError(f"no ironlink measurements of {', '.join(missing)} in the input")
    return out, limits


# What decides how fast a config runs: a benchmark of other device code says nothing about it.
DEVICE_CODE = ("device/src", "device/Cargo.toml")


def stale_reason(doc: dict[str, Any]) -> str | None:
    """Why `doc`'s measurements may not describe the device code at HEAD (None: they do): its
    revision is unknown here, or device code changed since."""
    rev = str(doc.get("git_rev", ""))
    known = rev and subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=REPO,
                                   capture_output=True).returncode == 0
    if not known:
        return f"its revision {rev!r} is not a commit of this repository"
    changed = subprocess.run(["git", "diff", "--quiet", rev, "HEAD", "--", *DEVICE_CODE], cwd=REPO)
    if changed.returncode != 0:
        return f"the device code changed since its revision {rev}"
    return None


def git_rev() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


TEMPLATE = '''\
# Generated by bench/report/make_tuning.py (at git {rev})
# from {sources}.
# Do not edit: rerun `python bench/report/make_tuning.py` after a new benchmark.
"""Launch configs (CTAs, num_warps) of ironlink's host-level collectives, from measurements.

Bytes are what the benchmark calls a message: the buffer for all_reduce, the whole (world x n)
output for all_gather and input for reduce_scatter. Per collective and measured world size, a
table of (max_bytes, ctas, num_warps), ascending: the fastest config measured at sizes up to
max_bytes (and above the previous entry's max_bytes).
"""

from __future__ import annotations

TABLES: dict[str, dict[int, tuple[tuple[int, int, int], ...]]] = {tables}

# Algorithm limits per world size, (ar_one_shot_max_bytes, ar_ll_max_bytes, gather_ll_max_bytes): the
# heap sets them at creation (see SymmetricHeap.set_algorithm_limits); the largest measured
# sizes up to which all-reduce's one-shot LL, then two-shot LL, and all_gather's and
# reduce_scatter's LL (0: not measured, off) were fastest.
ALGORITHM_LIMITS: dict[int, tuple[int, int, int]] = {limits}

'''


def render(tables: dict[str, dict[int, Table]], limits: dict[int, tuple[int, int, int]], sources: list[str], rev: str) -> str:
    lines = ["{"]
    for c, by_world in tables.items():
        lines.append(f"    {c!r}: {{")
        for world, table in sorted(by_world.items()):
            lines.append(f"        {world}: (")
            lines.extend(f"            ({b}, {ctas}, {warps})," for b, ctas, warps in table)
            lines.append("        ),")
        lines.append("    },")
    lines.append("}")
    lim = "{" + ", ".join(f"{w}: {limits[w]}" for w in sorted(limits)) + "}"
    return TEMPLATE.format(rev=rev, sources="; ".join(sources), tables="\n".join(lines), limits=lim)


def describe(path: Path, doc: dict[str, Any]) -> str:
    """Where a table came from: the file (relative to the repo) and what it measured."""
    try:
        name = str(path.resolve().relative_to(REPO))
    except ValueError:
        name = str(path)
    return f"{name} (benchmark at git {doc.get('git_rev', '?')}, {doc['world_size']}x {doc.get('gpu', '?')})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="*", type=Path, help="benchmark JSON files (default: newest in bench/results)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--allow-stale", action="store_true",
                    help="use benchmarks of older device code too (by default they are refused)")
    args = ap.parse_args(argv)
    paths: list[Path] = args.json
    if not paths:
        found = list(RESULTS.glob("allreduce-*.json"))
        if not found:
            print(f"no benchmark JSON in {RESULTS}", file=sys.stderr)
            return 1
        # Newest by the date the benchmark recorded (file times change with checkouts).
        paths = [max(found, key=lambda p: (json.loads(p.read_text()).get("date", ""), p.name))]
    docs = [json.loads(p.read_text()) for p in paths]
    if not args.allow_stale:
        stale = [f"{p}: {why}" for p, d in zip(paths, docs) if (why := stale_reason(d)) is not None]
        if stale:
            print("refusing benchmarks that may not describe the current device code "
                  "(--allow-stale to use them anyway):\n  " + "\n  ".join(stale), file=sys.stderr)
            return 1
    tables, limits = tables_from(docs)
    text = render(tables, limits, [describe(p, d) for p, d in zip(paths, docs)], git_rev())
    args.out.write_text(text)
    print(f"wrote {args.out} from {', '.join(map(str, paths))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
