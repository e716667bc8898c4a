"""`ironlink._native` for the CPU tests (a helper, no tests of its own): the installed extension,
else the one in the wheel `make wheel` built from this very commit (`make test` builds it just
before the tests), else one cargo builds into target/pyext (`load_native`; the `native` fixture:
import it into a test module and its tests may take it)."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

import ironlink

REPO = Path(__file__).resolve().parents[1]
SO_NAME = "_native.abi3.so"  # the extension's file in the package (the wheel's name for it)


def build_native(tmp_dir: Path) -> Any:
    """Builds the extension with cargo and makes `ironlink._native` importable from tmp_dir."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("ironlink._native is not installed and cargo is not available to build it")
    env = dict(os.environ, CARGO_TARGET_DIR=str(REPO / "target" / "pyext"), PYO3_PYTHON=sys.executable)
    subprocess.run(
        [cargo, "build", "-q", "--lib", "--features", "python,pyo3/extension-module"],
        cwd=REPO,
        env=env,
        check=True,
        timeout=900,
    )
    shutil.copy(REPO / "target" / "pyext" / "debug" / "libironlink.so", tmp_dir / SO_NAME)
    return _import_from(tmp_dir)


def _import_from(tmp_dir: Path) -> Any:
    """`ironlink._native` from the SO_NAME its caller put into tmp_dir."""
    ironlink.__path__.append(str(tmp_dir))
    return importlib.import_module("ironlink._native")


def wheel_native(tmp_dir: Path) -> Any:
    """The extension of build/dist's wheel where `make wheel` built it from this commit on a clean
    tree (build/git_rev, `git describe --always --dirty`, equals this tree's and is not dirty),
    else None. In a clean clone's `make test` it is, and the tests skip a debug build of the host
    crate with pyo3 (29 s on the 2-core machine)."""
    wheels = sorted((REPO / "build" / "dist").glob("ironlink-*.whl"))
    rev_file = REPO / "build" / "git_rev"
    if len(wheels) != 1 or not rev_file.is_file():
        return None
    built = rev_file.read_text().strip()
    now = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    if now.returncode != 0 or built.endswith("-dirty") or built != now.stdout.strip():
        return None
    with zipfile.ZipFile(wheels[0]) as z:
        (tmp_dir / SO_NAME).write_bytes(z.read(f"ironlink/{SO_NAME}"))
    return _import_from(tmp_dir)


def load_native(tmp_dir: Path) -> Any:
    """`ironlink._native`: installed, else `wheel_native`, else `build_native`."""
    try:
        return importlib.import_module("ironlink._native")
    except ImportError:
        return wheel_native(tmp_dir) or build_native(tmp_dir)


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_native(tmp_path_factory.mktemp("native"))
