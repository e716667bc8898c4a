"""The wheel installs where GPU users are, and the Triton range the package declares is the tested one.

`make test` builds the wheel first (`make wheel`), so a missing wheel is a failure, not a skip.
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The newest glibc a wheel may require: manylinux_2_28 covers RHEL 8, Ubuntu 20.04 and newer.
MAX_GLIBC = (2, 28)


def makefile_var(name: str) -> str:
    m = re.search(rf"^{name}\s*:?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    assert m, f"Makefile defines no {name}"
    return m.group(1)


def the_wheel() -> Path:
    wheels = sorted((REPO / "build" / "dist").glob("ironlink-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in build/dist, found {wheels}: run `make wheel` (make test does)"
    return wheels[0]


def test_wheel_is_abi3_manylinux_2_28_or_older() -> None:
    with zipfile.ZipFile(the_wheel()) as z:
        info = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))
        tags = re.findall(r"^Tag: (\S+)$", z.read(info).decode(), re.M)
    assert tags, "the wheel's WHEEL file names no tag"
    for tag in tags:
        python, abi, platform = tag.split("-")
        assert (python, abi) == ("cp39", "abi3"), f"{tag}: not one abi3 build for Python 3.9+"
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", platform)
        assert m, f"{tag}: not a manylinux_X_Y tag"
        assert (int(m.group(1)), int(m.group(2))) <= MAX_GLIBC, f"{tag}: needs a newer glibc than {MAX_GLIBC}"
    assert makefile_var("MANYLINUX") == platform.removesuffix("_x86_64")


def test_wheel_packs_the_bitcode_and_the_extension() -> None:
    with zipfile.ZipFile(the_wheel()) as z:
        names = set(z.namelist())
    for arch in ("sm80", "sm90", "sm100"):
        assert f"ironlink/lib/ironlink_{arch}.bc" in names
        assert f"ironlink/lib/ironlink_nvshmem_{arch}.bc" in names
    assert "ironlink/_native.abi3.so" in names
    assert "ironlink/language/_abi.py" in names
    assert "ironlink/language/_nvshmem.py" in names
    # The committed decode tables, package data that ironlink.runtime.tuning.decode_table reads.
    tables = sorted((REPO / "python" / "ironlink" / "runtime" / "tuning" / "tables").glob("decode-w*.json"))
    assert tables and {f"ironlink/runtime/tuning/tables/{t.name}" for t in tables} <= names
    assert not [n for n in names if "bench" in n], "the benchmark harness stays in bench/, out of the wheel"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")
def test_declared_triton_range_is_the_tested_one() -> None:
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("triton"))
    m = re.fullmatch(r"triton>=(\d+)\.(\d+),<(\d+)\.(\d+)", spec.replace(" ", ""))
    assert m, f"pyproject's {spec!r} is not of the form triton>=X.Y,<A.B"
    low, high = (int(m.group(1)), int(m.group(2))), (int(m.group(3)), int(m.group(4)))
    oldest = tuple(int(x) for x in makefile_var("TRITON_OLDEST").split(".")[:2])
    newest = tuple(int(x) for x in makefile_var("TRITON_NEWEST").split(".")[:2])
    # The range starts at the oldest tested release and ends right after the newest one.
    assert low == oldest, f"pyproject allows Triton from {low}, the Makefile tests from {oldest}"
    assert high == (newest[0], newest[1] + 1), f"pyproject allows Triton below {high}, the newest tested is {newest}"
    pinned = re.search(r"^triton==(\S+)$", (REPO / "requirements-dev.txt").read_text(), re.M)
    assert pinned and oldest <= tuple(int(x) for x in pinned.group(1).split(".")[:2]) <= newest
