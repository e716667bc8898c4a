"""What ptxas made of a compiled kernel, from Triton's own `cuobjdump` (no GPU needed)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import triton

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements-dev.txt"


def spills_checked() -> bool:
    """Whether this is the Triton the project pins (requirements-dev.txt; the GPU machines run it):
    register allocation differs between Triton releases, so the spill allowances hold for it
    only. The compile tests of the other supported releases check everything else."""
    pinned = re.search(r"^triton==(\S+)", REQUIREMENTS.read_text(), re.M)
    return bool(pinned) and pinned.group(1) == triton.__version__


def _cuobjdump(cubin: bytes, what: str) -> str:
    """cuobjdump's `what` (-res-usage, -sass) of `cubin`."""
    assert CUOBJDUMP.is_file(), f"{CUOBJDUMP} is missing: Triton's wheel ships it"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(CUOBJDUMP), what, f.name], capture_output=True, text=True, check=True).stdout


def stack_bytes(cubin: bytes) -> int:
    """The kernel's stack frame in bytes: register spills, which the PTX does not show (its .local
    is only what Triton asked for)."""
    out = _cuobjdump(cubin, "-res-usage")
    found = re.search(r"STACK:(\d+)", out)
    assert found, f"no STACK in cuobjdump's resource usage:\n{out}"
    return int(found.group(1))


def local_accesses_in_loops(cubin: bytes) -> list[str]:
    """The kernel's local-memory loads and stores (LDL / STL: register spills) that lie inside a
    loop, each as "address: instruction". A loop is the span of a backward branch (a BRA to a
    lower address); straight-line SASS outside every such span runs once a call."""
    sass = _cuobjdump(cubin, "-sass")
    code = [(int(m.group(1), 16), m.group(2).strip())
            for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = [(int(t.group(1), 16), at) for at, ins in code
             if (t := re.search(r"\bBRA\b[^;]*?0x([0-9a-f]+)", ins)) and int(t.group(1), 16) < at]
    return [f"{at:#x}: {ins}" for at, ins in code
            if re.search(r"\b(LDL|STL)\b", ins) and any(lo <= at <= hi for lo, hi in loops)]
