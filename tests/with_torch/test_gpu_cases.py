"""The GPU workers' case runner (tests/gpu/workers/_cases.py) on the CPU, one rank over gloo: a
case passes or fails as it ran, and a case that failed renews the heap for the cases after it
(docs/device-api.md: after a timeout, close the heap; a rank whose check failed skipped its
frees). Needs torch (skipped without it, as in CI)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from ironlink.runtime.errors import IronlinkError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu" / "workers"))
from _cases import Cases  # noqa: E402


def fails_with(error: Exception):  # type: ignore[no-untyped-def]
    def case() -> None:
        raise error
    return case


def test_every_failed_case_renews_the_heap(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        renewed: list[int] = []
        cases = Cases(renew=lambda: renewed.append(len(renewed)))
        cases.run("passes", lambda: None)
        assert renewed == []
        # A failed check skips the case's frees on this rank only: its heap no longer matches.
        cases.run("a wrong result", fails_with(AssertionError("relative error nan")))
        assert renewed == [0]
        cases.run("a timeout", fails_with(IronlinkError("symm_signal_wait_at recorded TIMEOUT (-7)")))
        assert renewed == [0, 1]
        cases.run("passes after it", lambda: None)
        assert renewed == [0, 1]
        assert (cases.passed, cases.failed) == (2, ["a wrong result", "a timeout"])
        Cases().run("no renew given", fails_with(IronlinkError("TIMEOUT")))  # nothing to call: no error
    finally:
        dist.destroy_process_group()


def test_only_and_skip_choose_the_cases_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$IRONLINK_GPU_ONLY runs the cases whose names contain one of its parts, $IRONLINK_GPU_SKIP
    all but those (run.sh --only, --skip: a suite in two device calls)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        names = ["all_reduce_rmsnorm whole 1x8192", "matmul_all_reduce lamport 16x8192", "all_gather_matmul kernel"]

        def ran(only: str, skip: str) -> list[str]:
            monkeypatch.setenv("IRONLINK_GPU_ONLY", only)
            monkeypatch.setenv("IRONLINK_GPU_SKIP", skip)
            seen: list[str] = []
            cases = Cases()
            for name in names:
                cases.run(name, lambda name=name: seen.append(name))  # type: ignore[misc]
            return seen

        assert ran("", "") == names
        assert ran("all_reduce_rmsnorm|lamport", "") == names[:2]
        assert ran("", "all_reduce_rmsnorm|lamport") == names[2:]
        assert ran("matmul", "all_gather") == names[1:2]
    finally:
        dist.destroy_process_group()


def test_a_reduction_is_checked_against_the_magnitude_of_its_inputs() -> None:
    """Eight ranks' single elements that nearly cancel: a last-bit difference in the order of the
    adds is a large error relative to the result, a small one relative to the inputs."""
    from collectives_worker import Suite

    xs = [torch.tensor([v], dtype=torch.float64) for v in (3.0, -2.5, 1.25, -1.75, 0.5, -0.5, 2.0, -2.0 + 1e-3)]
    for op, want in (("SUM", sum(abs(x) for x in xs)), ("AVG", sum(abs(x) for x in xs) / 8), ("MAX", torch.tensor([3.0], dtype=torch.float64))):
        assert torch.allclose(Suite.magnitude_ref(xs, op), want)


PEER_FAILS = """
import json
import sys
sys.path.insert(0, {workers!r})
import torch, torch.distributed as dist
import _cases
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://{store}", rank=rank, world_size=2)
renewed = []
cases = _cases.Cases(renew=lambda: renewed.append(1))
def case():
    if rank == 0:
        raise AssertionError("rank 0's own check")
    _cases.same_on_all_ranks(torch.ones(4))  # rank 0 never joins this gather
cases.run("a peer fails before a check", case)
cases.run("both check", lambda: _cases.same_on_all_ranks(torch.ones(4)))
print("RESULT", cases.passed, cases.failed, len(renewed), flush=True)
dist.destroy_process_group()
"""


def test_a_rank_at_a_check_that_a_failed_peer_never_joins_fails_the_case_instead_of_waiting(tmp_path: Path) -> None:
    """Rank 0 fails before the case's cross-rank check; rank 1 reaches it. Rank 1 must not wait in
    a gather rank 0 never joins (the hang of fusion at world 8, 2026-11-30): both fail the case,
    both renew the heap, and the next case passes on both."""
    import os
    import subprocess

    workers = str(Path(__file__).resolve().parents[1] / "gpu" / "workers")
    script = PEER_FAILS.format(workers=workers, store=tmp_path / "store")
    env = {k: v for k, v in os.environ.items() if k != "IRONLINK_GPU_STACKS_DIR"}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:  # a rank left waiting (today's failure) does not outlive the test
        for p in procs:
            p.kill()
    for r, out in enumerate(outs):
        assert procs[r].returncode == 0, out
        assert "RESULT 1 ['a peer fails before a check'] 1" in out, out
    assert "a peer failed this case before this check" in outs[1], outs[1]


SLOW_CASE = """
import sys, time
sys.path.insert(0, {workers!r})
import torch.distributed as dist
import _cases
dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
_cases.STUCK_DUMP_S = 1
def slow_case():
    time.sleep(1.6)
_cases.Cases().run("slow", slow_case)
dist.destroy_process_group()
"""


def test_a_slow_case_prints_each_ranks_stacks_to_its_own_file(tmp_path: Path) -> None:
    """With IRONLINK_GPU_VERBOSE=1, a case that outlasts STUCK_DUMP_S writes this rank's stacks
    (where it was) into $IRONLINK_GPU_STACKS_DIR/rank<R>.txt, under the line naming the worker."""
    import os
    import subprocess

    workers = str(Path(__file__).resolve().parents[1] / "gpu" / "workers")
    script = SLOW_CASE.format(workers=workers, store=tmp_path / "store")
    env = dict(os.environ, IRONLINK_GPU_STACKS_DIR=str(tmp_path / "stacks"), IRONLINK_GPU_VERBOSE="1", RANK="3")
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    text = (tmp_path / "stacks" / "rank3.txt").read_text()
    assert text.startswith("# ") and "started; its stacks at SIGTERM follow" in text, text
    assert "Timeout (0:00:01)!" in text and "in slow_case" in text, text


def test_the_kernels_a_run_compiled_are_recorded_and_a_later_run_compiles_them_ahead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$IRONLINK_GPU_COMPILE_RECORD: each compiled kernel is recorded under the case that compiled
    it, as the cases run (a run cut short leaves its record), with the committed entries of the
    cases not run; $IRONLINK_GPU_COMPILE_AHEAD: a later run compiles the selected cases' kernels
    into the Triton cache before the first case (no GPU: Triton compiles for a named target)."""
    import triton.language as tl
    from triton import knobs
    from triton.runtime import driver
    from triton.runtime.jit import MockTensor

    import _cases
    from ironlink.fused.barrier import _barrier_kernel
    from ironlink.runtime import compile_ahead

    monkeypatch.setattr(driver, "_active", compile_ahead._TargetOnly(90))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(_barrier_kernel.fn, "device_caches", defaultdict(_barrier_kernel.fn.create_binder))
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)  # the recorders' hooks go at the end
    records = tmp_path / "records"
    monkeypatch.delenv("IRONLINK_GPU_COMPILE_AHEAD", raising=False)
    monkeypatch.setenv("IRONLINK_SHARED_GPU", "0")

    def new_run(only: str = "", record: str = "", ahead: str = "", shared: str = "0") -> Path:
        """The environment of a new worker process; its Triton cache."""
        cache = tmp_path / f"cache-{len(list(tmp_path.glob('cache-*')))}"
        for name, value in (("IRONLINK_GPU_ONLY", only), ("IRONLINK_GPU_COMPILE_RECORD", record),
                            ("IRONLINK_GPU_COMPILE_AHEAD", ahead), ("IRONLINK_SHARED_GPU", shared),
                            ("TRITON_CACHE_DIR", str(cache))):
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(_cases, "RECORDER", compile_ahead.Recorder())
        monkeypatch.setattr(_cases, "_compiled_ahead", False)
        return cache

    def cubins_after_compiling_ahead(only: str, shared: str = "0") -> list[Path]:
        cache = new_run(only, ahead=str(records), shared=shared)
        Cases()
        return list(cache.rglob("*.cubin"))

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        new_run(record=str(records))
        cases = Cases()
        cases.run("a barrier", lambda: _barrier_kernel.warmup(2**40, MockTensor(tl.int32), grid=(1,)))
        (entry,) = compile_ahead.read(records / _cases.record_name())  # before the report: a cut run's
        assert (entry.module, entry.qualname, entry.case) == ("ironlink.fused.barrier", "_barrier_kernel", "a barrier")
        assert cases.report("smoke", 1, 0.0) == 0
        assert compile_ahead.read(records / _cases.record_name()) == [entry]
        assert len(cubins_after_compiling_ahead("")) == 1
        assert cubins_after_compiling_ahead("other cases") == []
        # A run of other cases keeps the committed entries of the cases it left out, from its start.
        new_run("other cases", record=str(tmp_path / "records-of-other-cases"), ahead=str(records))
        cases = Cases()
        assert compile_ahead.read(tmp_path / "records-of-other-cases" / _cases.record_name()) == [entry]
        assert cases.report("smoke", 1, 0.0) == 0
        assert compile_ahead.read(tmp_path / "records-of-other-cases" / _cases.record_name()) == [entry]
        # Ranks sharing GPUs and no record of their own: the other record's kernels.
        assert len(cubins_after_compiling_ahead("", shared="1")) == 1
    finally:
        dist.destroy_process_group()


RECORDS = sorted((Path(__file__).resolve().parents[1] / "gpu" / "compile_ahead").glob("*.jsonl.gz"))


@pytest.mark.parametrize("record", RECORDS, ids=[r.name for r in RECORDS])
def test_each_committed_record_names_kernels_that_exist_with_those_parameters(
        record: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel renamed, removed or given other parameters since its record was made would only
    compile at its launch again (time, not a failure): this says which record to make again
    (docs/gpu-testing.md, "Compiling ahead")."""
    from ironlink.runtime import compile_ahead

    # A record of a whole program (bench/run.sh's) names the script's own module: as its compile
    # workers do, find it beside the script.
    root = Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(root / "bench"))
    monkeypatch.syspath_prepend(str(root / "bench" / "probes"))
    entries = compile_ahead.read(record)
    assert entries
    stale = []
    for e in entries:
        try:
            kernel = compile_ahead._jit_function(e.module, e.qualname)
        except (ImportError, AttributeError, TypeError) as why:
            stale.append(f"{e.module}.{e.qualname}: {why}")
            continue
        signature = list(json.loads(e.specialization)["signature"])
        if signature != list(kernel.arg_names):
            stale.append(f"{e.module}.{e.qualname}: recorded {signature}, now {kernel.arg_names}")
    assert not stale, "\n".join(sorted(set(stale)))
