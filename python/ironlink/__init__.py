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

The package in layers, each importing only from those listed before it:
- ``language/``: the device side that Triton kernels import (the wrappers, ``typed``, ``constants``,
  ``jit``, the generated ABI);
- ``runtime/``: the host runtime (``SymmetricHeap``, its backends and rendezvous, streams, torch
  interop, errors, tuning);
- ``ops/``: the host-level collectives;
- ``fused/`` and ``moe/``: fused compute + communication, MoE dispatch and combine.
``ironlink.constants``, ``ironlink.typed``, ``ironlink.tuning`` and ``ironlink.torch_interop`` are
the documented names of the modules of those layers.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import constants, language
from .language._abi import ABI_VERSION
from .language._lib import BitcodeNotFoundError, bitcode_path, parse_arch
from .language.jit import IronlinkKernel, jit

# The host side (symmetric heaps, errors, torch interop) is imported on first use, so that
# `import ironlink` stays as light as the device side needs (no torch, no compiled extension).
_LAZY = {
    "SymmetricHeap": "runtime.heap",
    "init_distributed": "runtime.distributed",
    "sm_share": "runtime.distributed",
    "IronlinkError": "runtime.errors",
    "SymmMemContext": "runtime.torch_interop",
    "context_from_symm_mem": "runtime.torch_interop",
    # Host-level collectives on heap tensors (ironlink.ops): torch is imported when they run.
    "all_reduce": "ops",
    "all_gather": "ops",
    "reduce_scatter": "ops",
    "all_to_all_v": "ops",
    "MoeExchange": "moe",
    # Fused compute + communication (ironlink.fused).
    "all_reduce_rmsnorm": "fused",
    "matmul_all_reduce": "fused",
    "all_gather_matmul": "fused",
    "matmul_reduce_scatter": "fused",
}


# The documented module names, reachable as attributes (`ironlink.tuning.AllReduceConfig`)
# without importing them first.
_MODULES = frozenset({"typed", "tuning", "torch_interop", "fused", "moe", "ops", "runtime"})


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
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
