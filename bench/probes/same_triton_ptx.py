"""Did a change of the Triton side (python/ironlink/language, the op kernels) change the code?
Compiles every kernel of the compile tests' table (tests/compile/_fused_compile_cases.py's
KERNELS: the fused ops, the lamport paths at 2, 4 and 8 ranks) for one arch against the built
bitcode, with no GPU, and prints a line per kernel: its name and a hash of its PTX, with what a
refactor moves and no instruction (comments, line and file directives, the debug sections) left
out. The device/ side has bench/probes/same_ptx.sh.

    PYTHONPATH=python:tests python bench/probes/same_triton_ptx.py > /tmp/before.txt
    (the change)
    PYTHONPATH=python:tests python bench/probes/same_triton_ptx.py > /tmp/after.txt
    diff /tmp/before.txt /tmp/after.txt      # empty: the same code

`--only REGEX` compiles the kernels whose names it finds; `--ptx DIR` also writes each PTX there.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What a move renames and no instruction: comments, .loc/.file directives, the debug sections.
_NOT_CODE = re.compile(r"//[^\n]*|^\s*\.(loc|file)\b[^\n]*$", re.M)
_DEBUG = re.compile(r"^\s*\.section\s+\.debug.*?^\s*}", re.M | re.S)


def code_of(ptx: str) -> str:
    lines = (line.rstrip() for line in _NOT_CODE.sub("", _DEBUG.sub("", ptx)).splitlines())
    return "\n".join(line for line in lines if line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--cc", type=int, default=90)
    ap.add_argument("--only", default="", help="a regular expression over the kernels' names")
    ap.add_argument("--ptx", default=None, help="a directory to write each kernel's PTX to")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="same-triton-ptx-"))
    sys.path[:0] = [str(REPO / "python"), str(REPO / "tests"), str(REPO / "tests" / "compile")]
    # tests/compile/: the kernels' table, each entry compiled as the test compiles it
    from _fused_compile_cases import KERNELS, compile_case  # noqa: E402

    wanted = re.compile(args.only)
    for name, (_, _, given) in sorted(KERNELS.items()):
        if not wanted.search(name) or not given.get("MIN_CC", 0) <= args.cc <= given.get("MAX_CC", args.cc):
            continue
        code = code_of(compile_case(name, args.cc).asm["ptx"])
        if args.ptx:
            Path(args.ptx).mkdir(parents=True, exist_ok=True)
            (Path(args.ptx) / f"{name}.ptx").write_text(code)
        print(f"{name} {hashlib.sha256(code.encode()).hexdigest()[:16]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
