"""GPU tests of the symmetric heap: drives tests/gpu/workers/heap_worker.py and examples/peer_write.py
under torchrun for world sizes 2, 4 and 8 (those that fit the GPUs present).

Skipped without torch or with fewer than 2 GPUs (with 1 GPU when $IRONLINK_SHARED_GPU=1 lets ranks
share it: then every listed size runs). `IRONLINK_HEAP_WORLDS="2 8"` picks the sizes.
Run with `tests/gpu/run.sh heap` (`--worlds "2 4"` picks the sizes).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the GPU tests need torch")
from ironlink.runtime.distributed import shared_gpu_allowed  # noqa: E402 - after the skip without torch

REPO = Path(__file__).resolve().parents[2]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
SHARED = shared_gpu_allowed()
# How many ranks fit: one per GPU, or (ranks sharing GPUs) any number.
NGPU = 8 if SHARED and GPUS else GPUS
WORLDS = [int(w) for w in os.environ.get("IRONLINK_HEAP_WORLDS", "2 4 8").split()]
FITS = [w for w in WORLDS if w <= NGPU]  # the sizes asked for that the GPUs can run
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

pytestmark = pytest.mark.skipif(NGPU < 2, reason=f"needs at least 2 GPUs, found {NGPU}")


def torchrun(script: str, world: int, timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, **SAFE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", script]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    print(p.stdout[-20000:], p.stderr[-8000:], sep="\n")
    return p


@pytest.mark.parametrize("world", FITS or [pytest.param(0, marks=pytest.mark.skip)])
def test_heap_suite(world):
    p = torchrun("tests/gpu/workers/heap_worker.py", world, timeout=180)
    assert p.returncode == 0 and f"HEAP SUITE world={world}:" in p.stdout, "see the worker output above"


@pytest.mark.skipif(not FITS, reason="no world size of IRONLINK_HEAP_WORLDS fits")
def test_peer_write_example():
    # The largest of the sizes asked for (run.sh --worlds), not of 2, 4 and 8: run.sh confines
    # ranks sharing a GPU to the share of the worlds it was given (8 ranks at world 4's share ran
    # unconfined, 2026-11-30).
    world = max(FITS)
    p = torchrun("examples/peer_write.py", world, timeout=120)
    assert p.returncode == 0
    assert p.stdout.count(": OK, received ranks") == world
