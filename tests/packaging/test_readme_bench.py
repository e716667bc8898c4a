"""README.md's headline table and docs/performance.md's tables are exactly what
bench/report/table.py makes of the committed results (docs/fused.md, moe.md and tutorial.md what
their own scripts in bench/report/ make), and the plots the docs show exist (`make docs`
regenerates all of them)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- bench:begin -->\n", "<!-- bench:end -->"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / "report" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _block(path: Path) -> str:
    text = path.read_text()
    assert BEGIN in text and END in text, f"{path.name} lacks the bench:begin/bench:end markers"
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def test_readme_headline_matches_newest_results() -> None:
    table = _module("table")
    got = _block(REPO / "README.md")
    assert got == table.readme_block(), (
        f"README.md's benchmark table is stale ({table.newest().name}): run `make docs` "
        "(or paste `python3 bench/report/table.py`)")


def test_performance_tables_match_newest_results() -> None:
    table = _module("table")
    got = _block(REPO / "docs" / "performance.md")
    names = ", ".join(p.name for p in table.newest_per_world())
    assert got == table.full_block(), (
        f"docs/performance.md's tables are stale ({names}): run `make docs` "
        "(or paste `python3 bench/report/table.py --full`)")


def test_fused_tables_match_newest_results() -> None:
    fused = _module("fused_table")
    text = (REPO / "docs" / "fused.md").read_text()
    got = text.split(fused.BEGIN, 1)[1].split(fused.END, 1)[0]
    assert got == fused.block(), f"docs/fused.md's tables are stale ({fused.newest()}): run `make docs`"
    got = text.split(fused.SP_BEGIN, 1)[1].split(fused.SP_END, 1)[0]
    assert got == fused.sp_block(), "docs/fused.md's sequence-parallel tables are stale: run `make docs`"


def test_decode_tables_match_newest_results() -> None:
    fused = _module("fused_table")
    for doc in (REPO / "README.md", REPO / "docs" / "fused.md"):
        got = doc.read_text().split(fused.DECODE_BEGIN, 1)[1].split(fused.DECODE_END, 1)[0]
        assert got == fused.decode_block(), f"{doc.name}'s decode table is stale: run `make docs`"


def test_moe_table_matches_newest_results() -> None:
    moe = _module("moe_table")
    text = (REPO / "docs" / "moe.md").read_text()
    got = text.split(moe.BEGIN, 1)[1].split(moe.END, 1)[0]
    assert got == moe.block(), f"docs/moe.md's table is stale ({moe.newest()}): run `make docs`"


def test_e2e_table_matches_newest_results() -> None:
    e2e = _module("e2e_table")
    got = (REPO / "README.md").read_text().split(e2e.BEGIN, 1)[1].split(e2e.END, 1)[0]
    assert got == e2e.block(), "README.md's model-step table is stale: run `make docs`"


def test_e2e_table_takes_each_worlds_newest_timed_run(tmp_path: Path) -> None:
    e2e = _module("e2e_table")
    assert e2e.block(tmp_path).startswith("No model-step measurement committed yet")

    def run(name: str, world: int, date: str, rows: list[dict[str, Any]], check: bool = False) -> None:
        doc = {"date": date, "world_size": world, "gpu": "NVIDIA H200", "git_rev": "abc1234", "check": check,
               "dims": {"model": "m", "layers": 2, "topk": 8, "experts": 64}, "results": rows}
        (tmp_path / name).write_text(json.dumps(doc))

    dense = [{"phase": "decode", "batch": 1, "tokens": 1, "contender": c, "ms": v}
             for c, v in (("nccl", 3.0), ("ironlink", 2.0), ("torch_symm", 2.5))]
    run("e2e-4x-old.json", 4, "2026-11-01T00:00:00", [{**r, "ms": 9.0} for r in dense])
    run("e2e-4x-new.json", 4, "2026-11-02T00:00:00", dense)
    run("e2e-4x-check.json", 4, "2026-11-03T00:00:00", [{**r, "ms": None} for r in dense], check=True)
    run("e2e_moe-2x.json", 2, "2026-11-02T00:00:00", [{"tokens": 128, "contender": "torch_a2a", "ms": 4.0},
                                                     {"tokens": 128, "contender": "ironlink", "ms": 1.0}])
    text = e2e.block(tmp_path)
    assert "| decode | 1 | 1 | 3.000 | 2.500 | 2.000 | - | 1.50 |" in text  # the newest timed run, not the check
    assert "| 128 | 4.000 | 1.000 | 4.00 |" in text and "2 x NVIDIA H200" in text and "4 x NVIDIA H200" in text
    assert text.endswith(f"![each contender's step against nccl's and torch all_to_all's]({e2e.PLOT})\n")
    # The plot's bars: each contender's speedup over the reference, None where either has no time.
    plot = _module("e2e_plot")
    rows = json.loads((tmp_path / "e2e-4x-new.json").read_text())["results"]
    assert plot.speedups(rows, [("decode", 1)], lambda r: (r["phase"], r["batch"]), "nccl", "ironlink") == [1.5]
    assert plot.speedups(rows, [("decode", 1)], lambda r: (r["phase"], r["batch"]), "nccl", "ironlink_compile") == [None]
    pytest.importorskip("matplotlib")
    assert plot.draw(tmp_path, tmp_path / "step.png") == tmp_path / "step.png" and (tmp_path / "step.png").stat().st_size
    assert plot.draw(tmp_path / "none") is None  # no run: nothing drawn


def test_the_moe_step_table_shows_the_steps_parts_where_the_run_timed_them() -> None:
    e2e = _module("e2e_table")
    doc: dict[str, Any] = {"date": "2026-12-01T00:00:00", "world_size": 4, "gpu": "NVIDIA H200", "git_rev": "abc1234",
                           "dims": {"model": "m", "layers": 4, "topk": 8, "experts": 256},
                           "results": [{"tokens": 128, "contender": c, "ms": v} for c, v in
                                       (("torch_a2a", 12.0), ("ironlink", 8.0))]}
    assert e2e.moe_lines(doc)[2:] == ["| tokens / rank | torch all_to_all | ironlink | x torch |", "|---|---|---|---|",
                                      "| 128 | 12.000 | 8.000 | 1.50 |"]
    doc["results"] += [{"tokens": 128, "contender": "experts_only", "ms": 7.4},
                       {"tokens": 128, "contender": "exchange_only", "ms": 0.5}]
    lines = e2e.moe_lines(doc)
    assert lines[2].endswith("| experts alone (no exchange) | ironlink's exchange alone | experts on ironlink's "
                             "received rows |")
    assert lines[3] == "|---|---|---|---|---|---|---|"
    assert lines[4] == "| 128 | 12.000 | 8.000 | 1.50 | 7.400 | 0.500 | - |"  # a part the run did not time: -


def test_the_dense_table_shows_the_floor_where_the_run_timed_it() -> None:
    e2e = _module("e2e_table")
    rows = [{"phase": "decode", "batch": 1, "tokens": 1, "contender": c, "ms": v}
            for c, v in (("nccl", 3.0), ("ironlink", 2.0))]
    doc: dict[str, Any] = {"date": "2026-12-01T00:00:00", "world_size": 4, "gpu": "NVIDIA H200", "git_rev": "abc1234",
                           "dims": {"model": "m", "layers": 8}, "results": rows}
    assert e2e.dense_lines(doc)[-1] == "| decode | 1 | 1 | 3.000 | - | 2.000 | - | 1.50 |"
    rows.append({"phase": "decode", "batch": 1, "tokens": 1, "contender": "compute_only", "ms": 1.5})
    lines = e2e.dense_lines(doc)
    assert lines[2].endswith("| x nccl | no all-reduce (floor) |") and lines[3].count("---") == 9
    assert lines[-1] == "| decode | 1 | 1 | 3.000 | - | 2.000 | - | 1.50 | 1.500 |"


def test_the_moe_stack_keeps_a_table_for_each_model_a_world_ran(tmp_path: Path) -> None:
    e2e, plot = _module("e2e_table"), _module("e2e_plot")

    def run(name: str, date: str, model: str, experts: int, ours: float) -> None:
        doc = {"date": date, "world_size": 4, "gpu": "NVIDIA H200", "git_rev": "abc1234",
               "dims": {"model": model, "layers": 4, "topk": 8, "experts": experts},
               "results": [{"tokens": 128, "contender": "torch_a2a", "ms": 12.0, "model": model},
                           {"tokens": 128, "contender": "ironlink", "ms": ours, "model": model}]}
        (tmp_path / name).write_text(json.dumps(doc))

    run("e2e_moe-4x-a.json", "2026-12-01T00:00:00", "deepseek-v3-moe", 256, 9.0)
    run("e2e_moe-4x-b.json", "2026-12-02T00:00:00", "deepseek-v3-moe-64", 64, 4.0)
    run("e2e_moe-4x-c.json", "2026-12-03T00:00:00", "deepseek-v3-moe-64", 64, 6.0)  # the newest of its model
    text = e2e.block(tmp_path)
    assert text.index("top-8 of 256 experts") < text.index("top-8 of 64 experts")  # the most experts first
    assert "| 128 | 12.000 | 9.000 | 1.33 |" in text and "| 128 | 12.000 | 6.000 | 2.00 |" in text
    assert "| 128 | 12.000 | 4.000 |" not in text
    pytest.importorskip("matplotlib")
    assert plot.draw(tmp_path, tmp_path / "step.png") == tmp_path / "step.png"


def test_the_model_step_plot_is_committed_where_the_table_links_it() -> None:
    e2e = _module("e2e_table")
    if e2e.PLOT in e2e.block():
        assert (REPO / e2e.PLOT).is_file(), f"{e2e.PLOT} is missing: run `make docs`"


def test_tutorial_table_matches_newest_results() -> None:
    tut = _module("tutorial_table")
    text = (REPO / "docs" / "tutorial.md").read_text()
    got = text.split(tut.BEGIN, 1)[1].split(tut.END, 1)[0]
    assert got == tut.block(), f"docs/tutorial.md's table is stale ({tut.newest()}): run `make docs`"


def test_tutorial_table_takes_the_newest_four_rank_run(tmp_path: Path, monkeypatch: Any) -> None:
    tut = _module("tutorial_table")
    monkeypatch.setattr(tut, "RESULTS", tmp_path)
    assert tut.block().startswith("No measurement yet")

    def row(lesson: str, variant: str, world: int, us: float) -> dict[str, Any]:
        return {"lesson": lesson, "title": "all-reduce", "variant": variant, "world": world, "bytes": 1 << 20,
                "us": us, "library": "ironlink.all_reduce", "library_us": 10.0, "gpu": "NVIDIA H200",
                "git_rev": "abc1234", "date": "2026-11-23T10:00:00+00:00"}

    runs = {"tutorial-a.json": ("2026-11-23T10:00:00+00:00", [row("06", "one-shot", 4, 99.0)]),
            "tutorial-b.json": ("2026-11-24T10:00:00+00:00", [row("06", "two-shot", 4, 20.0), row("06", "one-shot", 4, 12.5),
                                                              row("01", "", 2, 1.0)]),
            "tutorial-c.json": ("2026-11-25T10:00:00+00:00", [row("06", "one-shot", 2, 5.0)])}
    for name, (date, rows) in runs.items():
        (tmp_path / name).write_text(json.dumps({"date": date, "results": rows}))
    lines = tut.block().splitlines()
    assert "tutorial-b.json" in lines[0] and "4 x NVIDIA H200" in lines[0], lines[0]
    assert lines[4:] == ["| 06 | all-reduce (one-shot) | 1 MiB | 12.5 | ironlink.all_reduce | 10.0 | 0.80 |",
                         "| 06 | all-reduce (two-shot) | 1 MiB | 20.0 | ironlink.all_reduce | 10.0 | 0.50 |"]


def test_referenced_images_exist() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    seen = 0
    for doc in docs:
        for ref in re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", doc.read_text()):
            seen += 1
            assert (doc.parent / ref).is_file(), f"{doc.relative_to(REPO)} shows {ref}, which does not exist"
    assert seen, "README.md and docs/ show no plot"


def test_plots_of_newest_results_exist() -> None:
    plot = _module("plot")
    for doc in plot.newest_docs():
        for png in plot.outputs(doc):
            assert png.is_file(), f"{png.relative_to(REPO)} is missing: run `make docs`"


def test_readme_headline_plot_is_the_runs_of_its_table() -> None:
    plot, table = _module("plot"), _module("table")
    runs = table.headline_runs()
    want = f"docs/img/{plot.headline_name(runs)}"
    assert (REPO / want).is_file(), f"{want} is missing: run `make docs`"
    assert re.search(r"!\[[^\]]*\]\(" + re.escape(want) + r"\)", (REPO / "README.md").read_text()), (
        f"README.md should show {want}, the plot of the runs its table comes from")


def test_the_headline_plot_takes_ironlink_as_the_table_does() -> None:
    """The public op where the run timed it, else the best launch, at every size both ran."""
    plot, table = _module("plot"), _module("table")
    op = json.loads((REPO / "bench" / "results" / "experiments" / "allreduce-public-op-2xH200-93d22eb.json").read_text())
    best = {**op, "results": [r for r in op["results"] if not r["contender"].startswith("ironlink_op")]}
    for doc, what, who in ((op, "ironlink.all_reduce", "ironlink_op"), (best, "best launch", "ironlink")):
        points, said = plot.headline_series(doc)
        assert said == what and points
        for n, il, nc in points:
            assert il == table.get(doc["results"], "all_reduce", table.HEADLINE_DTYPE, n, who)["us"]
            assert nc == table.get(doc["results"], "all_reduce", table.HEADLINE_DTYPE, n, "nccl")["us"]
    assert plot.headline_name([op, {**best, "world_size": 4}]) == "allreduce-bf16-2xH200-4xH200.png"


def test_tables_show_the_public_op_where_a_run_timed_it() -> None:
    """A run with `ironlink_op` rows (bench/allreduce.py times the public ironlink.all_reduce)
    gets its column in the headline and the per-world tables; a run without has none."""
    table = _module("table")
    doc = json.loads((REPO / "bench" / "results" / "experiments" / "allreduce-public-op-2xH200-93d22eb.json").read_text())
    op = {r["bytes"]: r["us"] for r in doc["results"]
          if r["collective"] == "all_reduce" and r["dtype"] == "bf16" and r["contender"] == "ironlink_op"}
    head = table.headline(doc).splitlines()
    assert "| ironlink us | ironlink.all_reduce us |" in head[2]
    one_kib = next(line for line in head if line.startswith("| 1 KiB |"))
    assert one_kib.split("|")[3].strip() == f"{op[1024]:.2f}"
    full = table.tables(doc)
    assert "| op us | op no PDL us |" in full
    row = next(line for line in full.splitlines() if line.startswith("| 256 KiB |"))
    assert row.split("|")[5].strip() == f"{op[262144]:.2f}" and row.split("|")[6].strip() == "-"
    doc["results"] = [r for r in doc["results"] if not r["contender"].startswith("ironlink_op")]
    assert "ironlink.all_reduce us" not in table.headline(doc) and "op us" not in table.tables(doc)


def test_the_headline_puts_the_newest_run_of_worlds_2_and_4_side_by_side() -> None:
    """README.md's table: one ironlink / NCCL / x triple per world, the public op where the run
    timed it (else the best launch, said so), each run named."""
    table = _module("table")
    runs = table.headline_runs()
    assert [int(d["world_size"]) for d in runs] == [w for w in table.HEADLINE_WORLDS
                                                   if any(int(table.load(p)["world_size"]) == w for p in table.newest_per_world())]
    op = json.loads((REPO / "bench" / "results" / "experiments" / "allreduce-public-op-2xH200-93d22eb.json").read_text())
    best = {**op, "world_size": 4, "results": [r for r in op["results"] if not r["contender"].startswith("ironlink_op")]}
    text = table.worlds_headline([op, best])
    assert "world 2: ironlink us | NCCL us | x NCCL | world 4: ironlink us | NCCL us | x NCCL |" in text
    assert "(ironlink: ironlink.all_reduce)" in text and "(ironlink: best launch)" in text
    one_kib = next(line for line in text.splitlines() if line.startswith("| 1 KiB |")).split("|")
    us = {c: r["us"] for r in op["results"] for c in ("ironlink_op", "ironlink", "nccl")
          if (r["collective"], r["dtype"], r["bytes"], r["contender"]) == ("all_reduce", "bf16", 1024, c)}
    assert [x.strip() for x in one_kib[2:8]] == [f"{us['ironlink_op']:.2f}", f"{us['nccl']:.2f}",
                                                f"{us['nccl'] / us['ironlink_op']:.2f}", f"{us['ironlink']:.2f}",
                                                f"{us['nccl']:.2f}", f"{us['nccl'] / us['ironlink']:.2f}"]


def test_fused_table_names_todays_matmul_default_where_the_run_recorded_its_sms() -> None:
    """docs/fused.md's "fused (method)" for matmul_all_reduce: the per-method row of the method
    `ironlink.tuning.matmul_method` picks today where the run recorded its SM count, else the
    run's own default."""
    fused_table = _module("fused_table")
    row = {"op": "matmul_allreduce", "contender": "ironlink_fused", "M": 16, "N": 8192, "us": 26.0,
           "method": "push", "config": [16, 64, 128, 8, 4, 4]}  # 128 tiles: one wave on 132 SMs
    rows = [row, {**row, "contender": "ironlink_fused[lamport]", "us": 21.0},
            {**row, "contender": "ironlink_fused[push]", "us": 25.9}]
    doc = {"world_size": 2, "results": rows}
    assert fused_table.matmul_default(doc, row) == ("push", 26.0)  # no SM count: as recorded
    assert fused_table.matmul_default({**doc, "sms": 132}, row) == ("lamport", 21.0)
    assert fused_table.matmul_default({**doc, "sms": 132, "world_size": 4}, row) == ("push", 25.9)
    # Where world 2's table has no matmul entries, the rule, which counts the waves of the run's SMs.
    from ironlink.runtime.tuning import decode_table
    with decode_table.substituted(2, decode_table.table_for(2)._replace(matmul_all_reduce=())):
        assert fused_table.matmul_default({**doc, "sms": 100}, row) == ("push", 25.9)  # two waves
