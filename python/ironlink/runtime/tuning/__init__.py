"""Launch choices of ironlink's ops, one module per op family, each number with the measurement
that chose it:

- `collectives`: the host-level collectives (grids and warps from the generated table
  `runtime/tuning_table.py`, the device's algorithm limits, all_to_all_v's grid, the small
  all_reduce's lamport path, PDL for the decode kernels);
- `rmsnorm`: all_reduce_rmsnorm (its mode from the decode table of the world size,
  `runtime/tuning/decode_table.py`, and each mode's shape);
- `matmul`: matmul_all_reduce (the GEMM tile, the method, the push kernels' pacing);
- `sequence_parallel`: all_gather_matmul and matmul_reduce_scatter (method, copy engine);
- `moe`: MoeExchange's kernels (blocks, warps, grids, the low-latency token limit) as the frozen
  `MoeConfig` it takes (`MoeExchange(config=)`; `DEFAULT_MOE_CONFIG`, the measured one);
- `lookup`: the one lookup by size and the one rule for a world size without measurements
  (`nearest_world`) that every table uses;
- `op_config`: an op's choices as a frozen config passed to it (`config=`: `AllReduceConfig`,
  `RmsnormConfig`), and the string a torch.compile graph carries in its place.

This package holds every name of those modules (`ironlink.tuning` is this package), so an op
reads `tuning.X`. Nothing here is set at run time: a benchmark or test that times or checks a
choice the tables do not make passes the op a config of its own (`op_config`).
"""

from __future__ import annotations

from ...language._abi import MAX_CTAS
from . import collectives, lookup, matmul, moe, op_config, rmsnorm, sequence_parallel  # noqa: F401
from .collectives import *  # noqa: F401,F403
from .lookup import *  # noqa: F401,F403
from .matmul import *  # noqa: F401,F403
from .moe import *  # noqa: F401,F403
from .rmsnorm import *  # noqa: F401,F403
from .sequence_parallel import *  # noqa: F401,F403

__all__ = [*collectives.__all__, *lookup.__all__, *matmul.__all__, *moe.__all__, *rmsnorm.__all__, *sequence_parallel.__all__,
           "MAX_CTAS"]
