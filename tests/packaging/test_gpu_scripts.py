"""The GPU run scripts' process handling, without a GPU: tests/gpu/run_bounded.sh must stop
everything run.sh started at its limit, and tests/gpu/stop_leftovers.sh must stop what an earlier
run left and never the shell that called it; tests/gpu/mps.sh's share for ranks on one GPU must
be one ironlink counts as confined. Fake run.sh and workers stand in for the real ones
(the real run.sh starts each torchrun under `timeout`, which makes a process group of its own:
workers a kill of run.sh's group missed kept a stalled kernel's GPU on 2026-11-29)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"


def _alive(tag: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout
    return out.split()


def _stop(tag: str) -> None:
    subprocess.run(["pkill", "-KILL", "-f", tag], check=False)


def _copy_run_bounded(folder: Path) -> None:
    """run_bounded.sh and the helper it sources, beside the fake run.sh a test writes there."""
    for name in ("run_bounded.sh", "logs.sh"):
        shutil.copy(GPU_DIR / name, folder / name)


def test_run_bounded_stops_workers_under_timeout(tmp_path: Path) -> None:
    tag = f"fake-worker-{uuid.uuid4().hex[:8]}"
    _copy_run_bounded(tmp_path)
    (tmp_path / "run.sh").write_text(
        "#!/usr/bin/env bash\n"
        f"timeout 480 bash -c 'trap \"\" TERM; exec -a {tag} sleep 300' &\n"  # ignores TERM, as a stuck worker may
        "wait\n")
    os.chmod(tmp_path / "run.sh", 0o755)
    try:
        started = time.monotonic()
        done = subprocess.run(["bash", str(tmp_path / "run_bounded.sh"), "1"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 124, done.stdout + done.stderr
        assert "stopping run.sh" in done.stdout
        assert time.monotonic() - started < 30
        assert _alive(tag) == [], "run_bounded.sh left a worker of run.sh running"
    finally:
        _stop(tag)


def test_run_bounded_names_the_case_the_newest_log_last_started(tmp_path: Path) -> None:
    _copy_run_bounded(tmp_path)
    (tmp_path / "run.sh").write_text("#!/usr/bin/env bash\n"
                                     "echo 'case old: started' > \"$OUT/a.log\"; sleep 0.1\n"
                                     "printf 'case x: started\\ncase y, 6 replays: started\\n' > \"$OUT/b.log\"\n"
                                     "sleep 0.1; echo 'no cases here' > \"$OUT/c-rank0.log\"; sleep 300\n")
    os.chmod(tmp_path / "run.sh", 0o755)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(["bash", str(tmp_path / "run_bounded.sh"), "2"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, OUT=str(out)))
    assert done.returncode == 124
    assert "run_bounded: the last case started (b.log): y, 6 replays" in done.stdout, done.stdout


def test_run_bounded_passes_run_sh_status(tmp_path: Path) -> None:
    _copy_run_bounded(tmp_path)
    (tmp_path / "run.sh").write_text("#!/usr/bin/env bash\nexit 3\n")
    os.chmod(tmp_path / "run.sh", 0o755)
    done = subprocess.run(["bash", str(tmp_path / "run_bounded.sh"), "30"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3


def test_run_bounded_packs_the_ranks_stacks_into_one_archive(tmp_path: Path) -> None:
    """The device tool brings back at most eight files: eight ranks' stacks travel as one."""
    import tarfile

    _copy_run_bounded(tmp_path)
    (tmp_path / "run.sh").write_text("#!/usr/bin/env bash\nmkdir -p \"$OUT/stacks\"\n"
                                     "for r in 0 1 2; do echo \"rank $r\" > \"$OUT/stacks/rank$r.txt\"; done\n")
    os.chmod(tmp_path / "run.sh", 0o755)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "IRONLINK_GPU_STACKS_DIR"}
    done = subprocess.run(["bash", str(tmp_path / "run_bounded.sh"), "30"], capture_output=True, text=True,
                          timeout=60, env=dict(env, OUT=str(out)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["stacks.tar.gz"]
    with tarfile.open(out / "stacks.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["stacks", "stacks/rank0.txt", "stacks/rank1.txt", "stacks/rank2.txt"]


def test_stop_leftovers_stops_workers_not_its_caller(tmp_path: Path) -> None:
    tag = f"tests/gpu/workers/fake_{uuid.uuid4().hex[:8]}.py"
    worker = subprocess.Popen(["bash", "-c", f"exec -a '{tag}' sleep 300"])
    try:
        time.sleep(0.5)
        # The caller's own command line names torchrun and a worker too: it must survive.
        # IRONLINK_LEFTOVERS: this test's worker only, not a run of yours on this machine.
        done = subprocess.run(["bash", "-c", f": torchrun {tag}; bash {GPU_DIR / 'stop_leftovers.sh'}; echo survived"],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "IRONLINK_LEFTOVERS": tag.replace(".", "\\.")})
        assert "survived" in done.stdout, done.stdout + done.stderr
        assert worker.wait(timeout=10) == -9
    finally:
        worker.kill()


def test_mps_confine_gives_each_rank_a_share_that_ironlink_counts_as_confined(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/gpu/mps.sh's mps_confine R sets the MPS percentage that ironlink's sm_share takes as
    the rank's own share (`mps_confined`): R ranks' percentages add up to at most 100."""
    from ironlink.runtime.distributed import ENV_MPS_PERCENTAGE, mps_confined

    for ranks in range(1, 9):
        out = subprocess.run(["bash", "-c", f"source {GPU_DIR / 'mps.sh'}; mps_confine {ranks}; "
                              f"echo ${ENV_MPS_PERCENTAGE}"], capture_output=True, text=True, timeout=30)
        percentage = int(out.stdout.strip())
        assert 100 // (ranks + 1) < percentage <= 100 // ranks, (ranks, percentage)
        monkeypatch.setenv(ENV_MPS_PERCENTAGE, str(percentage))
        assert mps_confined(ranks) and not mps_confined(ranks + 1)


def _mps_ready(tmp_path: Path, probe: str, tries: int) -> subprocess.CompletedProcess[str]:
    """tests/gpu/mps.sh's mps_ready with `probe` as its client, no wait between tries, and no MPS
    daemon to restart (nvidia-cuda-mps-control is not on PATH)."""
    env = {**os.environ, "IRONLINK_MPS_PROBE": probe, "IRONLINK_MPS_READY_TRIES": str(tries),
           "IRONLINK_MPS_READY_WAIT_S": "0", "PATH": f"{tmp_path}:/usr/bin:/bin",
           "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log")}
    return subprocess.run(["bash", "-c", f"source {GPU_DIR / 'mps.sh'}; mps_ready"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_mps_ready_waits_until_a_client_gets_in(tmp_path: Path) -> None:
    """After a cut run the MPS server refuses clients until the killed ones are gone: mps_ready
    tries a client until one gets in (here the third), and says nothing."""
    count = tmp_path / "tries"
    probe = f"echo x >> {count}; [ $(wc -l < {count}) -ge 3 ]"
    out = _mps_ready(tmp_path, probe, tries=5)
    assert out.returncode == 0 and out.stdout == "", out
    assert count.read_text().count("x") == 3


def test_mps_ready_restarts_the_daemon_once_then_gives_up(tmp_path: Path) -> None:
    out = _mps_ready(tmp_path, "false", tries=2)
    assert out.returncode == 1
    assert "restarting its daemon" in out.stdout and "could not start the MPS daemon" in out.stdout


def test_mps_ready_default_client_allocates_on_the_gpu(tmp_path: Path) -> None:
    """Its default client is python3 allocating a CUDA tensor (a stand-in python3 records how it was called)."""
    args = tmp_path / "args"
    fake = tmp_path / "python3"
    fake.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {args}\nexit 0\n')
    fake.chmod(0o755)
    env_probe = subprocess.run(["bash", "-c", f"source {GPU_DIR / 'mps.sh'}; unset IRONLINK_MPS_PROBE; "
                                f"PATH={tmp_path}:$PATH mps_ready"], capture_output=True, text=True, timeout=60)
    assert env_probe.returncode == 0, env_probe
    assert args.read_text().splitlines() == ["-c", 'import torch; torch.zeros(1, device="cuda")']


def _bounded(tmp_path: Path, worker: str, limit: int = 1) -> list[str]:
    """run.sh's `bounded` (taken from run.sh as it stands) running `worker` with stdout to a log,
    as run.sh's parts call it: what it says on run.sh's own output (fd 3), then the status."""
    log = tmp_path / "worker.log"
    define = f"eval \"$(sed -n '/^bounded() {{/,/^}}/p' {GPU_DIR / 'run.sh'})\""
    script = (f"source {GPU_DIR / 'logs.sh'}; {define}; exec 3>&1; shared_gpu=; "
              f"bounded {limit} bash -c {shlex.quote(worker)} > {log} 2>&1; echo status $?")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60).stdout.splitlines()


def test_a_run_cut_at_its_limit_names_the_limit_and_the_case_it_was_in(tmp_path: Path) -> None:
    worker = "echo 'case a: started'; echo 'case a: ok in 0.1 s'; echo 'case b, 6 replays: started'; sleep 30"
    assert _bounded(tmp_path, worker) == ["  stopped at its 1 s limit; the last case started: b, 6 replays",
                                          "status 124"]


def test_a_cut_log_without_cases_gives_the_limit_alone_and_a_run_in_time_says_nothing(tmp_path: Path) -> None:
    assert _bounded(tmp_path, "echo compiling; sleep 30") == ["  stopped at its 1 s limit", "status 124"]
    assert _bounded(tmp_path, "echo 'case a: started'; exit 3", limit=30) == ["status 3"]
