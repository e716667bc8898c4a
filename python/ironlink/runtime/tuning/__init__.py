"""Launch choices of ironlink's ops, one module per op family, each number with the measurement
that chose it:

- `collectives`: the host-level collectives (grids and warps from the generated table
  `runtime/tuning_table.py`, the device's algorithm limits, all_to_all_v's grid, the small
  all_reduce's lamport path, PDL for the decode kernels);
- `rmsnorm`: all_reduce_rmsnorm (its mode from the decode table of the world size,
  `runtime/tuning/decode_table.py`, and each mode's shape);
- `matmul`: matmul_all_reduce (the GEMM tile, the method, the push kernels' pacing);
- `sequence_parallel`: all_gather_matmul and matmul_reduce_scatter (method, copy engine);
- `lookup`: the one lookup by size and the one rule for a world size without measurements
  (`nearest_world`) that every table uses;
- `op_config`: an op's choices as a frozen config passed to it (`config=`: `AllReduceConfig`,
  `RmsnormConfig`), and the string a torch.compile graph carries in its place.
MoeExchange's choices are its `MoeConfig` (`ironlink.moe.config`), passed to it.

This package holds every name of those modules (`ironlink.tuning` is this package), so an op
reads `tuning.X`. `overridden` sets a name for a block, in the package and in the module that
owns it, for benchmarks and tests that time or check a choice the tables do not make.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from ...language._abi import MAX_CTAS
from . import collectives, lookup, matmul, op_config, rmsnorm, sequence_parallel
from .collectives import *  # noqa: F401,F403
from .lookup import *  # noqa: F401,F403
from .matmul import *  # noqa: F401,F403
from .rmsnorm import *  # noqa: F401,F403
from .sequence_parallel import *  # noqa: F401,F403

_OWNERS = (collectives, lookup, matmul, rmsnorm, sequence_parallel)


@contextlib.contextmanager
def overridden(**values: Any) -> Iterator[None]:
    """Sets the tuning names given (a name no module here has raises AttributeError) to these
    values for the block, then restores them. The ops read the choices when they plan a call, so
    a CUDA graph keeps what its capture chose."""
    package = sys.modules[__name__]
    places = {name: [package, *(m for m in _OWNERS if hasattr(m, name))] for name in values}
    saved = {name: getattr(package, name) for name in values}  # AttributeError for a name no module has
    for name, value in values.items():
        for place in places[name]:
            setattr(place, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            for place in places[name]:
                setattr(place, name, value)


__all__ = [*collectives.__all__, *lookup.__all__, *matmul.__all__, *rmsnorm.__all__, *sequence_parallel.__all__,
           "MAX_CTAS", "overridden"]
