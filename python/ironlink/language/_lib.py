"""Finding the device bitcode (`ironlink_smXX.bc`) for a GPU, and reading back what it exports.

The bitcode is built per architecture (`make CUDA_ARCH=sm_90` writes `build/ironlink_sm90.bc`, and
`make CUDA_ARCH=sm_90 NVSHMEM=1` the NVSHMEM variant `build/ironlink_nvshmem_sm90.bc`). It is
looked up, in this order, in:

1. the directory named by ``$IRONLINK_BITCODE_DIR`` (an explicit override, e.g. a CI artifact),
2. the package's own ``ironlink/lib/`` (where a wheel install puts it),
3. the repository's ``build/`` (a development checkout).

Directories are searched in that order, and within each one the exact architecture comes before
its family's base (``sm_86`` before ``sm_80``): an installation found earlier wins over a closer
match in a later one, so bitcode from two different builds is never mixed by accident.

Nothing here imports torch at module import time; only ``bitcode_path()`` without an arch asks
torch (then Triton's driver) which GPU is current.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Union

ENV_BITCODE_DIR = "IRONLINK_BITCODE_DIR"
ENV_LLVM_BIN = "IRONLINK_LLVM_BIN"

# python/ironlink/language/_lib.py: the wheel's bitcode is in ironlink/lib/, and in a checkout
# the repository root is two levels above the package.
PACKAGE_LIB_DIR = Path(__file__).resolve().parents[1] / "lib"
REPO_BUILD_DIR = Path(__file__).resolve().parents[3] / "build"

# Families whose later minor versions run the family's base bitcode (8.6 and 8.9 run sm_80 code;
# 10.3 runs sm_100 code). Hopper has only 9.0, so it needs sm_90 bitcode exactly.
_FAMILY_BASE = {8: (8, 0), 10: (10, 0)}

ArchLike = Union[str, int, tuple[int, int]]


class BitcodeNotFoundError(FileNotFoundError):
    """No ironlink bitcode for the requested architecture in any searched directory."""


def parse_arch(arch: ArchLike) -> tuple[int, int]:
    """Normalizes "sm_90", "sm90", "sm_90a", 90, 100, (9, 0) to a (major, minor) capability."""
    if isinstance(arch, tuple):
        if len(arch) != 2 or not all(isinstance(x, int) and x >= 0 for x in arch):
            raise ValueError(f"compute capability must be (major, minor), got {arch!r}")
        return arch
    if isinstance(arch, bool) or not isinstance(arch, (int, str)):
        raise TypeError(f"arch must be 'sm_XX', an int like 90 or a (major, minor) tuple, got {arch!r}")
    if isinstance(arch, str):
        m = re.fullmatch(r"(?:sm_?)?(\d+)[af]?", arch.strip().lower())
        if not m:
            raise ValueError(f"cannot parse arch {arch!r}: expected 'sm_90', 'sm_100', 90 or (9, 0)")
        arch = int(m.group(1))
    if arch < 10:
        raise ValueError(f"arch {arch} is not a compute capability like 80, 90 or 100")
    return divmod(arch, 10)


def arch_name(cc: tuple[int, int]) -> str:
    """(9, 0) -> "sm_90"; the spelling of `make CUDA_ARCH=...`."""
    return f"sm_{cc[0]}{cc[1]}"


def bitcode_filename(cc: tuple[int, int], nvshmem: bool = False) -> str:
    """(9, 0) -> "ironlink_sm90.bc" ("ironlink_nvshmem_sm90.bc" with NVSHMEM), as the Makefile names it."""
    return f"ironlink_{'nvshmem_' if nvshmem else ''}sm{cc[0]}{cc[1]}.bc"


def candidate_archs(cc: tuple[int, int]) -> list[tuple[int, int]]:
    """Architectures whose bitcode runs on `cc`, best first: the exact one, then its family's base."""
    out = [cc]
    base = _FAMILY_BASE.get(cc[0])
    if base is not None and base != cc:
        out.append(base)
    return out


def search_dirs() -> list[Path]:
    """The directories searched for bitcode, in order (see the module docstring)."""
    dirs: list[Path] = []
    env = os.environ.get(ENV_BITCODE_DIR)
    if env:
        dirs.append(Path(env))
    dirs += [PACKAGE_LIB_DIR, REPO_BUILD_DIR]
    return dirs


def current_capability() -> tuple[int, int]:
    """Compute capability of the current GPU, from torch if present, else from Triton's driver."""
    try:
        import torch  # lazily: torch is optional for ironlink
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        return tuple(torch.cuda.get_device_capability())  # type: ignore[return-value]
    try:
        from triton.runtime import driver

        target = driver.active.get_current_target()
    except Exception as e:  # no GPU, no driver: Triton raises various errors here
        raise RuntimeError(
            "ironlink: no GPU found to choose bitcode for; pass an arch, e.g. bitcode_path('sm_90')"
        ) from e
    if target.backend != "cuda" or not isinstance(target.arch, int):
        raise RuntimeError(f"ironlink needs an NVIDIA GPU; the current Triton target is {target}")
    return divmod(target.arch, 10)


def bitcode_path(arch: ArchLike | None = None, nvshmem: bool = False) -> str:
    """Path of the bitcode for `arch` (default: the current GPU), searched as the module docstring says;
    with `nvshmem`, of the NVSHMEM variant (`make NVSHMEM=1`), which kernels link ahead of NVSHMEM's."""
    cc = current_capability() if arch is None else parse_arch(arch)
    tried: list[Path] = []
    for d in search_dirs():
        for c in candidate_archs(cc):
            p = d / bitcode_filename(c, nvshmem)
            if p.is_file():
                return str(p)
            tried.append(p)
    lines = "\n  ".join(str(p) for p in tried)
    what, flag = ("NVSHMEM device bitcode", " NVSHMEM=1") if nvshmem else ("device bitcode", "")
    raise BitcodeNotFoundError(
        f"ironlink: no {what} for {arch_name(cc)}. Searched:\n  {lines}\n"
        f"Build it with `make CUDA_ARCH={arch_name(cc)}{flag}` in the ironlink repository, "
        f"or point ${ENV_BITCODE_DIR} at a directory that holds {bitcode_filename(cc, nvshmem)}."
    )


# --- reading back a bitcode file's exported signatures (the drift check) -------------------------


def llvm_tool(name: str) -> str:
    """Path of an LLVM tool: $IRONLINK_LLVM_BIN first (rustup's llvm-tools), then PATH."""
    bin_dir = os.environ.get(ENV_LLVM_BIN)
    if bin_dir:
        p = Path(bin_dir) / name
        if p.is_file():
            return str(p)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(
        f"{name} not found in ${ENV_LLVM_BIN} ({bin_dir or 'unset'}) or on PATH; set {ENV_LLVM_BIN} to "
        "$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin"
    )


# Raw bitcode starts with "BC\xc0\xde"; the wrapper format (Darwin) with 0x0b17c0de.
_BITCODE_MAGICS = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")


def disassemble(path: str | os.PathLike[str]) -> str:
    """Textual LLVM IR of a library file: llvm-dis for bitcode; a text `.ll` is returned as is
    (Triton links either, whatever the file is called)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head not in _BITCODE_MAGICS:
        return Path(path).read_text()
    return subprocess.run(
        [llvm_tool("llvm-dis"), str(path), "-o", "-"], check=True, capture_output=True, text=True
    ).stdout


_DEFINE = re.compile(r'^define\s+(?P<pre>.*?)@(?P<name>"[^"]+"|[\w.$-]+)\((?P<args>.*)\)(?P<post>[^()]*)\{\s*$')
_LOCAL_LINKAGES = {"internal", "private"}


def _split_top_level(s: str) -> list[str]:
    """Splits on commas that are not inside (), <>, [] or {} (argument lists carry `range(i32 0, 8)`)."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in s:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    tail = "".join(cur).strip()
    if tail:
        parts.append(tail)
    return parts


def _leading_type(s: str) -> str:
    """The LLVM type at the start of a parameter (`i64 noundef %ctx` -> `i64`)."""
    m = re.match(r"(ptr(?:\s+addrspace\(\d+\))?|<[^>]*>|\[[^\]]*\]|\{[^}]*\}|\S+)", s)
    return m.group(1) if m else s


def _trailing_type(s: str) -> str:
    """The LLVM type at the end of `define`'s prefix (`noundef range(i32 0, 8) i32` -> `i32`)."""
    m = re.search(r"(ptr\s+addrspace\(\d+\)|<[^>]*>|\S+)\s*$", s)
    return m.group(1) if m else s


def parse_defines(ir_text: str) -> dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]]:
    """Every `define` in textual IR: name -> (argument types, return type, linkage/prefix words)."""
    out: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {}
    for line in ir_text.splitlines():
        m = _DEFINE.match(line)
        if not m:
            continue
        name = m.group("name").strip('"')
        args = tuple(_leading_type(a) for a in _split_top_level(m.group("args")) if a != "...")
        pre = m.group("pre").strip()
        out[name] = (args, _trailing_type(pre), tuple(pre.split()))
    return out


def bitcode_signatures(path: str | os.PathLike[str]) -> dict[str, tuple[tuple[str, ...], str]]:
    """{name: (arg types, return type)} of every externally visible function defined in a .bc file."""
    return {
        name: (args, ret)
        for name, (args, ret, words) in parse_defines(disassemble(path)).items()
        if not _LOCAL_LINKAGES & set(words)
    }
