"""Plots of a benchmark run: latency and bus bandwidth against message size, ironlink vs NCCL vs
torch symm_mem, one PNG per collective and dtype, under docs/img/; and README.md's headline plot,
the all-reduce at the headline worlds side by side (`draw_headline`).

    python3 bench/report/plot.py                  # the newest run at each world size and the headline (`make docs`)
    python3 bench/report/plot.py FILE.json ...    # these runs

Needs matplotlib (requirements-dev.txt). The file names (`outputs`) depend only on the JSON, so
tests/packaging/test_readme_bench.py can check that the committed PNGs exist without matplotlib.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
IMG = REPO / "docs" / "img"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")

Row = dict[str, Any]


def _table() -> Any:
    """bench/report/table.py as a module (it picks the newest runs)."""
    spec = importlib.util.spec_from_file_location("bench_table", Path(__file__).with_name("table.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gpu_short(gpu: str) -> str:
    """'NVIDIA H200' -> 'H200'."""
    return gpu.replace("NVIDIA", "").strip().replace(" ", "-")


def png_name(doc: dict[str, Any], collective: str, dtype: str) -> str:
    return f"{collective.replace('_', '')}-{dtype}-{doc['world_size']}x{gpu_short(doc['gpu'])}.png"


def series(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(collective, dtype) pairs that have both ironlink and NCCL rows, in a fixed order."""
    have = {(r["collective"], r["dtype"]) for r in doc["results"] if r["contender"] == "ironlink"}
    return [(c, d) for c in COLLECTIVES for d in sorted({d for _, d in have}) if (c, d) in have]


def outputs(doc: dict[str, Any]) -> list[Path]:
    """The PNGs `draw(doc)` writes."""
    return [IMG / png_name(doc, c, d) for c, d in series(doc)]


def _line(rows: list[Row], collective: str, dtype: str, who: str) -> list[Row]:
    return sorted((r for r in rows if (r["collective"], r["dtype"], r["contender"]) == (collective, dtype, who)),
                  key=lambda r: int(r["bytes"]))


def _symm_best(rows: list[Row], collective: str, dtype: str) -> list[Row]:
    """torch symm_mem's faster of one-shot and two-shot at each size where either ran."""
    best: dict[int, Row] = {}
    for who in ("symm_one_shot", "symm_two_shot"):
        for r in _line(rows, collective, dtype, who):
            n = int(r["bytes"])
            if n not in best or float(r["us"]) < float(best[n]["us"]):
                best[n] = r
    return [best[n] for n in sorted(best)]


def _size_label(n: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n // size}{unit}"
    return str(n)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _size_and_latency_axes(lat: Any, other: Any, sizes: list[int], xlabel: str) -> None:
    """What both kinds of plot share: message sizes on a log-2 x axis of each panel, and `lat` the
    latency panel (log scale)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    for ax in (lat, other):
        ax.set_xscale("log", base=2)
        # Ticks at powers of 4 only: neighbouring powers of 2 crowd the labels.
        ax.xaxis.set_major_locator(FixedLocator([n for n in sizes if (n.bit_length() - 1) % 2 == 0]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _size_label(int(x))))
        ax.set_xlabel(xlabel)
        ax.grid(True, which="major", alpha=0.3)
    lat.set_yscale("log")
    lat.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    lat.set_ylabel("latency per call (us, log scale)")
    lat.set_title("latency (lower is better)")


def _save(fig: Any, name: str) -> Path:
    out = IMG / name
    IMG.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    _pyplot().close(fig)
    print(f"wrote {out.relative_to(REPO)}")
    return out


def draw(doc: dict[str, Any]) -> list[Path]:
    plt = _pyplot()
    rows: list[Row] = doc["results"]
    written = []
    for collective, dtype in series(doc):
        lines = [("ironlink", _line(rows, collective, dtype, "ironlink"), "C0", "o"),
                 ("NCCL", _line(rows, collective, dtype, "nccl"), "C1", "s")]
        symm = _symm_best(rows, collective, dtype)
        if symm:
            lines.append(("torch symm_mem (best of one-/two-shot)", symm, "C2", "^"))
        fig, (lat, bw) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
        sizes = sorted({int(r["bytes"]) for _, pts, _, _ in lines for r in pts})
        for label, pts, color, marker in lines:
            xs = [int(r["bytes"]) for r in pts]
            lat.plot(xs, [float(r["us"]) for r in pts], marker=marker, color=color, label=label)
            bw.plot(xs, [float(r["busbw_GBs"]) for r in pts], marker=marker, color=color, label=label)
        _size_and_latency_axes(lat, bw, sizes, "message size (bytes)" if collective == "all_reduce"
                               else "gathered / scattered buffer (bytes)")
        bw.set_ylabel("bus bandwidth (GB/s)")
        bw.set_title("bus bandwidth (higher is better)")
        lat.legend(loc="upper left")
        fig.suptitle(f"{collective} {dtype}: {doc['world_size']}x {doc['gpu']}, {doc['date'][:10]}, "
                     f"git {doc['git_rev']} (NCCL {doc['nccl']}, torch {doc['torch']})")
        written.append(_save(fig, png_name(doc, collective, dtype)))
    return written


def headline_name(docs: list[dict[str, Any]]) -> str:
    """The file of `draw_headline(docs)`: the headline dtype, the worlds and their GPUs."""
    worlds = "-".join(f"{d['world_size']}x{gpu_short(d['gpu'])}" for d in docs)
    return f"allreduce-{_table().HEADLINE_DTYPE}-{worlds}.png"


def headline_series(doc: dict[str, Any]) -> tuple[list[tuple[int, float, float]], str]:
    """(bytes, ironlink us, NCCL us) at each size of `doc` where both ran, ironlink as README's
    table takes it (the public op where the run timed it, else the best launch), and which."""
    table = _table()
    rows: list[Row] = doc["results"]
    points, whats = [], set()
    for nc in _line(rows, "all_reduce", table.HEADLINE_DTYPE, "nccl"):
        il, what = table.public_or_best(rows, int(nc["bytes"]))
        if il:
            points.append((int(nc["bytes"]), float(il["us"]), float(nc["us"])))
            whats.add(what)
    return points, " / ".join(sorted(whats))


def draw_headline(docs: list[dict[str, Any]]) -> Path:
    """README.md's plot: the all-reduce against NCCL at each world of `docs` (README's table's
    runs), latency on the left, NCCL's time over ironlink's on the right, one colour a world."""
    dtype = _table().HEADLINE_DTYPE
    fig, (lat, ratio) = _pyplot().subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    sizes: set[int] = set()
    for i, doc in enumerate(docs):
        points, what = headline_series(doc)
        xs = [n for n, _, _ in points]
        sizes.update(xs)
        world, color = doc["world_size"], f"C{i}"
        lat.plot(xs, [il for _, il, _ in points], marker="o", color=color, label=f"ironlink, world {world} ({what})")
        lat.plot(xs, [nc for _, _, nc in points], marker="s", color=color, linestyle="--", alpha=0.7,
                 label=f"NCCL, world {world}")
        ratio.plot(xs, [nc / il for _, il, nc in points], marker="o", color=color,
                   label=f"world {world}: {doc['world_size']}x {gpu_short(doc['gpu'])}, {doc['date'][:10]}, "
                         f"git {doc['git_rev']}")
    ratio.axhline(1.0, color="black", linewidth=0.8)
    _size_and_latency_axes(lat, ratio, sorted(sizes), "message size (bytes)")
    lat.legend(loc="upper left", fontsize="small")
    ratio.set_ylabel("NCCL time / ironlink time")
    ratio.set_title("x NCCL (higher is better; 1 = as fast)")
    ratio.legend(loc="upper right", fontsize="small")
    fig.suptitle(f"all_reduce {dtype} in CUDA graphs, ironlink against NCCL as the world grows")
    return _save(fig, headline_name(docs))


def newest_docs() -> list[dict[str, Any]]:
    """The runs `make docs` draws: the newest at each world size."""
    table = _table()
    return [table.load(p) for p in table.newest_per_world()]


if __name__ == "__main__":
    given = [json.loads(Path(a).read_text()) for a in sys.argv[1:]]
    for d in given or newest_docs():
        draw(d)
    if not given:
        draw_headline(_table().headline_runs())
