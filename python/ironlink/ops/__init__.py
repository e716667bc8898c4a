"""Host-level collectives on tensors of a SymmetricHeap, for code that writes no Triton
(`ironlink.all_reduce`, ...), and the launch path the fused ops and MoeExchange share.

- `collectives`: all_reduce, all_gather, reduce_scatter; the argument checks (`TensorSpec`) and
  `launch_with_status`, through which every host-level call launches;
- `variable_all_to_all`: all_to_all_v (per-rank counts);
- `pdl`: programmatic dependent launch for the latency-bound kernels.
"""

from __future__ import annotations

from .collectives import (MULTI_NODE_OPS, Plan, TensorSpec, all_gather, all_reduce, check_tensor, launch_with_status,
                          reduce_scatter)
from .variable_all_to_all import all_to_all_v

__all__ = ["MULTI_NODE_OPS", "Plan", "TensorSpec", "all_gather", "all_reduce", "all_to_all_v", "check_tensor",
           "launch_with_status", "reduce_scatter"]
