"""Kernels in Triton's interpreter on the CPU, each script run in a subprocess with
TRITON_INTERPRET=1 (the scripts in scripts/, beside this file): the fused ops' flag and slot helpers,
and MoeExchange on simulated ranks (`moe_interpreted.py`, `moe_refusals_interpreted.py`, their
harness `_moe_sim.py`). Needs torch,
which the CI venv does not carry (its only PyPI wheel pulls in the CUDA libraries): skipped there;
run on any machine with torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPTS = HERE / "scripts"


def _interpreted(script: str, timeout: int) -> str:
    """The stdout of tests/with_torch/scripts/<script> in Triton's interpreter; fails on a non-zero exit.
    The caller's PYTHONPATH after ours. What the interpreter lacks (a clock, numpy >= 2.4's
    scalars, low addresses) the scripts take from scripts/_interpreter_shims.py."""
    pytest.importorskip("torch")
    path = os.pathsep.join(p for p in (str(REPO / "python"), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    r = subprocess.run([sys.executable, str(SCRIPTS / script)], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.parametrize("script, says", [
    # The slot kernels' launch counters: every counter advanced, whatever the grid; their halves
    # alternate and stay apart whatever the shapes of consecutive launches.
    ("epochs_interpreted.py", "halves alternate and stay apart whatever the shapes"),
    # Mode split's tagged words: the sum once every slice carries this launch's flag, TIMEOUT on a stale one.
    ("split_sums_interpreted.py", "ok: slice sums once every flag"),
    # Lamport slots: -0.0 sent as +0.0, the receive bitwise, the slots emptied after it, a missing
    # element TIMEOUT (recorded) rather than data.
    ("lamport_interpreted.py", "ok: lamport slots"),
    # MoeExchange's low-latency receive with a peer's rows lost after its count: TIMEOUT, and one
    # timeout a CTA (no wait after the first), counted by the interpreter's clock.
    ("moe_lost_rows_interpreted.py", "done: lost rows end in one timeout a CTA"),
])
def test_flag_and_slot_kernels_interpreted(script: str, says: str) -> None:
    out = _interpreted(script, 300)
    assert says in out, out


@pytest.mark.parametrize("script, says", [
    ("moe_interpreted.py", "done: every MoE check above ran"),
    ("moe_refusals_interpreted.py", "done: every MoE refusal above ran"),
])
def test_moe_exchange_interpreted(script: str, says: str) -> None:
    out = _interpreted(script, 600)
    assert says in out, out
