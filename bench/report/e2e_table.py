"""README.md's model-step table (issue 63 item 4), made from the newest bench/results/e2e-*.json
(the dense stack, bench/e2e.py) and e2e_moe-*.json (the MoE stack, bench/e2e_moe.py) of each
world size.

    python3 bench/report/e2e_table.py            # print the block
    python3 bench/report/e2e_table.py --write    # rewrite it in README.md (`make docs` does this)

The block sits between `<!-- e2e:begin -->` and `<!-- e2e:end -->`; tests/packaging/test_readme_bench.py
checks that README.md carries exactly this output. Runs made with --check (no timing) are left out.
Once a run exists the block ends with the plot (`PLOT`, drawn by e2e_plot.py from the same runs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "report"))  # bench/report/doc_blocks.py, whether run as a script or loaded by path
sys.path.insert(0, str(REPO / "bench"))  # bench/e2e_moe.py (no torch needed to import it)
from doc_blocks import replace_between  # noqa: E402
from models.dense import FLOOR  # noqa: E402  (no torch needed to import it)
from e2e_moe import PARTS  # noqa: E402
RESULTS = REPO / "bench" / "results"
DOC = REPO / "README.md"
BEGIN, END = "<!-- e2e:begin -->\n", "<!-- e2e:end -->"
PLOT = "docs/img/e2e-model-step.png"  # e2e_plot.py draws it from the same runs

Doc = dict[str, Any]
Row = dict[str, Any]


def newest_by_world(prefix: str, results: Path = RESULTS) -> list[Doc]:
    """The newest timed run of bench/<prefix>.py at each world size and model (a run's
    `dims.model`: e2e_moe runs its stack with 256 experts and with 64), smallest world first, then
    the model with the most experts."""
    best: dict[tuple[int, int, str], tuple[str, str, Doc]] = {}
    for p in results.glob(f"{prefix}-*.json"):
        doc = json.loads(p.read_text())
        if doc.get("check") or doc.get("any_tensor"):  # the staged runs are experiments, not the table
            continue
        key = (doc["date"], p.name, doc)
        dims = doc.get("dims", {})
        which = (doc["world_size"], -int(dims.get("experts", 0)), str(dims.get("model", "")))
        if which not in best or key[:2] > best[which][:2]:
            best[which] = key
    return [best[w][2] for w in sorted(best)]


def ms(r: Optional[Row]) -> str:
    return "-" if r is None or r.get("ms") is None else f"{r['ms']:.3f}"


def ratio(theirs: Optional[Row], ours: Optional[Row]) -> str:
    if theirs is None or ours is None or not theirs.get("ms") or not ours.get("ms"):
        return "-"
    return f"{theirs['ms'] / ours['ms']:.2f}"


def caption(doc: Doc, what: str) -> str:
    return (f"{what}, {doc['world_size']} x {doc['gpu']}, {doc['date'][:10]}, git {doc['git_rev']}; "
            "ms per step (median, max over ranks)")


def dense_lines(doc: Doc) -> list[str]:
    rows: list[Row] = doc["results"]
    d = doc.get("dims", {})

    def get(phase: str, batch: int, who: str) -> Optional[Row]:
        return next((r for r in rows if r["phase"] == phase and r["batch"] == batch and r["contender"] == who), None)

    floor = any(r["contender"] == FLOOR for r in rows)  # bench/e2e.py's step without all-reduces, where timed
    out = [caption(doc, f"Dense TP stack ({d.get('model', '?')}, {d.get('layers', '?')} layers, bf16)"), "",
           "| phase | batch | tokens | nccl | torch symm_mem | ironlink | ironlink + torch.compile | x nccl |"
           + (" no all-reduce (floor) |" if floor else ""),
           "|---|---|---|---|---|---|---|---|" + ("---|" if floor else "")]
    for phase, batch, tokens in sorted({(r["phase"], r["batch"], r["tokens"]) for r in rows},
                                       key=lambda k: (k[0] != "decode", k[1])):
        nccl, mine = get(phase, batch, "nccl"), get(phase, batch, "ironlink")
        out.append(f"| {phase} | {batch} | {tokens} | {ms(nccl)} | {ms(get(phase, batch, 'torch_symm'))} | {ms(mine)} "
                   f"| {ms(get(phase, batch, 'ironlink_compile'))} | {ratio(nccl, mine)} |"
                   + (f" {ms(get(phase, batch, FLOOR))} |" if floor else ""))
    return out


def moe_lines(doc: Doc) -> list[str]:
    rows: list[Row] = doc["results"]
    d = doc.get("dims", {})

    def get(tokens: int, who: str) -> Optional[Row]:
        return next((r for r in rows if r["tokens"] == tokens and r["contender"] == who), None)

    out = [caption(doc, f"MoE EP stack ({d.get('model', '?')}, {d.get('layers', '?')} layers, top-{d.get('topk', '?')} "
                        f"of {d.get('experts', '?')} experts)") + "; torch all_to_all eagerly (it reads the counts "
           "on the host), ironlink in a CUDA graph", "",
           "| tokens / rank | torch all_to_all | ironlink | x torch |", "|---|---|---|---|"]
    # The step's parts, where the run timed them.
    parts = dict(zip(PARTS, ("experts alone (no exchange)", "ironlink's exchange alone",
                             "experts on ironlink's received rows")))
    timed = any(r["contender"] in parts for r in rows)
    if timed:
        out[-2] += " " + " | ".join(parts.values()) + " |"
        out[-1] += "---|" * len(parts)
    for t in sorted({r["tokens"] for r in rows}):
        theirs, mine = get(t, "torch_a2a"), get(t, "ironlink")
        line = f"| {t} | {ms(theirs)} | {ms(mine)} | {ratio(theirs, mine)} |"
        if timed:
            line += "".join(f" {ms(get(t, who))} |" for who in parts)
        out.append(line)
    return out


def block(results: Path = RESULTS) -> str:
    parts = [dense_lines(doc) for doc in newest_by_world("e2e", results)]
    parts += [moe_lines(doc) for doc in newest_by_world("e2e_moe", results)]
    if not parts:
        return ("No model-step measurement committed yet (`make bench-e2e`: bench/e2e.py and "
                "bench/e2e_moe.py).\n")
    plot = f"![each contender's step against nccl's and torch all_to_all's]({PLOT})"
    return "\n\n".join(["\n".join(p) for p in parts] + [plot]) + "\n"


def write() -> None:
    DOC.write_text(replace_between(DOC.read_text(), BEGIN, END, block(), "README.md"))
    print("wrote the model-step block of README.md")


if __name__ == "__main__":
    write() if "--write" in sys.argv[1:] else print(block(), end="")
