"""The pinned NVSHMEM release's files for the CPU and compile tests (a helper, no tests of its
own): the ``nvidia-nvshmem-cu13==3.4.5`` wheel (the release PyTorch 2.11 ships), downloaded once with
pip into ``build/nvshmem-3.4.5/`` or taken from ``$IRONLINK_NVSHMEM_PINNED_WHEEL``; a test that
needs it skips, saying so, only when that download fails (no network). `extract` gives one of its
files; `needed_part` the part of its device bitcode that ironlink's wrappers link (`ironlinks_part`
for ironlink's NVSHMEM bitcode, whose calls `ironlink_declarations` lists)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from ironlink.language import _lib

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


def needed_part(declarations: str) -> Path:
    """The definitions of the pinned libnvshmem_device.bc that linking `declarations` (LLVM IR
    `declare` lines of NVSHMEM functions: what ironlink's NVSHMEM bitcode calls) pulls in, with
    what they use in turn (the device state): a 10 KB library that links as the 31 MB file does.
    Triton parses a library whole before it links the needed part, about 5 s of every
    NVSHMEM-linked compile; `llvm-link --only-needed` reads the file lazily. Built once, cached
    under a name that carries the declarations' hash; named libnvshmem_device.bc as the file is."""
    full = extract("libnvshmem_device.bc")
    names = re.findall(r"@(\w+)\(", declarations)
    assert names, f"no function declared in {declarations!r}"
    digest = hashlib.sha256(declarations.encode()).hexdigest()[:12]
    out = CACHE / f"needed-{digest}" / "libnvshmem_device.bc"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        # A module that takes each function's address pulls each in; Triton later links from the
        # result only what a kernel calls (LinkOnlyNeeded), so the address table stays behind.
        # Attribute groups (#0) are the declaring module's: left out, they mean nothing here.
        stub = "\n".join(re.sub(r"\s#\d+\s*$", "", d) for d in declarations.splitlines()) + "\n"
        stub += f"@ironlink_needed = global [{len(names)} x ptr] [{', '.join(f'ptr @{n}' for n in names)}]\n"
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            (Path(tmp) / "stub.ll").write_text(stub)
            part = Path(tmp) / out.name
            subprocess.run([_lib.llvm_tool("llvm-link"), "--only-needed", str(Path(tmp) / "stub.ll"), str(full),
                            "-o", str(part)], check=True, capture_output=True, text=True)
            os.replace(part, out)  # whole or absent, as in `extract`
    return out


def ironlink_declarations(arch: str = "sm_90") -> dict[str, str]:
    """The NVSHMEM functions ironlink's NVSHMEM bitcode calls: name -> its `declare` line."""
    ours = _lib.disassemble(_lib.bitcode_path(arch, nvshmem=True))
    return {m.group(1): m.group(0) for m in re.finditer(r"^declare\b[^@]*@(nvshmemx?_\w+)\(.*$", ours, re.MULTILINE)}


def ironlinks_part() -> Path:
    """`needed_part` for what ironlink's NVSHMEM bitcode calls."""
    return needed_part("\n".join(ironlink_declarations().values()))
