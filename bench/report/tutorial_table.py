"""docs/tutorial.md's cost table, made from the newest bench/results/tutorial-*.json with 4 ranks
(until one exists: with the most ranks measured, and the table says so).

    python3 bench/report/tutorial_table.py            # print the block
    python3 bench/report/tutorial_table.py --write    # rewrite it in docs/tutorial.md (`make docs` does this)

Each lesson of examples/tutorial/ appends its rows to $IRONLINK_TUTORIAL_JSON when it is set
(`tests/gpu/run.sh tutorial` sets it under $OUT; copy the 4-GPU file to bench/results/). The block
sits between `<!-- tutorial:begin -->` and `<!-- tutorial:end -->`; tests/packaging/test_readme_bench.py
checks that docs/tutorial.md carries exactly this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "report"))  # bench/report/doc_blocks.py, whether run as a script or loaded by path
from doc_blocks import replace_between  # noqa: E402
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "tutorial.md"
BEGIN, END = "<!-- tutorial:begin -->\n", "<!-- tutorial:end -->"
WORLD = 4

Row = dict[str, Any]


def newest() -> Optional[tuple[Path, int]]:
    """The newest tutorial-*.json (by the date it records) with rows measured on WORLD ranks, or
    failing that on the most ranks any file has; and that world size."""
    runs = []
    for p in RESULTS.glob("tutorial-*.json"):
        doc = json.loads(p.read_text())
        worlds = {r["world"] for r in doc["results"]}
        world = WORLD if WORLD in worlds else max(worlds, default=0)
        runs.append((world == WORLD, world, doc["date"], p.name, p))
    if not runs:
        return None
    best = max(runs)
    return best[4], best[1]


def size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 and nbytes % (1 << 20) == 0 else f"{nbytes >> 10} KiB"


def block() -> str:
    found = newest()
    if found is None:
        return f"No measurement yet (`tests/gpu/run.sh tutorial --worlds {WORLD}`, then copy its JSON to bench/results/).\n"
    path, world = found
    doc = json.loads(path.read_text())
    rows: list[Row] = sorted((r for r in doc["results"] if r["world"] == world), key=lambda r: (r["lesson"], r["variant"]))
    first = rows[0]
    pending = "" if world == WORLD else f" ({WORLD} GPUs not measured yet)"
    out = [f"{world} x {first['gpu']}{pending}, {doc['date'][:10]}, git {first['git_rev']} ({path.name}); us per call: CUDA "
           "graph replays, median, the slowest rank's; bytes: what each rank's result holds; x = library time / "
           "lesson time (above 1: the lesson is faster, usually because it does less, see each lesson).", "",
           "| lesson | what | bytes | lesson us | library equivalent | library us | x |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        what = f"{r['title']} ({r['variant']})" if r["variant"] else r["title"]
        out.append(f"| {r['lesson']} | {what} | {size(r['bytes'])} | {r['us']:.1f} | {r['library']} | "
                   f"{r['library_us']:.1f} | {r['library_us'] / r['us']:.2f} |")
    return "\n".join(out) + "\n"


def write() -> None:
    DOC.write_text(replace_between(DOC.read_text(), BEGIN, END, block(), "docs/tutorial.md"))
    print("wrote the tutorial block of docs/tutorial.md")


if __name__ == "__main__":
    write() if "--write" in sys.argv[1:] else print(block(), end="")
