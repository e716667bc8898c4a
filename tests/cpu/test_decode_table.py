"""The decode tables (ironlink.runtime.tuning.decode_table), without torch or a GPU: lookups in a table,
the file format and its errors, where a world's table comes from, derived tables, and the ops'
choices following a substituted table."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

from ironlink.fused.all_reduce_rmsnorm import MODES, ONE_NODE_MODES
from ironlink.runtime.tuning import decode_table as dt
from ironlink.runtime import tuning
from ironlink.tune.choose import choose_table

K, M = 1 << 10, 1 << 20
W2 = dt.DecodeTable(((256 * K, "lamport"),),
                    ((256 * K, "split"), (8 * M, "lamport"), (32 * M, "push"), (dt.NO_LIMIT, "rows")))


@pytest.fixture(autouse=True)
def found_afresh() -> Iterator[None]:
    """Each test looks its tables up afresh, and leaves none found behind for the next."""
    dt.forget()
    yield
    dt.forget()


def write(directory: Path, world: int, table: dt.DecodeTable, **info: Any) -> Path:
    path = dt.table_path(directory, world)
    dt.write_file(path, dt.document(world, table, {"gpu": "test", **info}, {}))
    return path


def test_lookups_in_a_table() -> None:
    assert [W2.all_reduce_path(n) for n in (1, 256 * K, 256 * K + 1)] == ["lamport", "lamport", "library"]
    assert W2.rmsnorm_modes(1) == ("split", "lamport", "push", "rows")
    assert W2.rmsnorm_modes(8 * M + 1) == ("push", "rows")
    last = dt.DecodeTable((), ((16 * K, "whole"), (1 * M, "rows")))
    assert last.rmsnorm_modes(2 * M) == ("rows",)  # past the last entry, the last mode


def test_file_round_trip(tmp_path: Path) -> None:
    timings = {"all_reduce": {1024: {"lamport": 2.5, "library": 4.25}}, "all_reduce_rmsnorm": {16384: {"rows": 9.0}}}
    path = tmp_path / "sub" / "decode-w2.json"  # the folder is made
    dt.write_file(path, dt.document(2, W2, {"gpu": "NVIDIA H200", "hidden": 8192}, timings))
    assert dt.read_file(path, 2) == W2
    doc = json.loads(path.read_text())
    assert doc["format"] == dt.FORMAT and doc["world"] == 2 and doc["gpu"] == "NVIDIA H200"
    assert doc["all_reduce_rmsnorm"][0] == [256 * K, "split"]
    assert doc["timings"]["all_reduce"] == {"1024": {"lamport": 2.5, "library": 4.25}}
    assert [p.name for p in path.parent.iterdir()] == ["decode-w2.json"]  # no temporary file left


def test_matmul_methods_are_an_optional_part_of_a_file(tmp_path: Path) -> None:
    measured = W2._replace(matmul_all_reduce=((512 * K, "lamport"), (8 * M, "push")))
    assert [measured.matmul_method(n) for n in (1, 512 * K, 8 * M, 8 * M + 1)] == ["lamport", "lamport", "push", None]
    assert W2.matmul_method(1) is None  # not measured: the op's rule
    path = write(tmp_path, 2, measured)
    assert json.loads(path.read_text())["matmul_all_reduce"] == [[512 * K, "lamport"], [8 * M, "push"]]
    assert dt.read_file(path, 2) == measured
    assert "matmul_all_reduce" not in json.loads(write(tmp_path, 2, W2).read_text())  # older files: the same
    assert dt.read_file(path, 2) == W2
    path.write_text(json.dumps({"format": 1, "world": 2, "all_reduce": [], "all_reduce_rmsnorm": [[1, "rows"]],
                                "matmul_all_reduce": [[1, "cublas"]]}))
    with pytest.raises(ValueError, match=r"'matmul_all_reduce': 'cublas' is not one of \('push', 'lamport', 'tile'\)"):
        dt.read_file(path, 2)


def test_the_matmul_method_follows_the_table_where_measured() -> None:
    from ironlink.fused.matmul_all_reduce import plan
    from ironlink.runtime.tensor_spec import TensorSpec

    def method(m: int, world: int) -> str:
        a = TensorSpec("a", (m, 1024), "bfloat16", 2, True, "cuda:0", 1 << 30)
        b = TensorSpec("b", (1024, 8192), "bfloat16", 2, True, "cuda:0", 2 << 30)
        out = TensorSpec("out", (m, 8192), "bfloat16", 2, True, "cuda:0", 3 << 30)
        return plan(a, b, out, "cuda:0", world, 132).method

    assert (method(16, 2), method(16, 4), method(4096, 2)) == ("lamport", "push", "push")  # the rule
    with dt.substituted(4, dt.find(4, Path("/nonexistent")).table._replace(matmul_all_reduce=((256 * K, "lamport"),))):
        assert method(16, 4) == "lamport"  # 16 x 8192 x 2 bytes: measured
        assert method(4096, 4) == "push"  # past the entries: the rule
    # Derived for a larger world, a lamport entry covers the bytes its copies cover where measured.
    t = dt.DecodeTable(matmul_all_reduce=((300 * K, "lamport"), (8 * M, "push")))
    assert dt.derive(t, 4, 8).matmul_all_reduce == ((300 * K * 3 // 7, "lamport"), (8 * M, "push"))


@pytest.mark.parametrize("doc, words", [
    ("{not json", "not a JSON decode table"),
    ([], "not a JSON object"),
    ({"format": 2, "world": 2, "all_reduce": [], "all_reduce_rmsnorm": [[1, "rows"]]}, "format 2, this ironlink"),
    ({"world": 2, "all_reduce": [], "all_reduce_rmsnorm": [[1, "rows"]]}, "format None"),
    ({"format": 1, "world": 4, "all_reduce": [], "all_reduce_rmsnorm": [[1, "rows"]]}, "world 4"),
    ({"format": 1, "world": 2, "all_reduce_rmsnorm": [[1, "rows"]]}, "'all_reduce' must be a list"),
    ({"format": 1, "world": 2, "all_reduce": [[1, "nccl"]], "all_reduce_rmsnorm": [[1, "rows"]]},
     "'nccl' is not one of ('lamport', 'library')"),
    ({"format": 1, "world": 2, "all_reduce": [], "all_reduce_rmsnorm": [[1, "fastest"]]}, "'fastest' is not one of"),
    ({"format": 1, "world": 2, "all_reduce": [], "all_reduce_rmsnorm": [[2, "rows"], [2, "whole"]]},
     "positive and ascending, got 2 after 2"),
    ({"format": 1, "world": 2, "all_reduce": [], "all_reduce_rmsnorm": [[0, "rows"]]}, "positive and ascending"),
    ({"format": 1, "world": 2, "all_reduce": [[True, "lamport"]], "all_reduce_rmsnorm": [[1, "rows"]]},
     "is not [max_bytes, name]"),
    ({"format": 1, "world": 2, "all_reduce": [], "all_reduce_rmsnorm": [[1.5, "rows"]]}, "is not [max_bytes, name]"),
    ({"format": 1, "world": 2, "all_reduce": [], "all_reduce_rmsnorm": []}, "'all_reduce_rmsnorm' is empty"),
])
def test_a_malformed_file_is_refused_by_name(tmp_path: Path, doc: Any, words: str) -> None:
    path = dt.table_path(tmp_path, 2)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ValueError) as e:
        dt.read_file(path, 2)
    assert str(path) in str(e.value) and words in str(e.value), str(e.value)
    # Never passed over: the lookup that finds it raises too.
    with pytest.raises(ValueError, match="decode-w2.json"):
        dt.find(2, tmp_path)


def test_the_user_file_beats_the_committed_one_which_beats_a_derived_one(tmp_path: Path) -> None:
    user, committed = tmp_path / "user", tmp_path / "committed"
    write(committed, 2, W2)
    assert dt.find(2, user, committed) == dt.InUse(W2, str(committed / "decode-w2.json"))
    mine = dt.DecodeTable((), ((dt.NO_LIMIT, "whole"),))
    write(user, 2, mine)
    assert dt.find(2, user, committed) == dt.InUse(mine, str(user / "decode-w2.json"))
    # World 4 has no file: derived from world 2's table in use, the user's.
    assert dt.find(4, user, committed).source == f"derived from {user / 'decode-w2.json'} (world 2)"
    write(committed, 4, W2._replace(all_reduce=()))
    assert dt.find(4, user, committed).source == str(committed / "decode-w4.json")


def test_a_table_measured_on_this_gpu_is_preferred_and_another_gpus_is_never_used_silently(tmp_path: Path) -> None:
    user, committed = tmp_path / "user", tmp_path / "committed"
    write(committed, 2, W2, gpu="NVIDIA H200")
    mine = dt.DecodeTable((), ((dt.NO_LIMIT, "whole"),))
    write(user, 2, mine, gpu="NVIDIA H100 80GB HBM3")  # e.g. a home folder shared with other nodes
    # On an H200, the user's H100 file is passed over for the committed H200 table, and said so.
    found = dt.find(2, user, committed, gpu="NVIDIA H200")
    assert (found.table, found.source) == (W2, str(committed / "decode-w2.json"))
    assert "passed over" in found.warning
    assert f"{user / 'decode-w2.json'} (measured on NVIDIA H100 80GB HBM3)" in found.warning
    # On the H100, its own file, with nothing to say; without a GPU at hand (planning on the CPU),
    # the first file, as before.
    assert dt.find(2, user, committed, gpu="NVIDIA H100 80GB HBM3") == dt.InUse(mine, str(user / "decode-w2.json"))
    assert dt.find(2, user, committed) == dt.InUse(mine, str(user / "decode-w2.json"))
    # On a GPU neither measured: the first file, with a warning naming both GPUs and the tuner.
    other = dt.find(2, user, committed, gpu="NVIDIA A100-SXM4-80GB")
    assert other.table == mine
    assert "measured on NVIDIA H100 80GB HBM3, this GPU is NVIDIA A100-SXM4-80GB" in other.warning
    assert "torchrun --nproc_per_node=2 -m ironlink.tune" in other.warning
    # A derived table carries its base's warning; a file that names no GPU matches any.
    assert dt.find(4, user, committed, gpu="NVIDIA A100-SXM4-80GB").warning == other.warning
    write(user, 2, mine, gpu=None)
    assert dt.find(2, user, committed, gpu="NVIDIA A100-SXM4-80GB") == dt.InUse(mine, str(user / "decode-w2.json"))
    # What the tuner asks before it writes over a file: the GPU it names, if any.
    assert dt.measured_on(committed / "decode-w2.json") == "NVIDIA H200"
    assert dt.measured_on(user / "decode-w2.json") is None and dt.measured_on(tmp_path / "none.json") is None
    (tmp_path / "bad.json").write_text("{")
    assert dt.measured_on(tmp_path / "bad.json") is None


def test_the_ops_warn_once_where_their_table_was_measured_on_another_gpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dt.TUNING_DIR_ENV, str(tmp_path / "empty"))
    monkeypatch.setattr(dt, "this_gpu", lambda: "NVIDIA A100-SXM4-80GB")
    with pytest.warns(UserWarning, match="this GPU is NVIDIA A100-SXM4-80GB"):
        assert dt.in_use(2).source == str(dt.COMMITTED_DIR / "decode-w2.json")  # the H200s' table, still used
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dt.in_use(2)  # found once: said once
    dt.forget()
    monkeypatch.setattr(dt, "this_gpu", lambda: json.loads((dt.COMMITTED_DIR / "decode-w2.json").read_text())["gpu"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dt.in_use(2).warning == ""


@pytest.mark.parametrize("world", [2, 4])
def test_the_committed_tables_are_what_the_tuner_chose_from_their_timings(world: int) -> None:
    path = dt.COMMITTED_DIR / f"decode-w{world}.json"
    found = dt.find(world, Path("/nonexistent"))
    assert found.source == str(path)
    doc = json.loads(path.read_text())
    timings = {op: {int(n): t for n, t in by.items()} for op, by in doc["timings"].items()}
    assert timings["all_reduce"] and timings["all_reduce_rmsnorm"], "a tuner run's file, with its timings"
    assert found.table == choose_table(timings["all_reduce"], timings["all_reduce_rmsnorm"], MODES,
                                       [m for m in MODES if m not in ONE_NODE_MODES], timings.get("matmul_all_reduce"))


def test_world_8_derives_from_world_4_the_nearest_smaller(tmp_path: Path) -> None:
    found = dt.find(8, tmp_path)
    assert found.table == dt.derive(dt.find(4, tmp_path).table, 4, 8)
    assert found.source == f"derived from {dt.COMMITTED_DIR / 'decode-w4.json'} (world 4)"


def test_derived_one_shot_limits_scale_by_the_copies_sent() -> None:
    # World 8 from world 2: each rank sends 7 copies where it sent 1, so a one-shot entry covers a
    # seventh of the bytes; "rows" keeps its limit.
    assert dt.derive(W2, 2, 8) == dt.DecodeTable(
        ((256 * K // 7, "lamport"),),
        ((256 * K // 7, "split"), (8 * M // 7, "lamport"), (32 * M // 7, "push"), (dt.NO_LIMIT, "rows")))
    assert dt.derive(W2, 2, 3).all_reduce == ((128 * K, "lamport"),)
    # From a larger world: kept.
    assert dt.derive(W2, 4, 2) == W2
    # An entry that no longer reaches past the one before it covers nothing: dropped.
    t = dt.DecodeTable((), ((64 * K, "whole"), (128 * K, "lamport"), (1 * M, "rows")))
    assert dt.derive(t, 2, 8).all_reduce_rmsnorm == ((64 * K, "whole"), (1 * M, "rows"))
    # World 1 has no peers: no one-shot path.
    assert dt.derive(W2, 2, 1) == dt.DecodeTable((), ((dt.NO_LIMIT, "rows"),))


def test_a_world_without_a_smaller_one_derives_from_the_nearest_larger(tmp_path: Path) -> None:
    write(tmp_path, 4, W2._replace(all_reduce=()))
    write(tmp_path, 8, dt.DecodeTable())
    assert dt.find(3, tmp_path, tmp_path / "none").source.endswith("decode-w4.json (world 4)")
    assert dt.find(6, tmp_path, tmp_path / "none").source.endswith("decode-w4.json (world 4)")
    assert dt.find(2, tmp_path, tmp_path / "none").table == W2._replace(all_reduce=())  # kept, from larger
    with pytest.raises(ValueError, match="no decode table for world 2"):
        dt.find(2, tmp_path / "a", tmp_path / "b")


def test_the_ops_read_the_users_folder_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dt.TUNING_DIR_ENV, str(tmp_path))
    assert dt.tuning_dir() == tmp_path
    assert tuning.rmsnorm_mode(1, 16384, 2) == "split"  # the committed table
    write(tmp_path, 2, dt.DecodeTable(((1 * M, "lamport"),), ((dt.NO_LIMIT, "push"),)))
    assert tuning.rmsnorm_mode(1, 16384, 2) == "split"  # found once, kept
    dt.forget()
    assert tuning.rmsnorm_mode(1, 16384, 2) == "push" and tuning.all_reduce_takes_lamport(1 * M, 2)
    assert dt.in_use(2).source == str(tmp_path / "decode-w2.json")


def test_the_default_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(dt.TUNING_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert dt.tuning_dir() == tmp_path / "ironlink"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dt.tuning_dir() == tmp_path / ".cache" / "ironlink"


def test_the_ops_follow_a_substituted_table() -> None:
    assert tuning.all_reduce_takes_lamport(1024, 2) and tuning.rmsnorm_mode(1, 16384, 2) == "split"
    library = dt.DecodeTable((), ((16 * K, "whole"), (dt.NO_LIMIT, "push")))
    with dt.substituted(2, library):
        assert dt.in_use(2) == dt.InUse(library, "substituted")
        assert not tuning.all_reduce_takes_lamport(1024, 2)
        assert tuning.rmsnorm_mode(1, 16384, 2) == "whole" and tuning.rmsnorm_mode(2, 16384, 2) == "push"
        with dt.substituted(2, W2._replace(all_reduce=((dt.NO_LIMIT, "lamport"),))):
            assert tuning.all_reduce_takes_lamport(1 << 30, 2)
        assert not tuning.all_reduce_takes_lamport(1024, 2)
        assert tuning.rmsnorm_mode(1, 16384, 4) == "split"  # other worlds keep theirs
    assert tuning.all_reduce_takes_lamport(1024, 2) and tuning.rmsnorm_mode(1, 16384, 2) == "split"
    with pytest.raises(RuntimeError):
        with dt.substituted(2, library):
            raise RuntimeError("restored on the way out")
    assert dt.in_use(2).source.endswith("decode-w2.json")


def test_a_mode_that_cannot_run_falls_to_the_next_that_can() -> None:
    # "split" needs two resident slices a row: 67 tokens of hidden 8192 on 132 SMs do not fit.
    assert not tuning.rmsnorm_mode_runs("split", 67, 16384, 2, 132)
    assert all(tuning.rmsnorm_mode_runs(m, 67, 16384, 2, 132) for m in MODES if m != "split")
    # "two_shot" holds a row as [world, chunk]: a power-of-two world only; world 3 takes the next entry.
    assert [w for w in range(2, 9) if tuning.rmsnorm_mode_runs("two_shot", 64, 16384, w, 132)] == [2, 4, 8]
    with dt.substituted(3, dt.DecodeTable((), ((4 * M, "two_shot"), (dt.NO_LIMIT, "rows")))):
        assert tuning.rmsnorm_mode(64, 16384, 3, 132) == "rows"
    with dt.substituted(2, dt.DecodeTable((), ((4 * M, "split"), (8 * M, "whole"), (dt.NO_LIMIT, "rows")))):
        assert tuning.rmsnorm_mode(67, 16384, 2, 132) == "whole" and tuning.rmsnorm_mode(8, 16384, 2, 132) == "split"
    with dt.substituted(2, dt.DecodeTable((), ((dt.NO_LIMIT, "split"),))):
        assert tuning.rmsnorm_mode(67, 16384, 2, 132) == "rows"  # none can: rows, which runs at any shape
