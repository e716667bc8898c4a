"""The decode tuner's pure parts (ironlink.tune.choose: timings in, a table out; its summary) and
its command line, without torch or a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ironlink.fused.all_reduce_rmsnorm import MODES
from ironlink.runtime.tuning import decode_table as dt
from ironlink.tune import choose
from ironlink.tune.__main__ import report

REPO = Path(__file__).resolve().parents[2]
K, M = 1 << 10, 1 << 20


def test_the_fastest_at_each_size_neighbours_merged() -> None:
    timings = {1 * K: {"lamport": 2.0, "library": 4.0}, 4 * K: {"lamport": 2.5, "library": 4.1},
               16 * K: {"lamport": 5.0, "library": 4.5}, 64 * K: {"library": 5.0},
               256 * K: {"lamport": 6.0, "library": 7.0}, 1 * M: {}}
    assert choose.choose_entries(timings, dt.ALL_REDUCE_PATHS) == (
        (4 * K, "lamport"), (64 * K, "library"), (256 * K, "lamport"))


def test_ties_go_the_same_way_every_time() -> None:
    # Equal times: the earlier in the op's order (MODES for all_reduce_rmsnorm), whatever the dict's.
    assert choose.ranked({"whole": 3.0, "rows": 3.0, "push": 1.0}, MODES) == ["push", "rows", "whole"]
    assert choose.ranked({"rows": 3.0, "whole": 3.0}, ("whole", "rows")) == ["whole", "rows"]
    assert choose.ranked({"other": 1.0, "rows": 1.0}, MODES) == ["rows", "other"]  # a name not in order: last
    assert choose.choose_entries({1: {"whole": 1.0, "rows": 1.0}}, MODES) == ((1, "rows"),)


def test_a_table_from_timings() -> None:
    rms = {16 * K: {"rows": 9.0, "whole": 8.0, "split": 7.0}, 128 * K: {"rows": 9.5, "split": 8.0},
           512 * K: {"rows": 12.0, "lamport": 11.0}, 32 * M: {"rows": 150.0, "push": 120.0}}
    table = choose.choose_table({1 * K: {"lamport": 2.0, "library": 3.0}}, rms, MODES)
    assert table == dt.DecodeTable(((1 * K, "lamport"),), ((128 * K, "split"), (512 * K, "lamport"),
                                                            (32 * M, "push")))
    assert choose.choose_table({}, {}, MODES) == dt.DecodeTable()  # nothing measured: rows, the library
    # matmul_all_reduce's methods where measured; past them (and without them) the op's rule.
    mm = {32 * K: {"push": 30.0, "lamport": 21.0, "tile": 40.0}, 512 * K: {"push": 40.0, "lamport": 38.0},
          2 * M: {"push": 140.0, "lamport": 154.0, "tile": 170.0}}
    assert choose.choose_table({}, rms, MODES, matmul=mm).matmul_all_reduce == ((512 * K, "lamport"), (2 * M, "push"))


def test_sizes_past_the_largest_measured_keep_no_workspace() -> None:
    # push won the largest size, but it keeps 2 (world - 1) x in the heap: past 32 MiB, the faster
    # of rows and whole there (rows here); a table whose last mode keeps none is left as it is.
    rms = {16 * K: {"rows": 9.0, "split": 7.0}, 32 * M: {"rows": 150.0, "whole": 155.0, "push": 120.0}}
    table = choose.choose_table({}, rms, MODES, ("rows", "whole"))
    assert table.all_reduce_rmsnorm == ((16 * K, "split"), (32 * M, "push"), (dt.NO_LIMIT, "rows"))
    assert table.rmsnorm_modes(64 * M) == ("rows",)
    rms[32 * M] = {"whole": 100.0, "push": 120.0}
    assert choose.choose_table({}, rms, MODES, ("rows", "whole")).all_reduce_rmsnorm == (
        (16 * K, "split"), (32 * M, "whole"))


def test_the_summary_names_the_choice_and_the_runner_up() -> None:
    lines = choose.summary("ironlink.all_reduce", {1 * K: {"library": 4.5, "lamport": 2.44}, 1 * M: {"library": 20.0}},
                           dt.ALL_REDUCE_PATHS)
    assert lines[0] == "ironlink.all_reduce"
    assert lines[2].split() == ["1", "KiB", "lamport", "2.44", "library", "4.50"]
    assert lines[3].split() == ["1", "MiB", "library", "20.00", "-", "-"]
    assert [choose.size_text(n) for n in (1000, 16 * K, 3 * M, M + 1)] == ["1000 B", "16 KiB", "3 MiB", "1048577 B"]


def test_the_tuner_helps_without_a_gpu() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    out = subprocess.run([sys.executable, "-m", "ironlink.tune", "--help"], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert "--quick" in out and "--hidden" in out and dt.TUNING_DIR_ENV in out


def test_the_report_names_the_file_and_how_the_ops_find_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dt.TUNING_DIR_ENV, str(tmp_path))
    ar, rms = {1 * K: {"lamport": 2.0, "library": 4.0}}, {16 * K: {"rows": 9.0, "whole": 8.0}}
    lines = report(dt.table_path(tmp_path, 2), 2, ar, rms, 16 * K, MODES)
    assert "1 tokens (16 KiB)" in lines[-3] and "whole" in lines[-3]
    assert lines[-2] == f"wrote {tmp_path / 'decode-w2.json'}" and "read it from there" in lines[-1]
    with_matmul = report(dt.table_path(tmp_path, 2), 2, ar, rms, 16 * K, MODES, {16 * K: {"push": 9.0, "lamport": 7.5}})
    assert with_matmul[-5] == "ironlink.matmul_all_reduce" and with_matmul[-3].split()[:5] == [
        "1", "tokens", "(16", "KiB)", "lamport"]
    over_another = report(dt.table_path(tmp_path, 2), 2, ar, rms, 16 * K, MODES, replaced_gpu="NVIDIA H100 80GB HBM3")
    assert over_another[-2] == f"over a table measured on NVIDIA H100 80GB HBM3: where nodes of that GPU share this " \
        f"folder, give each GPU model its own ${dt.TUNING_DIR_ENV} and tune each there."
    elsewhere = report(tmp_path / "mine.json", 2, ar, rms, 16 * K, MODES)
    assert f"point {dt.TUNING_DIR_ENV} at a folder holding it" in elsewhere[-1] and "decode-w2.json" in elsewhere[-1]


def test_progress_rewrites_a_terminal_line_and_writes_a_log_a_line_a_step(capsys: pytest.CaptureFixture[str]) -> None:
    from ironlink.tune.__main__ import Progress

    for in_place in (True, False):
        progress = Progress(True, in_place=in_place)
        for i in (1, 2):
            progress.step("rmsnorm", i, 2, f"tokens={i}")
        out = capsys.readouterr().out
        if in_place:
            assert out.count("\r") == 2 and out.endswith("\n") and out.count("\n") == 1
        else:
            assert "\r" not in out and out.splitlines() == ["rmsnorm 1/2 tokens=1", "rmsnorm 2/2 tokens=2"]
    Progress(False, in_place=False).step("rmsnorm", 1, 1, "")  # not rank 0: nothing
    assert capsys.readouterr().out == ""
