"""The benchmark tables of README.md and docs/performance.md, made from bench/results/*.json.

    python3 bench/report/table.py              # print README.md's headline table (newest run at worlds 2 and 4)
    python3 bench/report/table.py --full       # print docs/performance.md's tables (newest run per world size)
    python3 bench/report/table.py FILE.json    # print the full tables of one result file
    python3 bench/report/table.py --write      # rewrite both blocks in place (`make docs` does this)

Each file carries its block between `<!-- bench:begin -->` and `<!-- bench:end -->`.
tests/packaging/test_readme_bench.py checks that both files carry exactly this output for the committed
results, so neither can drift from them.
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
README = REPO / "README.md"
PERFORMANCE = REPO / "docs" / "performance.md"
BEGIN, END = "<!-- bench:begin -->\n", "<!-- bench:end -->"

# The headline table: bf16 all_reduce at these sizes, the newest run of each of these world sizes
# side by side (README.md); `headline` gives one run's (docs, `table.py FILE.json`).
HEADLINE_DTYPE = "bf16"
HEADLINE_SIZES = (1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30)
HEADLINE_WORLDS = (2, 4)

Row = dict[str, Any]


def load(p: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(p.read_text())
    return doc


def newest_per_world() -> list[Path]:
    """The newest run at each world size, largest world first (a 4-GPU run does not replace an
    8-GPU table)."""
    best: dict[int, tuple[str, str, Path]] = {}
    for p in RESULTS.glob("allreduce-*.json"):
        doc = load(p)
        key = (doc["date"], p.name, p)
        world = int(doc["world_size"])
        if world not in best or key[:2] > best[world][:2]:
            best[world] = key
    return [best[w][2] for w in sorted(best, reverse=True)]


def newest() -> Path:
    """The newest run of any world size (by its recorded date)."""
    return max(newest_per_world(), key=lambda p: (load(p)["date"], p.name))


def full_block() -> str:
    """What docs/performance.md carries between its bench markers: the tables of `newest_per_world()`."""
    return "\n".join(tables(load(p)) for p in newest_per_world())


def headline_runs() -> list[dict[str, Any]]:
    """The newest run of each HEADLINE_WORLDS size that has one, smallest world first; else the
    newest run of any size."""
    runs = {int(d["world_size"]): d for d in map(load, newest_per_world())}
    return [runs[w] for w in HEADLINE_WORLDS if w in runs] or [load(newest())]


def readme_block() -> str:
    """What README.md carries between its bench markers: `worlds_headline` of `headline_runs()`."""
    return worlds_headline(headline_runs())


def public_or_best(rows: list[Row], nbytes: int) -> tuple[Optional[Row], str]:
    """ironlink at `nbytes`: the public op where the run timed it, else its best launch; and which."""
    op = get(rows, "all_reduce", HEADLINE_DTYPE, nbytes, "ironlink_op")
    return (op, "ironlink.all_reduce") if op else (get(rows, "all_reduce", HEADLINE_DTYPE, nbytes, "ironlink"), "best launch")


def worlds_headline(docs: list[dict[str, Any]]) -> str:
    """The headline sizes of each run side by side: ironlink, NCCL and their ratio per world."""
    picked = [{n: public_or_best(d["results"], n) for n in HEADLINE_SIZES} for d in docs]  # run -> size -> (row, what)
    whats = []
    for d, pick in zip(docs, picked):
        shown = {what for row, what in pick.values() if row}
        whats.append(f"world {d['world_size']}: {d['world_size']}x {d['gpu']}, {d['date'][:10]}, git {d['git_rev']}, "
                     f"NCCL {d['nccl']} (ironlink: {' / '.join(sorted(shown)) or '-'})")
    out = [f"all_reduce {HEADLINE_DTYPE}, sum, in CUDA graphs, median us per call, max over ranks (lower is better; "
           "each run's method with its tables in docs/performance.md); x = NCCL time / ironlink time; ironlink: the "
           "public ironlink.all_reduce as a user calls it where the run timed it, else ironlink's best launch. "
           f"Runs: {'; '.join(whats)}.",
           "",
           "| size | " + " | ".join(f"world {d['world_size']}: ironlink us | NCCL us | x NCCL" for d in docs) + " |",
           "|---|" + "---|---|---|" * len(docs)]
    for n in HEADLINE_SIZES:
        cells = []
        for d, pick in zip(docs, picked):
            il, nc = pick[n][0], get(d["results"], "all_reduce", HEADLINE_DTYPE, n, "nccl")
            cells.append(f"{il['us']:.2f} | {nc['us']:.2f} | {nc['us'] / il['us']:.2f}" if il and nc else "- | - | -")
        if any(c != "- | - | -" for c in cells):
            out.append(f"| {human(n)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def get(rows: list[Row], coll: str, dt: str, nbytes: int, who: str) -> Optional[Row]:
    return next((r for r in rows if (r["collective"], r["dtype"], r["bytes"], r["contender"]) == (coll, dt, nbytes, who)), None)


def symm_best(rows: list[Row], coll: str, dt: str, nbytes: int) -> Optional[Row]:
    """torch symm_mem's faster of one-shot and two-shot at this size (None if neither ran)."""
    got = [r for r in (get(rows, coll, dt, nbytes, "symm_one_shot"), get(rows, coll, dt, nbytes, "symm_two_shot")) if r]
    return min(got, key=lambda r: float(r["us"])) if got else None


def run_line(doc: dict[str, Any]) -> str:
    return (f"{doc['world_size']}x {doc['gpu']}, {doc['date'][:10]}, git {doc['git_rev']}, torch {doc['torch']}, "
            f"NCCL {doc['nccl']}; {doc['method']}.")


def headline(doc: dict[str, Any]) -> str:
    rows = doc["results"]
    out = [f"all_reduce {HEADLINE_DTYPE}, sum, {run_line(doc)} "
           "us per call (lower is better); x NCCL = NCCL time / ironlink time; torch symm_mem: the faster of "
           "its one-shot and two-shot all-reduce (- where neither runs).",
           "",
           "| size | ironlink us | NCCL us | torch symm_mem us | x NCCL | ironlink busbw GB/s | NCCL busbw GB/s |",
           "|---|---|---|---|---|---|---|"]
    op = any(r["contender"] == "ironlink_op" for r in rows)
    if op:  # the public op measured too: its column after ironlink's best launch
        out[0] += " ironlink.all_reduce: the public op as a user calls it (its own launch and algorithm, PDL)."
        out[2] = out[2].replace("| ironlink us |", "| ironlink us | ironlink.all_reduce us |")
        out[3] += "---|"
    for n in HEADLINE_SIZES:
        il, nc = get(rows, "all_reduce", HEADLINE_DTYPE, n, "ironlink"), get(rows, "all_reduce", HEADLINE_DTYPE, n, "nccl")
        if not il or not nc:
            continue
        public = f" {fmt(get(rows, 'all_reduce', HEADLINE_DTYPE, n, 'ironlink_op'))} |" if op else ""
        out.append(f"| {human(n)} | {il['us']:.2f} |{public} {nc['us']:.2f} | "
                   f"{fmt(symm_best(rows, 'all_reduce', HEADLINE_DTYPE, n))} | "
                   f"{il['vs_nccl']:.2f} | {il['busbw_GBs']:.1f} | {nc['busbw_GBs']:.1f} |")
    return "\n".join(out) + "\n"


def write() -> None:
    for path, block in ((README, readme_block()), (PERFORMANCE, full_block())):
        path.write_text(replace_between(path.read_text(), BEGIN, END, block, str(path.relative_to(REPO))))
        print(f"wrote the bench block of {path.relative_to(REPO)}")


# All-reduce algorithms as the config column names them.
SHORT = {"one_shot_ll": "LL1", "two_shot_ll": "LL2", "two_shot": "2S"}


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n // size} {unit}"
    return f"{n} B"


def fmt(row: Optional[Row]) -> str:
    return f"{row['us']:.2f}" if row else "-"


def tables(doc: dict[str, Any]) -> str:
    rows: list[Row] = doc["results"]
    out = [f"{run_line(doc)} us per call; busbw in GB/s; x = NCCL time / ironlink time.", ""]

    def at(coll: str, dt: str, nbytes: int, who: str) -> Optional[Row]:
        return get(rows, coll, dt, nbytes, who)

    floor = [r for r in rows if r["contender"] == "empty_kernel"]
    if floor:
        out += [f"Launch floor: a kernel that does no communication takes {min(r['us'] for r in floor):.2f} us "
                "per call in the same harness.", ""]
    if any("algorithm" in r for r in rows):
        out += ["Config = algorithm and CTAs x num_warps: LL1 one-shot LL, LL2 two-shot LL, 2S two-shot.", ""]
    sizes = sorted({r["bytes"] for r in rows})
    for dt in sorted({r["dtype"] for r in rows}):
        op = any(r["contender"] == "ironlink_op" and r["dtype"] == dt for r in rows)
        out += [f"all_reduce {dt}" + (" (op: `ironlink.all_reduce` as a user calls it, with PDL and, where "
                                      "measured, without):" if op else ":"), "",
                "| size | ironlink us | busbw | config |" + (" op us | op no PDL us |" if op else "")
                + " NCCL us | busbw | x NCCL | symm one_shot us | symm two_shot us |",
                "|---|---|---|---|" + ("---|---|" if op else "") + "---|---|---|---|---|"]
        for n in sizes:
            il, nc = at("all_reduce", dt, n, "ironlink"), at("all_reduce", dt, n, "nccl")
            if not il or not nc:
                continue
            one, two = at("all_reduce", dt, n, "symm_one_shot"), at("all_reduce", dt, n, "symm_two_shot")
            config = f"{SHORT.get(il.get('algorithm', ''), '')} {il['config']}".strip()
            public = (f" {fmt(at('all_reduce', dt, n, 'ironlink_op'))} | "
                      f"{fmt(at('all_reduce', dt, n, 'ironlink_op[no_pdl]'))} |") if op else ""
            out.append(f"| {human(n)} | {il['us']:.2f} | {il['busbw_GBs']:.1f} | {config} |{public} {nc['us']:.2f} | "
                       f"{nc['busbw_GBs']:.1f} | {il['vs_nccl']:.2f} | {fmt(one)} | {fmt(two)} |")
        out += ["", f"all_gather and reduce_scatter {dt} (size = the gathered / scattered buffer):", "",
                "| size | all_gather ironlink us | NCCL us | x NCCL | reduce_scatter ironlink us | NCCL us | x NCCL |",
                "|---|---|---|---|---|---|---|"]
        for n in sizes:
            ag, agn = at("all_gather", dt, n, "ironlink"), at("all_gather", dt, n, "nccl")
            rs, rsn = at("reduce_scatter", dt, n, "ironlink"), at("reduce_scatter", dt, n, "nccl")
            if ag and agn and rs and rsn:
                out.append(f"| {human(n)} | {ag['us']:.2f} | {agn['us']:.2f} | {ag['vs_nccl']:.2f} | "
                           f"{rs['us']:.2f} | {rsn['us']:.2f} | {rs['vs_nccl']:.2f} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    args = sys.argv[1:]
    if args == ["--write"]:
        write()
    elif args == ["--full"]:
        sys.stdout.write(full_block())
    elif args:
        sys.stdout.write(tables(load(Path(args[0]))))
    else:
        sys.stdout.write(readme_block())
