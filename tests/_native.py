"""`ironlink._native` for the CPU tests (a helper, no tests of its own): the installed extension,
or one cargo builds into target/pyext (`build_native`; the `native` fixture: import it into a test
module and its tests may take it)."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ironlink

REPO = Path(__file__).resolve().parents[1]


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
    so = REPO / "target" / "pyext" / "debug" / "libironlink.so"
    shutil.copy(so, tmp_dir / "_native.abi3.so")
    ironlink.__path__.append(str(tmp_dir))
    return importlib.import_module("ironlink._native")


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Any:
    try:
        return importlib.import_module("ironlink._native")
    except ImportError:
        return build_native(tmp_path_factory.mktemp("native"))
