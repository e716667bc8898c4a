"""What the fused matmul ops share: the GEMM tile, one [BLOCK_M, BLOCK_N] tile of a @ b in fp32,
the grid-stride copy of a matrix their kernels for several nodes make, and the TMA descriptor of
the peer's copy of a heap tensor that their pushes at world 2 write through.

A plain Triton GEMM (software-pipelined by Triton's `num_stages`), written once so every fused
op computes its tiles the same way and a faster tile loop lands in all of them. Two ways to read
the operands: through pointers with their strides (any layout, any GPU), or through TMA tensor
descriptors (`operand_descriptors`: Hopper and later, row-major `a`, `b` row- or column-major,
16-byte aligned rows), which the copy engine of each SM fetches while the warps multiply.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import triton
import triton.language as tl

from ..language import _abi
from ..runtime.tensor_spec import TensorSpec, check_tensor


@triton.jit
def tile_coords(t, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(tile row, tile column) of tile `t`: groups of GROUP_M tile rows walked column by column,
    so neighbouring CTAs share b's columns in L2."""
    per_group = GROUP_M * tiles_n
    group = t // per_group
    first_m = group * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (t % per_group) % rows, (t % per_group) // rows


@triton.jit
def copy_rows(src, src_stride_r, src_stride_c, dst, dst_stride_r, dst_stride_c, ROWS, COLS,
              PIECE: tl.constexpr):
    """This CTA's share of copying src [ROWS, COLS] into dst (any strides), in pieces of PIECE
    columns of a row spread over all CTAs of the launch."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    cols = tl.arange(0, PIECE)
    pieces = tl.cdiv(COLS, PIECE)
    for u in range(pid, ROWS * pieces, grid):
        row, c = tl.cast(u // pieces, tl.int64), (u % pieces) * PIECE + cols
        x = tl.load(src + row * src_stride_r + c * src_stride_c, mask=c < COLS)
        tl.store(dst + row * dst_stride_r + c * dst_stride_c, x, mask=c < COLS)


@triton.jit
def gemm_range(acc, a, b, row0, row_end, col0, N, k_begin, k_end, K, stride_am, stride_ak, stride_bk, stride_bn,
               TMA: tl.constexpr, B_ROW_MAJOR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """`acc` plus the product of a's rows row0.. and b's columns col0.. over k in [k_begin, k_end)
    (k_begin a multiple of BLOCK_K): a fused kernel may split a tile's K loop to do other work in
    between. `a`, `b`: pointers read with their strides (rows from row_end and columns from N on
    read as 0), or TMA descriptors when TMA (`operand_descriptors`: `b` of b [K, N] when
    B_ROW_MAJOR, else of its transpose; they zero-fill past the matrices' edges)."""
    rk = tl.arange(0, BLOCK_K)
    rm = row0 + tl.arange(0, BLOCK_M)
    rn = col0 + tl.arange(0, BLOCK_N)
    for k0 in range(k_begin, k_end, BLOCK_K):
        if TMA:
            x = a.load([row0, k0])
            if B_ROW_MAJOR:
                y = b.load([k0, col0])
            else:
                y = b.load([col0, k0]).T
        else:
            ka = k0 + rk
            x = tl.load(a + rm[:, None].to(tl.int64) * stride_am + ka[None, :] * stride_ak,
                        mask=(rm[:, None] < row_end) & (ka[None, :] < K), other=0.0)
            y = tl.load(b + ka[:, None].to(tl.int64) * stride_bk + rn[None, :] * stride_bn,
                        mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, y, acc)
    return acc


@triton.jit
def gemm_tile(a, b, row0, row_end, col0, N, K, stride_am, stride_ak, stride_bk, stride_bn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N]: rows row0.. (those below row_end; others 0) of a [*, K] times
    columns col0.. (below N) of b [K, N], both read with their strides."""
    return gemm_range(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), a, b, row0, row_end, col0, N, 0, K, K,
                      stride_am, stride_ak, stride_bk, stride_bn, False, False, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def tile_offsets(m0, n0, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(element offsets [BLOCK_M, BLOCK_N] (int64), mask) of the tile at rows m0.., columns n0.. of
    a contiguous [M, N] matrix; rows and columns past M, N masked out."""
    rm = m0 + tl.arange(0, BLOCK_M)
    rn = n0 + tl.arange(0, BLOCK_N)
    return rm[:, None].to(tl.int64) * N + rn[None, :], (rm[:, None] < M) & (rn[None, :] < N)


@triton.jit
def store_tile(dst, acc, m0, n0, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stores the fp32 tile `acc` at rows m0.., columns n0.. of the contiguous [M, N] matrix at
    `dst` (a local or a peer's address), rounded to dst's dtype; rows and columns past M, N
    are left out."""
    at, mask = tile_offsets(m0, n0, M, N, BLOCK_M, BLOCK_N)
    tl.store(dst + at, acc.to(dst.dtype.element_ty), mask=mask)


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


@triton.jit
def product_tile(a, b, out, t, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Computes output tile `t` of a @ b and stores it into `out` [M, N]; returns its first row and
    column."""
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    tm, tn = tile_coords(t, tiles_m, tiles_n, GROUP_M)
    acc = gemm_tile(a, b, tm * BLOCK_M, M, tn * BLOCK_N, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    BLOCK_M, BLOCK_N, BLOCK_K)
    store_tile(out, acc, tm * BLOCK_M, tn * BLOCK_N, M, N, BLOCK_M, BLOCK_N)
    return tm * BLOCK_M, tn * BLOCK_N
