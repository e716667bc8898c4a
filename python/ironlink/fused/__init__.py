"""Fused compute + communication ops: Triton kernels that call ironlink inline, and host
functions on heap tensors. One module per op:

- `allreduce_rmsnorm`: all-reduce + residual add + RMSNorm (`all_reduce_rmsnorm`; its kernels in
  `allreduce_rmsnorm_kernels`, the modes' exchanges and the norm in modules of their own).
- `matmul_allreduce`: row-parallel linear, each output tile all-reduced as it is computed
  (`matmul_all_reduce`).
- `allgather_matmul`: all-gather + matmul, the GEMM consuming other ranks' rows as they arrive
  (`all_gather_matmul`).
- `matmul_reducescatter`: matmul + reduce-scatter, each tile pushed to the rank that owns its rows
  and reduced there (`matmul_reduce_scatter`).
- `gemm`: the GEMM tile they share.

The kernels are importable for use as written or as models (`allreduce_rmsnorm_kernel`,
`matmul_allreduce_kernel`, `allgather_matmul_kernel`, `allgather_matmul_copy_engine_kernel`, `matmul_reducescatter_kernel`,
`matmul_reducescatter_copy_engine_kernel`); the host functions check their arguments, choose the launch
(`ironlink.tuning`), and report device statuses like the host-level collectives (`check=True`
raises at once; otherwise `heap.check()` raises recorded timeouts).
"""

from __future__ import annotations

from .all_gather_matmul import all_gather_matmul
from .all_gather_matmul_kernels import allgather_matmul_copy_engine_kernel, allgather_matmul_kernel
from .allreduce_rmsnorm import all_reduce_rmsnorm
from .allreduce_rmsnorm_kernels import allreduce_rmsnorm_kernel
from .matmul_all_reduce import matmul_all_reduce
from .matmul_all_reduce_kernels import matmul_allreduce_kernel
from .matmul_reduce_scatter import matmul_reduce_scatter
from .matmul_reduce_scatter_kernels import matmul_reducescatter_copy_engine_kernel, matmul_reducescatter_kernel

__all__ = ["all_gather_matmul", "all_reduce_rmsnorm", "allgather_matmul_copy_engine_kernel", "allgather_matmul_kernel", "allreduce_rmsnorm_kernel",
           "matmul_all_reduce", "matmul_allreduce_kernel", "matmul_reduce_scatter", "matmul_reducescatter_copy_engine_kernel",
           "matmul_reducescatter_kernel"]
