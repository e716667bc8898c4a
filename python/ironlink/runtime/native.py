"""The compiled extension and torch, imported on first use, with an IronlinkError that says what
is missing: `import ironlink` needs neither."""

from __future__ import annotations

from typing import Any

from .errors import IronlinkError


def load_native() -> Any:
    """The compiled extension, or an IronlinkError saying how to build it."""
    try:
        from .. import _native  # type: ignore[attr-defined]
    except ImportError as e:
        raise IronlinkError(
            "ironlink's compiled extension (ironlink._native) is not available: install the "
            "package (`pip install .` or `make wheel` and install build/dist/*.whl) or build it "
            f"in place with `maturin develop` ({e})"
        ) from e
    return _native


def load_torch() -> Any:
    """torch, or an IronlinkError saying the heap needs it."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise IronlinkError("ironlink.SymmetricHeap needs PyTorch (import torch failed)") from e
    return torch


_KDL_CUDA = 2  # DLPack's device type of CUDA memory


def cuda_tensor(ptr: int, nbytes: int, device_index: int, owner: Any) -> Any:
    """A torch uint8 tensor over `nbytes` of device memory at `ptr` on GPU `device_index` (a
    DLPack capsule from the extension; `owner` is kept alive as long as the tensor)."""
    cap = load_native().dlpack_capsule(ptr, nbytes, _KDL_CUDA, device_index, owner)
    return load_torch().from_dlpack(cap)


__all__ = ["cuda_tensor", "load_native", "load_torch"]
