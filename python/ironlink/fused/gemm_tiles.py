"""The GEMM tile the fused matmul kernels share: one [BLOCK_M, BLOCK_N] tile of a @ b in fp32,
its place in the tile walk and its store, and the grid-stride copy of a matrix their kernels for
several nodes make (device code; how the host checks the operands and lays them out for these:
`gemm_operands`).

A plain Triton GEMM (software-pipelined by Triton's `num_stages`), written once so every fused
op computes its tiles the same way and a faster tile loop lands in all of them. Two ways to read
the operands: through pointers with their strides (any layout, any GPU), or through TMA tensor
descriptors (`gemm_operands.operand_descriptors`: Hopper and later, row-major `a`, `b` row- or
column-major, 16-byte aligned rows), which the copy engine of each SM fetches while the warps
multiply.
"""

from __future__ import annotations

import triton
import triton.language as tl


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


__all__ = ["copy_rows", "gemm_range", "gemm_tile", "product_tile", "store_tile", "tile_coords", "tile_offsets"]
