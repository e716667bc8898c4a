"""Fused compute + communication ops: Triton kernels that call ironlink inline, and host
functions on heap tensors. One module per op:

- `allreduce_rmsnorm`: all-reduce + residual add + RMSNorm (`all_reduce_rmsnorm`).
- `matmul_allreduce`: row-parallel linear, each output tile all-reduced as it is computed
  (`matmul_all_reduce`).

The kernels are importable for use as written or as models (`allreduce_rmsnorm_kernel`,
`matmul_allreduce_kernel`); the host functions check their arguments, choose the launch
(`ironlink.tuning`), and report device statuses like the host-level collectives (`check=True`
raises at once; otherwise `heap.check()` raises recorded timeouts).
"""

from __future__ import annotations

from .allreduce_rmsnorm import all_reduce_rmsnorm, allreduce_rmsnorm_kernel
from .matmul_allreduce import matmul_all_reduce, matmul_allreduce_kernel

__all__ = ["all_reduce_rmsnorm", "allreduce_rmsnorm_kernel", "matmul_all_reduce", "matmul_allreduce_kernel"]
