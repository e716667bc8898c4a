"""The committed `_abi.py` is what build.rs generates now, and the Python modules expose all of it."""

from __future__ import annotations

import inspect
import keyword
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import triton.language as tl

import ironlink.language as il
from ironlink.language import _abi
from ironlink import constants

REPO = Path(__file__).resolve().parents[2]
ABI_PY = "python/ironlink/language/_abi.py"


def test_committed_abi_py_is_current() -> None:
    if shutil.which("cargo") is None:
        pytest.skip("cargo is not installed")
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    # build.rs rewrites _abi.py when device/src says something else. It runs in a fresh target
    # directory: in the usual one cargo reruns build.rs only when device/src changed since the
    # last build, so a stale _abi.py restored by hand (git checkout) would go unnoticed.
    # `cargo check` runs build scripts too, and skips code generation.
    with tempfile.TemporaryDirectory() as target:
        env = {**os.environ, "RUSTC_BOOTSTRAP": "1", "CARGO_TARGET_DIR": target}
        build = subprocess.run(
            ["cargo", "check", "-q"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
        )
    assert build.returncode == 0, f"cargo check failed:\n{build.stderr[-4000:]}"
    diff = subprocess.run(["git", "diff", "--exit-code", "--", ABI_PY], cwd=REPO, capture_output=True, text=True)
    assert diff.returncode == 0, (
        f"{ABI_PY} differs from what build.rs generates from device/src (edited by hand, or "
        f"device/src changed without committing the regenerated file; `make abi`, then commit it):"
        f"\n{diff.stdout[-4000:]}"
    )


def _abi_groups() -> dict[str, object]:
    return {k: v for k, v in vars(_abi).items() if k.isupper() and k not in ("FUNCTIONS", "NVSHMEM_FUNCTIONS")}


def test_constants_expose_every_abi_value() -> None:
    groups = _abi_groups()
    assert {"STATUS", "REDUCE_OP", "DTYPE", "CONTEXT_FIELDS", "ABI_VERSION"} <= set(groups)
    expected: dict[str, int] = {}
    for group, value in groups.items():
        if isinstance(value, int):
            expected[group] = value
        elif group == "CONTEXT_FIELDS":
            assert isinstance(value, dict)
            for field, (offset, size) in value.items():
                expected[f"CONTEXT_{field.upper()}_OFFSET"] = offset
                expected[f"CONTEXT_{field.upper()}_BYTES"] = size
        else:
            assert isinstance(value, dict), f"_abi.{group} has a new shape"
            expected.update({f"{group}_{k}": v for k, v in value.items()})
    for name, value in expected.items():
        c = getattr(constants, name, None)
        assert isinstance(c, tl.constexpr), f"ironlink.constants.{name} is missing or not a tl.constexpr"
        assert c.value == value and int(c) == value, name
    assert constants.VALUES == expected
    # Spot checks against the values the device code and torch_symm use.
    assert int(constants.STATUS_OK) == 0 and int(constants.STATUS_NULL_CONTEXT) == -1
    assert int(constants.REDUCE_OP_SUM) == 0 and int(constants.DTYPE_FLOAT32) == 0


def test_language_wraps_every_function_with_its_argument_names() -> None:
    for name, (args, ret, doc) in {**_abi.FUNCTIONS, **_abi.NVSHMEM_FUNCTIONS}.items():
        fn = getattr(il, name, None)
        assert fn is not None, f"ironlink.language.{name} is missing"
        params = list(inspect.signature(fn).parameters)
        # (a Rust argument named like a Python keyword gets a trailing underscore)
        names = [a + "_" if keyword.iskeyword(a) else a for a, _ in args]
        assert params == names + ["_semantic"], (name, params)
        assert fn.__doc__ and doc in fn.__doc__
    # Public: every function but the hierarchical twins, which the one-node names call in a kernel
    # compiled for several nodes (ironlink.language.topology).
    twins = {f for f in _abi.FUNCTIONS if f.endswith(il.HIERARCHICAL_SUFFIX)}
    assert twins and set(il.__all__) == (set(_abi.FUNCTIONS) - twins) | set(_abi.NVSHMEM_FUNCTIONS)
    assert not set(_abi.FUNCTIONS) & set(_abi.NVSHMEM_FUNCTIONS)
