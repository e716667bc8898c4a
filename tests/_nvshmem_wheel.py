"""The pinned NVSHMEM release's files for the CPU and compile tests (a helper, no tests of its
own): the ``nvidia-nvshmem-cu13==3.4.5`` wheel (the release PyTorch 2.11 ships), downloaded once with
pip into ``build/nvshmem-3.4.5/`` or taken from ``$IRONLINK_NVSHMEM_PINNED_WHEEL``; a test that
needs it skips, saying so, only when that download fails (no network)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PINNED = "3.4.5"
WHEEL_REQ = f"nvidia-nvshmem-cu13=={PINNED}"
CACHE = REPO / "build" / f"nvshmem-{PINNED}"
LIB_DIR = "nvidia/nvshmem/lib"


def _download_wheel() -> Path:
    """The pinned wheel: $IRONLINK_NVSHMEM_PINNED_WHEEL, the cache, or a pip download into the cache."""
    given = os.environ.get("IRONLINK_NVSHMEM_PINNED_WHEEL")
    if given:
        return Path(given)
    wheels = sorted(CACHE.glob(f"nvidia_nvshmem_cu13-{PINNED}-*.whl"))
    if not wheels:
        CACHE.mkdir(parents=True, exist_ok=True)
        # Into a directory of this process's own, then renamed in whole: test processes running
        # in parallel (pytest -n) may download at once, and none may read a half-written wheel.
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            r = subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                 "--platform", "manylinux2014_x86_64", "--python-version", "3.9", WHEEL_REQ, "-d", tmp],
                capture_output=True, text=True, timeout=600,
            )
            for w in Path(tmp).glob("*.whl"):
                os.replace(w, CACHE / w.name)
        wheels = sorted(CACHE.glob(f"nvidia_nvshmem_cu13-{PINNED}-*.whl"))
        if r.returncode != 0 or not wheels:
            pytest.skip(f"cannot download {WHEEL_REQ} from PyPI (pip said: {r.stderr.strip()[-300:]})")
    return wheels[0]


def extract(name: str) -> Path:
    """`nvidia/nvshmem/lib/<name>` of the pinned wheel, extracted once into the cache."""
    out = CACHE / name
    if not out.is_file():
        with zipfile.ZipFile(_download_wheel()) as z:
            tmp = out.with_name(f"{name}.{os.getpid()}.part")  # one per process (pytest -n)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(z.read(f"{LIB_DIR}/{name}"))
            tmp.rename(out)  # whole or absent: an interrupted extraction is not taken for the file
    return out
