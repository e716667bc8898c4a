"""MoeExchange on the CPU (tests/moe_interpreted.py): simulated ranks, Triton's interpreter.
Needs torch, which the CI venv does not carry (its only PyPI wheel pulls in the CUDA libraries):
skipped there; run on any machine with torch, and by the GPU suite's `basics` part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_moe_exchange_interpreted() -> None:
    pytest.importorskip("torch")
    # The caller's PYTHONPATH after ours: Triton 3.6's interpreter needs numpy < 2.4 (2.4 refuses
    # range() over its one-element arrays), which a path entry can supply.
    path = os.pathsep.join(p for p in (str(REPO / "python"), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    r = subprocess.run([sys.executable, str(REPO / "tests" / "moe_interpreted.py")], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ok:") == 11, r.stdout
