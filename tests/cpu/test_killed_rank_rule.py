"""killed-rank's pass rule without a GPU (tests/gpu/workers/killed_rank.py): where ranks share
GPUs under MPS, a survivor on the dead rank's GPU may end in the CUDA error MPS puts in its
context; no other survivor, and no survivor where every rank has a GPU, is excused from TIMEOUT."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu" / "workers"))
import killed_rank  # noqa: E402 - a script beside the GPU workers, stdlib only at import

FAULT = {"rank": 1, "device": 1, "status": None, "seconds": 3.0,
         "message": "CUDA driver call cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)"}


def test_a_gpu_mates_cuda_error_is_excused_only_on_the_victims_gpu() -> None:
    assert killed_rank.gpu_mate_fault(FAULT, victim_gpu=1)
    assert not killed_rank.gpu_mate_fault(dict(FAULT, device=0), victim_gpu=1)  # another GPU: must time out


def test_nothing_is_excused_where_every_rank_has_a_gpu() -> None:
    assert not killed_rank.gpu_mate_fault(FAULT, victim_gpu=None)


def test_a_named_status_or_another_error_is_not_the_mps_fault() -> None:
    assert not killed_rank.gpu_mate_fault(dict(FAULT, status=-7), victim_gpu=1)
    assert not killed_rank.gpu_mate_fault(dict(FAULT, message="rank 1: the first all-reduce is wrong"), victim_gpu=1)


def test_the_line_says_when_no_survivor_could_show_the_timeout() -> None:
    mate = dict(FAULT, gpu_mate_fault=True)
    timed = dict(FAULT, rank=0, device=0, status=-7, gpu_mate_fault=False)
    assert not killed_rank.timeout_exercised([mate, dict(mate, rank=2)])
    line = killed_rank.survivors_line([mate, dict(mate, rank=2)], 7.0)
    assert "TIMEOUT path was not exercised" in line and "TIMEOUT on ranks" not in line, line
    assert killed_rank.timeout_exercised([timed, mate])
    line = killed_rank.survivors_line([timed, mate], 7.0)
    assert line.startswith("TIMEOUT on ranks [0] after [3.0] s (bound 7.0 s)") and "ranks [1], on the victim's GPU" in line
    assert "not exercised" not in line, line
