"""docs/backends.md's measured table, made from the newest bench/results/backends-*.json.

    python3 bench/report/backends_table.py            # print the block
    python3 bench/report/backends_table.py --write    # rewrite it in docs/backends.md (`make docs` does this)

One row per message size: each backend's time and its ratio to the P2P heap's (`vs_p2p`: P2P
time / this one, so above 1 is faster). The block sits between `<!-- backends:begin -->` and
`<!-- backends:end -->`.
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
DOC = REPO / "docs" / "backends.md"
BEGIN, END = "<!-- backends:begin -->\n", "<!-- backends:end -->"


def newest() -> Optional[Path]:
    """The newest backends-*.json with the most ranks (by the date it records)."""
    runs = [(d["world_size"], d["date"], p.name, p)
            for p in RESULTS.glob("backends-*.json") for d in [json.loads(p.read_text())]]
    return max(runs)[3] if runs else None


def size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def block() -> str:
    path = newest()
    if path is None:
        return "No measurement yet (`bench/run.sh backends` on 4 GPUs, then copy its JSON to bench/results/).\n"
    doc: dict[str, Any] = json.loads(path.read_text())
    backends = ["p2p", *doc["backends"][1:], "nccl"]
    by = {(r["bytes"], r["backend"]): r for r in doc["results"]}
    sizes = sorted({r["bytes"] for r in doc["results"]})
    out = [f"all_reduce bf16, {doc['world_size']} x {doc['gpu']}, {doc['date'][:10]}, git {doc['git_rev']} "
           f"({path.name}); us per call ({doc['method']}); in brackets P2P time / this one.", "",
           "| bytes | " + " | ".join(backends) + " |", "|---" * (len(backends) + 1) + "|"]
    for n in sizes:
        cells = []
        for b in backends:
            r = by.get((n, b))
            cells.append("-" if r is None else f"{r['us']:.1f}" + ("" if b == "p2p" else f" ({r['vs_p2p']:.2f})"))
        out.append(f"| {size(n)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def write() -> None:
    DOC.write_text(replace_between(DOC.read_text(), BEGIN, END, block(), "docs/backends.md"))
    print("wrote the backends block of docs/backends.md")


if __name__ == "__main__":
    write() if "--write" in sys.argv[1:] else print(block(), end="")
