"""How the fused matmul ops take their operands, on the host: the checks of a @ b and of the
outputs, whether the kernels read a and b through TMA descriptors or through pointers (the layout
and the descriptors `gemm_tiles.gemm_range` reads), and the TMA descriptor of the peer's copy of a
heap tensor that their pushes at world 2 write through. Pure but for the descriptors and
`layout_for`: the checks run without a GPU.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..language import _abi
from ..runtime.tensor_spec import TensorSpec, check_tensor


class OperandLayout(NamedTuple):
    """How the kernels read a and b: through TMA descriptors (`tma`), b stored row-major or not."""

    tma: bool
    b_row_major: bool


def operand_layout(a_strides: tuple[int, ...], b_strides: tuple[int, ...], itemsize: int,
                   cc_major: int) -> OperandLayout:
    """TMA where the GPU has it (compute capability 9 and up) and the operands allow it: `a`
    row-major, `b` row- or column-major, every row 16-byte aligned (the bases are checked on the
    tensors by `operand_descriptors`). Otherwise the pointer path (any strides)."""
    def rows_aligned(stride: int) -> bool:
        return (stride * itemsize) % 16 == 0

    a_ok = a_strides[1] == 1 and rows_aligned(a_strides[0])
    b_row = b_strides[1] == 1 and rows_aligned(b_strides[0])
    b_col = b_strides[0] == 1 and rows_aligned(b_strides[1])
    return OperandLayout(cc_major >= 9 and a_ok and (b_row or b_col), b_row)


def layout_for(a: Any, b: Any) -> OperandLayout:
    """`operand_layout` of two torch tensors on their GPU, with their bases' alignment."""
    import torch

    layout = operand_layout((a.stride(0), a.stride(1)), (b.stride(0), b.stride(1)), a.element_size(),
                            torch.cuda.get_device_capability(a.device)[0])
    aligned = a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
    return layout if aligned else OperandLayout(False, layout.b_row_major)


def operand_descriptors(a: Any, b: Any, layout: OperandLayout, block_m: int, block_n: int,
                        block_k: int) -> tuple[Any, Any]:
    """The kernel arguments for a and b: TMA descriptors when `layout.tma`, else the tensors
    themselves. The caller checked the bases are 16-byte aligned (`layout_for`)."""
    if not layout.tma:
        return a, b
    from triton.tools.tensor_descriptor import TensorDescriptor

    a_desc = TensorDescriptor(a, list(a.shape), list(a.stride()), [block_m, block_k])
    if layout.b_row_major:
        b_desc = TensorDescriptor(b, list(b.shape), list(b.stride()), [block_k, block_n])
    else:
        bt = b.t()
        b_desc = TensorDescriptor(bt, list(bt.shape), list(bt.stride()), [block_n, block_k])
    return a_desc, b_desc


def peer_descriptor(heap: Any, t: Any, block: list[int]) -> Any:
    """A TMA descriptor of the one peer's copy of the contiguous heap tensor `t` (heap tensors are
    16-byte aligned), in blocks `block`: for the pushes at world 2."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    peer = heap.peer_tensor(t, 1 - heap.rank)
    return TensorDescriptor(peer, list(t.shape), list(t.stride()), block)


def check_operands(a: TensorSpec, b: TensorSpec, device: str, op: str) -> tuple[int, int, int, int]:
    """(M, K, N, dtype code) of a [M, K] @ b [K, N], after checking both are 2-D, agree on K,
    share a dtype, bf16 or fp16 (any strides: the kernels read them with their strides)."""
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ValueError(f"{op}: a and b must be 2-D, got shapes {a.shape} and {b.shape}")
    (m, k), (kb, n) = a.shape, b.shape
    if kb != k:
        raise ValueError(f"{op}: a is [M, K] = {list(a.shape)} and b is [K, N] = {list(b.shape)}: their K differ")
    code = check_tensor(a._replace(contiguous=True), device)
    if check_tensor(b._replace(contiguous=True), device) != code:
        raise TypeError(f"{op}: a ({a.dtype}) and b ({b.dtype}) must have one dtype")
    if code == _abi.DTYPE["FLOAT32"]:
        raise TypeError(f"{op} takes bfloat16 or float16 operands (fp32 accumulation inside)")
    return m, k, n, code


def check_output(t: TensorSpec, shape: tuple[int, ...], code: int, device: str, op: str) -> None:
    """`t` is contiguous, on `device`, of dtype `code` and `shape`."""
    if check_tensor(t, device) != code:
        raise TypeError(f"{op}: {t.name} ({t.dtype}) must have the operands' dtype")
    if t.shape != shape:
        raise ValueError(f"{op}: {t.name} must have shape {shape}, got {t.shape}")


__all__ = ["OperandLayout", "check_operands", "check_output", "layout_for", "operand_descriptors", "operand_layout",
           "peer_descriptor"]
