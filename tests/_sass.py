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


def stack_bytes(cubin: bytes) -> int:
    """The kernel's stack frame in bytes: register spills, which the PTX does not show (its .local
    is only what Triton asked for)."""
    assert CUOBJDUMP.is_file(), f"{CUOBJDUMP} is missing: Triton's wheel ships it"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(CUOBJDUMP), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    found = re.search(r"STACK:(\d+)", out)
    assert found, f"no STACK in cuobjdump's resource usage:\n{out}"
    return int(found.group(1))
