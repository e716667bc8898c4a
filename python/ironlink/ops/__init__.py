"""Host-level collectives on tensors of a SymmetricHeap, for code that writes no Triton
(`ironlink.all_reduce`, ...). What they share with the fused ops and MoeExchange (the argument
checks, the launch path, PDL, the slot workspaces) is the floor below them, in `ironlink.runtime`.

- `collectives`: all_reduce, all_gather, reduce_scatter;
- `variable_all_to_all`: all_to_all_v (per-rank counts);
- `torch_library`: all of them as torch.library operators, for torch.compile.
"""

from __future__ import annotations

from .collectives import Plan, all_gather, all_reduce, reduce_scatter
from .variable_all_to_all import all_to_all_v

__all__ = ["Plan", "all_gather", "all_reduce", "all_to_all_v", "reduce_scatter"]
