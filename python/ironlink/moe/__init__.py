"""MoE token dispatch and combine whose counts never leave the GPU (no host sync, CUDA-graph safe
when the routing changes between replays):

    moe = ironlink.MoeExchange(heap, max_tokens=4096, hidden=7168, topk=8, num_experts=64)
    recv_x, expert_counts, expert_offsets, handle = moe.dispatch(x, topk_idx, topk_weights)
    y = experts(recv_x, expert_counts, expert_offsets)       # grouped GEMM over local experts
    out = moe.combine(y, handle)                               # [T, H], weighted sum over top-k

- `exchange`: `MoeExchange` (the front: argument checks, path choice, recv_x, errors; dispatch
  and combine handed to the path's object); `config`: `MoeConfig`, its launch choices (blocks,
  warps, grids, the low-latency token limit: `MoeExchange(..., config=)`); `layout`: row layout,
  heap shapes, the layout a dispatch leaves for its combine, the fp8 reference quantization.
- `direct`, `direct_kernels`: the direct path on one node (peer loads and stores: each token
  row crosses once, straight into its expert-major rows; combine reduced on the way back).
- `low_latency`, `low_latency_kernels`, `low_latency_copies`: the path for decode batches on one
  node (one kernel each way; CTAs meet only the peers' same-index CTAs; recv_x by expert block;
  its buffers in copies used by calls in turn).
- `relay`, `relay_kernels`: the path across nodes (two all_to_all_v; the receiver copies each
  token to its expert-major rows, combine reduces before the way back).
- `sort`: the counting sorts on the GPU (which send row each token takes; each received choice's
  row in the expert-major layout).
- `kernels`: the row kernels the paths share (pack into a send row, fp8 quantization, the
  weighted sum of combine).
"""

from __future__ import annotations

from ..runtime.tuning.moe import MoeConfig
from .exchange import Handle, MoeExchange, fp8_dequantize, fp8_quantize_reference

__all__ = ["Handle", "MoeConfig", "MoeExchange", "fp8_dequantize", "fp8_quantize_reference"]
