"""ironlink: collective communication that Triton kernels call inline.

- ``ironlink.jit``: decorator that links the device bitcode into a kernel at launch.
- ``ironlink.language``: the device functions (``symm_rank(ctx)``, ...), one per Rust export.
- ``ironlink.constants``: ABI constants (``STATUS_OK``, ``REDUCE_OP_SUM``, ...) as tl.constexpr.
- ``ironlink.bitcode_path(arch=None)``: the bitcode file for the current GPU or a named arch.

Importing ironlink needs Triton but not torch (torch is imported only to ask which GPU is current).
``ironlink.SymmetricHeap``, ``ironlink.IronlinkError`` and the host-level collectives
``ironlink.all_reduce/all_gather/reduce_scatter`` (host side) and the fused ops
``ironlink.all_reduce_rmsnorm/matmul_all_reduce/all_gather_matmul/matmul_reduce_scatter`` load on
first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import constants, language
from ._abi import ABI_VERSION
from ._lib import BitcodeNotFoundError, bitcode_path, parse_arch
from .jit import IronlinkKernel, jit

# The host side (symmetric heaps, errors, torch interop) is imported on first use, so that
# `import ironlink` stays as light as the device side needs (no torch, no compiled extension).
_LAZY = {
    "SymmetricHeap": "heap",
    "init_distributed": "distributed",
    "IronlinkError": "errors",
    "SymmMemContext": "torch_interop",
    "context_from_symm_mem": "torch_interop",
    # Host-level collectives on heap tensors (ironlink.ops): torch is imported when they run.
    "all_reduce": "ops",
    "all_gather": "ops",
    "reduce_scatter": "ops",
    "all_to_all_v": "variable_all_to_all",
    "MoeExchange": "moe",
    # Fused compute + communication (ironlink.fused).
    "all_reduce_rmsnorm": "fused",
    "matmul_all_reduce": "fused",
    "all_gather_matmul": "fused",
    "matmul_reduce_scatter": "fused",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ironlink' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "ABI_VERSION",
    "BitcodeNotFoundError",
    "IronlinkKernel",
    "bitcode_path",
    "constants",
    "jit",
    "language",
    "parse_arch",
    *_LAZY,
]
