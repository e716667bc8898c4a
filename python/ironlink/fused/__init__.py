"""Fused compute + communication ops: Triton kernels that call ironlink inline, and host
functions on heap tensors. Each op is a host module named after it (its checks, `plan()` and
launch) beside its kernels module(s):

- `all_reduce_rmsnorm`: all-reduce + residual add + RMSNorm; kernels in `all_reduce_rmsnorm_kernels`,
  the one-node modes' exchanges in `all_reduce_rmsnorm_exchanges` (one-shot) and
  `all_reduce_rmsnorm_two_shot`, the norm in `all_reduce_rmsnorm_norm`.
- `matmul_all_reduce`: row-parallel linear, each output tile all-reduced as it is computed
  (`matmul_all_reduce_kernels`, `..._one_shot_kernels`, `..._two_shot_kernels`).
- `all_gather_matmul`: all-gather + matmul, the GEMM consuming other ranks' rows as they arrive.
- `matmul_reduce_scatter`: matmul + reduce-scatter, each tile pushed to the rank that owns its rows
  and reduced there.
- shared: `gemm_tiles` (the GEMM tile, device) and `gemm_operands` (operand checks, layouts, TMA
  descriptors), `cublas_methods` (the sequence-parallel ops as cuBLAS GEMMs around ironlink
  transfers), `copy_engine` (the copy engine's flags), `barrier`, `trace`.

This package's attributes named after the ops are the ops (`ironlink.fused.all_reduce_rmsnorm` is
the function, as `ironlink.all_reduce_rmsnorm`); reach a host module by its path
(`from ironlink.fused.all_reduce_rmsnorm import plan`, `importlib.import_module`). The kernels are
importable for use as written or as models; the host functions check their arguments, choose the
launch (`ironlink.tuning`), and report device statuses like the host-level collectives
(`check=True` raises at once; otherwise `heap.check()` raises recorded timeouts).
"""

from __future__ import annotations

from .all_gather_matmul import all_gather_matmul
from .all_gather_matmul_kernels import allgather_matmul_copy_engine_kernel, allgather_matmul_kernel
from .all_reduce_rmsnorm import all_reduce_rmsnorm
from .all_reduce_rmsnorm_kernels import allreduce_rmsnorm_kernel
from .matmul_all_reduce import matmul_all_reduce
from .matmul_all_reduce_kernels import matmul_allreduce_kernel
from .matmul_reduce_scatter import matmul_reduce_scatter
from .matmul_reduce_scatter_kernels import matmul_reducescatter_copy_engine_kernel, matmul_reducescatter_kernel

__all__ = ["all_gather_matmul", "all_reduce_rmsnorm", "allgather_matmul_copy_engine_kernel", "allgather_matmul_kernel", "allreduce_rmsnorm_kernel",
           "matmul_all_reduce", "matmul_allreduce_kernel", "matmul_reduce_scatter", "matmul_reducescatter_copy_engine_kernel",
           "matmul_reducescatter_kernel"]
