"""Linking NVSHMEM device code: finding ``libnvshmem_device.bc``, and initializing each module
that holds it.

Used only by kernels decorated ``@ironlink.jit(nvshmem=True)``; a process that never launches one
links nothing from here and installs no hook.

The bitcode is found the way PyTorch finds it, in this order:

1. ``$IRONLINK_NVSHMEM_BITCODE``: the file itself, or a directory holding it;
2. the ``nvidia.nvshmem`` package (the ``nvidia-nvshmem-cu12/13`` wheels), its ``lib/``.

In a directory the per-arch file of NVSHMEM 3.7+ (``libnvshmem_device_sm_90.bc``) comes before
the single file of earlier releases (``libnvshmem_device.bc``). Triton 3.6 (LLVM 22.0) links
NVSHMEM 3.3 to 3.7 but cannot parse 3.8's bitcode (LLVM 22.1); see docs/backends.md.

Every module linked with NVSHMEM needs ``nvshmemx_cumodule_init`` after it is loaded and before
its first launch. Triton loads a kernel's module lazily, at its first launch on a device, and
calls ``knobs.runtime.kernel_load_end_hook`` right after loading: our hook (added to that chain
on the first NVSHMEM launch, never replacing anyone's) runs the init for the kernels registered
here, once per loaded module, through ``ironlink._native.nvshmem_cumodule_init``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
from pathlib import Path
from typing import Any, Optional

from . import _lib

ENV_NVSHMEM_BITCODE = "IRONLINK_NVSHMEM_BITCODE"
# Our key for NVSHMEM's library in `extern_libs` (PyTorch's too; Triton ignores keys).
LIB_NAME = "libnvshmem_device"
HOST_LIBRARY = "libnvshmem_host.so.3"


class NvshmemBitcodeNotFoundError(FileNotFoundError):
    """No libnvshmem_device bitcode in any searched place."""


def package_lib_dir() -> Optional[Path]:
    """``lib/`` of the installed ``nvidia.nvshmem`` package, or None (looked up without importing it)."""
    try:
        spec = importlib.util.find_spec("nvidia.nvshmem")
    except (ImportError, ValueError):  # no `nvidia` namespace at all
        return None
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        lib = Path(loc) / "lib"
        if lib.is_dir():
            return lib
    return None


def bitcode_candidates(directory: Path, cc: tuple[int, int]) -> list[Path]:
    """The files tried in `directory` for `cc`, best first: 3.7+'s per-arch files (the exact arch,
    then its family's base), then the single file of earlier releases."""
    per_arch = [directory / f"libnvshmem_device_sm_{a}{b}.bc" for a, b in _lib.candidate_archs(cc)]
    return [*per_arch, directory / "libnvshmem_device.bc"]


def device_bitcode_path(arch: _lib.ArchLike) -> str:
    """NVSHMEM's device bitcode for `arch`, searched as the module docstring says."""
    cc = _lib.parse_arch(arch)
    tried: list[Path] = []
    env = os.environ.get(ENV_NVSHMEM_BITCODE)
    if env:
        p = Path(env)
        if p.is_file():
            return str(p)
        if not p.is_dir():
            raise NvshmemBitcodeNotFoundError(f"ironlink: ${ENV_NVSHMEM_BITCODE}={env} is neither a file nor a directory")
        dirs = [p]
    else:
        lib = package_lib_dir()
        dirs = [lib] if lib is not None else []
    for d in dirs:
        for c in bitcode_candidates(d, cc):
            if c.is_file():
                return str(c)
            tried.append(c)
    where = "\n  ".join(map(str, tried)) if tried else "(no nvidia.nvshmem package is installed)"
    raise NvshmemBitcodeNotFoundError(
        f"ironlink: no NVSHMEM device bitcode for {_lib.arch_name(cc)}. Searched:\n  {where}\n"
        f"Install it (`pip install nvidia-nvshmem-cu13`, which PyTorch's NVSHMEM backend uses too) or point "
        f"${ENV_NVSHMEM_BITCODE} at libnvshmem_device.bc or the directory holding it."
    )


def host_library_path() -> Optional[str]:
    """``libnvshmem_host.so.3`` of the ``nvidia.nvshmem`` package, if installed: where the native
    side loads NVSHMEM from when the process has not loaded it already."""
    lib = package_lib_dir()
    if lib is not None and (lib / HOST_LIBRARY).is_file():
        return str(lib / HOST_LIBRARY)
    return None


# --- the module init ---------------------------------------------------------------------------

_lock = threading.Lock()
_kernel_names: set[str] = set()
_hook_added = False
_initialized: set[int] = set()
_failure: Optional[BaseException] = None


def register_kernel(name: str) -> None:
    """Makes the load hook initialize modules of the kernel named `name`; adds the hook once."""
    global _hook_added
    with _lock:
        _kernel_names.add(name)
        if not _hook_added:
            from triton import knobs

            knobs.runtime.kernel_load_end_hook.add(_on_load)
            _hook_added = True


def check_usable() -> None:
    """Raises the error of an earlier failed module init. Triton keeps a module whose load hook
    raised, so a retried launch would run it with NVSHMEM's state unset (illegal addresses)."""
    if _failure is not None:
        raise RuntimeError(
            "ironlink: an earlier nvshmemx_cumodule_init failed, so kernels linked with NVSHMEM cannot run "
            "safely in this process (see the chained error); fix the cause and restart"
        ) from _failure


def initialized_modules() -> frozenset[int]:
    """The module handles initialized so far (for tests and diagnostics)."""
    with _lock:
        return frozenset(_initialized)


def _on_load(module: Any, function: Any, name: str, metadata_group: Any, hash: str) -> None:
    """Triton's kernel_load_end_hook: called right after a kernel's module is loaded on a device."""
    global _failure
    if name not in _kernel_names or module is None:
        return
    native: Any = importlib.import_module("ironlink._native")  # the compiled extension, on first use

    handle = int(module)
    try:
        done = native.nvshmem_cumodule_init(handle, host_library_path())
    except BaseException as e:
        _failure = e
        raise
    if done:
        with _lock:
            _initialized.add(handle)
