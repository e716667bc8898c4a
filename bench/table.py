"""Prints the README's benchmark tables (markdown) from a benchmark JSON in bench/results.

    python3 bench/table.py [bench/results/<file>.json]     # default: the README block (newest run per world size)

tests/test_readme_bench.py checks that README.md carries exactly this output for the newest file,
so the README cannot drift from the committed results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def newest_per_world() -> list[Path]:
    """The newest run at each world size, largest world first (a 4-GPU run does not replace an
    8-GPU table)."""
    best: dict[int, tuple[str, str, Path]] = {}
    for p in RESULTS.glob("*.json"):
        doc = json.loads(p.read_text())
        key = (doc["date"], p.name, p)
        world = int(doc["world_size"])
        if world not in best or key[:2] > best[world][:2]:
            best[world] = key
    return [best[w][2] for w in sorted(best, reverse=True)]


def readme_block() -> str:
    """What README.md carries between its bench markers: the tables of `newest_per_world()`."""
    return "\n".join(tables(json.loads(p.read_text())) for p in newest_per_world())


# All-reduce algorithms as the config column names them.
SHORT = {"one_shot_ll": "LL1", "two_shot_ll": "LL2", "two_shot": "2S"}


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n // size} {unit}"
    return f"{n} B"


def fmt(row: dict | None) -> str:
    return f"{row['us']:.2f}" if row else "-"


def tables(doc: dict) -> str:
    rows = doc["results"]
    out = [
        f"{doc['world_size']}x {doc['gpu']}, {doc['date'][:10]}, git {doc['git_rev']}, torch {doc['torch']}, "
        f"NCCL {doc['nccl']}; {doc['method']}. us per call; busbw in GB/s; x = NCCL time / ironlink time.",
        "",
    ]
    def get(coll: str, dt: str, nbytes: int, who: str) -> dict | None:
        return next((r for r in rows if (r["collective"], r["dtype"], r["bytes"], r["contender"]) == (coll, dt, nbytes, who)), None)

    floor = [r for r in rows if r["contender"] == "empty_kernel"]
    if floor:
        out += [f"Launch floor: a kernel that does no communication takes {min(r['us'] for r in floor):.2f} us "
                "per call in the same harness.", ""]
    if any("algorithm" in r for r in rows):
        out += ["Config = algorithm and CTAs x num_warps: LL1 one-shot LL, LL2 two-shot LL, 2S two-shot.", ""]
    sizes = sorted({r["bytes"] for r in rows})
    for dt in sorted({r["dtype"] for r in rows}):
        out += [f"all_reduce {dt}:", "",
                "| size | ironlink us | busbw | config | NCCL us | busbw | x NCCL | symm one_shot us | symm two_shot us |",
                "|---|---|---|---|---|---|---|---|---|"]
        for n in sizes:
            il, nc = get("all_reduce", dt, n, "ironlink"), get("all_reduce", dt, n, "nccl")
            if not il or not nc:
                continue
            one, two = get("all_reduce", dt, n, "symm_one_shot"), get("all_reduce", dt, n, "symm_two_shot")
            config = f"{SHORT.get(il.get('algorithm', ''), '')} {il['config']}".strip()
            out.append(f"| {human(n)} | {il['us']:.2f} | {il['busbw_GBs']:.1f} | {config} | {nc['us']:.2f} | "
                       f"{nc['busbw_GBs']:.1f} | {il['vs_nccl']:.2f} | {fmt(one)} | {fmt(two)} |")
        out += ["", f"all_gather and reduce_scatter {dt} (size = the gathered / scattered buffer):", "",
                "| size | all_gather ironlink us | NCCL us | x NCCL | reduce_scatter ironlink us | NCCL us | x NCCL |",
                "|---|---|---|---|---|---|---|"]
        for n in sizes:
            ag, agn = get("all_gather", dt, n, "ironlink"), get("all_gather", dt, n, "nccl")
            rs, rsn = get("reduce_scatter", dt, n, "ironlink"), get("reduce_scatter", dt, n, "nccl")
            if ag and agn and rs and rsn:
                out.append(f"| {human(n)} | {ag['us']:.2f} | {agn['us']:.2f} | {ag['vs_nccl']:.2f} | "
                           f"{rs['us']:.2f} | {rsn['us']:.2f} | {rs['vs_nccl']:.2f} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.stdout.write(tables(json.loads(Path(sys.argv[1]).read_text())))
    else:
        sys.stdout.write(readme_block())
