"""README.md's model-step plot (issue 63 item 4): each contender's step against the reference's,
per phase, from the newest timed bench/results/e2e-*.json and e2e_moe-*.json of each world size
(the runs e2e_table.py tabulates), one row of panels a world: the dense stack (x nccl: nccl's ms
over the contender's) and the MoE stack (x torch all_to_all).

    python3 bench/report/e2e_plot.py      # writes docs/img/e2e-model-step.png (`make docs` runs it)

Needs matplotlib (requirements-dev.txt). Nothing to draw (no timed run committed): nothing written.
e2e_table.py's block links the PNG once a run exists; tests/packaging/test_readme_bench.py checks
that it is there.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "report"))  # e2e_table.py beside this file, whether run or loaded by path
import e2e_table  # noqa: E402  the runs it tabulates, and the PNG's name

DENSE = ("torch_symm", "ironlink", "ironlink_compile")  # against nccl
MOE = ("ironlink",)  # against torch_a2a

Row = dict[str, Any]


def speedups(rows: list[Row], keys: list[tuple[Any, ...]], key_of: Any, reference: str,
             who: str) -> list[Optional[float]]:
    """For each key, the reference's ms over `who`'s (None where either has no time)."""
    def ms(k: tuple[Any, ...], name: str) -> Optional[float]:
        r = next((r for r in rows if key_of(r) == k and r["contender"] == name), None)
        return None if r is None or not r.get("ms") else float(r["ms"])

    out: list[Optional[float]] = []
    for k in keys:
        theirs, mine = ms(k, reference), ms(k, who)
        out.append(None if theirs is None or mine is None else theirs / mine)
    return out


def _bars(ax: Any, labels: list[str], series: list[tuple[str, list[Optional[float]]]], title: str,
          reference: str) -> None:
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, [v or 0.0 for v in values], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel(f"x {reference} (higher is better)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    ax.grid(True, axis="y", alpha=0.3)


def draw(results: Optional[Path] = None, out: Optional[Path] = None) -> Optional[Path]:
    """Writes the PNG (to `out`, default the one README.md links) from the newest timed runs
    under `results` (default bench/results/); None (and nothing written) where there are none."""
    table = e2e_table
    where = results or table.RESULTS
    dense = {d["world_size"]: d for d in table.newest_by_world("e2e", where)}
    moe: dict[int, list[Any]] = {}  # each world's runs, one a model
    for d in table.newest_by_world("e2e_moe", where):
        moe.setdefault(d["world_size"], []).append(d)
    worlds = sorted(set(dense) | set(moe))
    if not worlds:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(worlds), 2, figsize=(12, 3.6 * len(worlds)), squeeze=False, constrained_layout=True)
    for (dense_ax, moe_ax), w in zip(axes, worlds):
        if w in dense:
            rows = dense[w]["results"]
            keys = sorted({(r["phase"], r["batch"]) for r in rows}, key=lambda k: (k[0] != "decode", k[1]))
            labels = [f"{p} b{b}" for p, b in keys]
            series = [(who, speedups(rows, keys, lambda r: (r["phase"], r["batch"]), "nccl", who)) for who in DENSE]
            _bars(dense_ax, labels, series, f"dense TP stack, {w} x {dense[w]['gpu']} ({dense[w]['git_rev']})", "nccl")
        else:
            dense_ax.set_axis_off()
        if w in moe:
            runs = moe[w]
            rows = [{**r, "experts": run.get("dims", {}).get("experts", "?")} for run in runs for r in run["results"]]
            shapes: list[tuple[Any, ...]] = list(dict.fromkeys((r["experts"], r["tokens"]) for r in rows))
            labels = [f"{t} tokens" if len(runs) == 1 else f"{t} tok, {e} exp" for e, t in shapes]
            series = [(who, speedups(rows, shapes, lambda r: (r["experts"], r["tokens"]), "torch_a2a", who))
                      for who in MOE]
            revs = ", ".join(sorted({run["git_rev"] for run in runs}))
            _bars(moe_ax, labels, series, f"MoE EP stack, {w} x {runs[0]['gpu']} ({revs})", "torch all_to_all")
        else:
            moe_ax.set_axis_off()
    out = out or REPO / table.PLOT
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    draw()
