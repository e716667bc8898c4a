"""MoE token dispatch and combine whose counts never leave the GPU (no host sync, CUDA-graph safe
when the routing changes between replays):

    moe = ironlink.MoeExchange(heap, max_tokens=4096, hidden=7168, topk=8, num_experts=64)
    recv_x, expert_counts, expert_offsets, handle = moe.dispatch(x, topk_idx, topk_weights)
    y = experts(recv_x, expert_counts, expert_offsets)       # grouped GEMM over local experts
    out = moe.combine(y, handle)                               # [T, H], weighted sum over top-k

- `exchange`: `MoeExchange` (the layer: buffers, the two all_to_all_v exchanges, errors) and the
  fp8 reference quantization.
- `sort`: the counting sorts on the GPU (which send row each token takes; each received choice's
  row in the expert-major layout).
- `kernels`: the row-moving kernels (pack, gather, the two reductions of combine).
"""

from __future__ import annotations

from .exchange import Handle, MoeExchange, fp8_dequantize, fp8_quantize_reference

__all__ = ["Handle", "MoeExchange", "fp8_dequantize", "fp8_quantize_reference"]
