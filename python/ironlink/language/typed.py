"""Typed collectives for Triton code: the dtype code comes from the pointer's element type.

    import ironlink.typed as ilt

    @ironlink.jit
    @triton.jit
    def k(ctx, x_ptr, n, status):
        s = ilt.all_reduce(ctx, x_ptr, n)                      # dtype from x_ptr: fp32/fp16/bf16
        s = ilt.all_reduce(ctx, x_ptr, n, op=REDUCE_OP_MAX)
        tl.store(status + tl.program_id(0), s)

Each function is a Triton builtin: it runs while Triton traces the kernel, reads the pointer's
element type, and calls the matching ``ironlink.language.symm_*`` wrapper with the dtype code as a
compile-time constant (so nothing is decided at run time). An element type the device library
does not reduce/copy (e.g. int32), or input and output pointers of different element types, are
compilation errors naming the types. Like the ``symm_*`` functions, every thread of the CTA makes
the call and the result is the status (0 = OK). ``op`` defaults to ``REDUCE_OP_SUM``.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl
from triton.language import core

from . import _abi
from .. import language as il

# Triton element type -> ironlink dtype code. Keyed by Triton's type names ("fp32", ...), which
# are what dtype objects compare and print as.
_CODES: dict[str, int] = {
    core.float32.name: _abi.DTYPE["FLOAT32"],
    core.float16.name: _abi.DTYPE["FLOAT16"],
    core.bfloat16.name: _abi.DTYPE["BFLOAT16"],
}
_SUM = _abi.REDUCE_OP["SUM"]

__all__ = ["all_gather", "all_reduce", "all_to_all", "broadcast", "dtype_code", "reduce", "reduce_scatter",
           "failure_or", "peer_pointer", "tile_all_gather", "tile_all_reduce", "tile_put", "tile_reduce_scatter"]


def _element_type(ptr: Any, what: str, _semantic: Any) -> core.dtype:
    """The element type `ptr` points to, or a TypeError saying why the call needs a typed pointer."""
    t = _semantic.to_tensor(ptr)
    if not t.dtype.is_ptr():
        raise TypeError(
            f"{what} must be a tensor pointer (its element type gives the dtype), got {t.dtype}; "
            "for a raw address use ironlink.language.symm_* with an explicit dtype"
        )
    return t.dtype.element_ty


def _code(ty: core.dtype, what: str) -> int:
    code = _CODES.get(ty.name)
    if code is None:
        raise TypeError(
            f"{what} points to {ty}, which ironlink collectives do not support "
            f"(supported element types: {', '.join(_CODES)})"
        )
    return code


def _pair_code(in_ptr: Any, out_ptr: Any, fn: str, _semantic: Any) -> int:
    """The dtype code of an (in, out) pair; both must point to the same supported type."""
    ti = _element_type(in_ptr, f"ironlink.typed.{fn}(in_ptr)", _semantic)
    to = _element_type(out_ptr, f"ironlink.typed.{fn}(out_ptr)", _semantic)
    if ti != to:
        # The device functions move elements of one size: a mismatch would reinterpret bytes.
        raise TypeError(f"ironlink.typed.{fn}: in_ptr points to {ti} but out_ptr to {to}; they must match")
    return _code(ti, f"ironlink.typed.{fn}(in_ptr)")


@core.extern
def dtype_code(ptr: Any, _semantic: Any = None) -> core.constexpr:
    """The ironlink dtype code (``DTYPE_*``) of `ptr`'s element type, as a constexpr; for calling
    ``ironlink.language.symm_*`` directly (e.g. ``symm_all_reduce`` with a byte offset)."""
    return core.constexpr(_code(_element_type(ptr, "ironlink.typed.dtype_code(ptr)", _semantic), "ptr"))


@core.extern
def all_reduce(ctx: Any, ptr: Any, n: Any, op: Any = _SUM, _semantic: Any = None) -> core.tensor:
    """In-place all-reduce of `n` elements at `ptr` (``symm_all_reduce`` with byte_offset 0)."""
    dt = _code(_element_type(ptr, "ironlink.typed.all_reduce(ptr)", _semantic), "ironlink.typed.all_reduce(ptr)")
    return il.symm_all_reduce(ctx, ptr, 0, n, op, dt, _semantic=_semantic)


@core.extern
def reduce_scatter(ctx: Any, in_ptr: Any, out_ptr: Any, n: Any, op: Any = _SUM, _semantic: Any = None) -> core.tensor:
    """`out_ptr` (n) = reduction over ranks of block `rank` of `in_ptr` (world x n)."""
    dt = _pair_code(in_ptr, out_ptr, "reduce_scatter", _semantic)
    return il.symm_reduce_scatter(ctx, in_ptr, out_ptr, n, op, dt, _semantic=_semantic)


@core.extern
def all_gather(ctx: Any, in_ptr: Any, out_ptr: Any, n: Any, _semantic: Any = None) -> core.tensor:
    """Block p of `out_ptr` (world x n) = rank p's `in_ptr` (n)."""
    dt = _pair_code(in_ptr, out_ptr, "all_gather", _semantic)
    return il.symm_all_gather(ctx, in_ptr, out_ptr, n, dt, _semantic=_semantic)


@core.extern
def broadcast(ctx: Any, ptr: Any, n: Any, root: Any, _semantic: Any = None) -> core.tensor:
    """Every rank's `ptr` (n) gets `root`'s, in place."""
    dt = _code(_element_type(ptr, "ironlink.typed.broadcast(ptr)", _semantic), "ironlink.typed.broadcast(ptr)")
    return il.symm_broadcast(ctx, ptr, n, dt, root, _semantic=_semantic)


@core.extern
def reduce(
    ctx: Any, in_ptr: Any, out_ptr: Any, n: Any, op: Any = _SUM, root: Any = 0, _semantic: Any = None
) -> core.tensor:
    """On `root`, `out_ptr` (n) = reduction of every rank's `in_ptr` (n); `root` defaults to 0."""
    dt = _pair_code(in_ptr, out_ptr, "reduce", _semantic)
    return il.symm_reduce(ctx, in_ptr, out_ptr, n, op, dt, root, _semantic=_semantic)


@core.extern
def all_to_all(ctx: Any, in_ptr: Any, out_ptr: Any, n: Any, _semantic: Any = None) -> core.tensor:
    """Block p of `out_ptr` = block `rank` of rank p's `in_ptr` (both world x n)."""
    dt = _pair_code(in_ptr, out_ptr, "all_to_all", _semantic)
    return il.symm_all_to_all(ctx, in_ptr, out_ptr, n, dt, _semantic=_semantic)


@core.extern
def all_to_all_v(ctx: Any, in_ptr: Any, in_rows: Any, send_counts_ptr: Any, out_ptr: Any, out_rows: Any,
                 recv_counts_ptr: Any, recv_offsets_ptr: Any, row_elements: Any, _semantic: Any = None) -> core.tensor:
    """Variable all-to-all with device-side counts (``symm_all_to_all_v``): rows of `row_elements`
    elements, `send_counts_ptr[p]` of them to rank p; receive counts and offsets written."""
    dt = _pair_code(in_ptr, out_ptr, "all_to_all_v", _semantic)
    return il.symm_all_to_all_v(ctx, in_ptr, in_rows, send_counts_ptr, out_ptr, out_rows, recv_counts_ptr,
                                recv_offsets_ptr, row_elements, dt, _semantic=_semantic)


@core.extern
def tile_all_reduce(ctx: Any, ptr: Any, rows: Any, cols: Any, row_stride: Any, tile: Any, op: Any = _SUM,
                    _semantic: Any = None) -> core.tensor:
    """In-place all-reduce, by this CTA alone, of the `rows` x `cols` tile at `ptr` (rows
    `row_stride` elements apart) with tile index `tile` of every rank (``symm_tile_all_reduce``)."""
    dt = _code(_element_type(ptr, "ironlink.typed.tile_all_reduce(ptr)", _semantic), "ironlink.typed.tile_all_reduce(ptr)")
    return il.symm_tile_all_reduce(ctx, ptr, rows, cols, row_stride, tile, op, dt, _semantic=_semantic)


@core.extern
def tile_all_gather(ctx: Any, ptr: Any, rows: Any, cols: Any, row_stride: Any, block_stride: Any, tile: Any,
                    _semantic: Any = None) -> core.tensor:
    """In-place all-gather of `world` tiles `block_stride` elements apart, by this CTA alone
    (``symm_tile_all_gather``)."""
    dt = _code(_element_type(ptr, "ironlink.typed.tile_all_gather(ptr)", _semantic), "ironlink.typed.tile_all_gather(ptr)")
    return il.symm_tile_all_gather(ctx, ptr, rows, cols, row_stride, block_stride, tile, dt, _semantic=_semantic)


@core.extern
def tile_reduce_scatter(ctx: Any, in_ptr: Any, out_ptr: Any, rows: Any, cols: Any, row_stride: Any,
                        block_stride: Any, tile: Any, op: Any = _SUM, _semantic: Any = None) -> core.tensor:
    """`out_ptr` (one tile) = block `rank` of `in_ptr`'s `world` tiles reduced over ranks, by this
    CTA alone (``symm_tile_reduce_scatter``)."""
    dt = _pair_code(in_ptr, out_ptr, "tile_reduce_scatter", _semantic)
    return il.symm_tile_reduce_scatter(ctx, in_ptr, out_ptr, rows, cols, row_stride, block_stride, tile, op, dt,
                                       _semantic=_semantic)


@core.extern
def tile_put(ctx: Any, dst_ptr: Any, src_ptr: Any, rows: Any, cols: Any, row_stride: Any, tile: Any, peer: Any,
             _semantic: Any = None) -> core.tensor:
    """Copies the tile at `src_ptr` to `dst_ptr` on `peer` and signals `tile` there (``symm_tile_put``)."""
    dt = _pair_code(src_ptr, dst_ptr, "tile_put", _semantic)
    return il.symm_tile_put(ctx, dst_ptr, src_ptr, rows, cols, row_stride, tile, peer, dt, _semantic=_semantic)


@triton.jit
def peer_pointer(ctx, ptr, peer):
    """`ptr` (into the heap) as `peer`'s address of the same element, typed like `ptr`, and known to
    Triton to be as aligned as `ptr`, so loads and stores through it keep their vector width (a
    bare ``symm_peer_ptr(...).to(pointer type)`` loses that: 2 bytes per instruction). The heaps'
    bases are allocation bases (cuMemAlloc / cuIpcOpenMemHandle: 256-byte aligned), so the distance
    is a multiple of 256; the divide and multiply tell Triton so (it ignores multiple_of on a
    scalar)."""
    distance = (il.symm_peer_ptr(ctx, ptr, peer) - ptr.to(tl.int64)) // 256 * 256
    return (ptr.to(tl.pointer_type(tl.int8)) + distance).to(ptr.dtype)


@triton.jit
def failure_or(status, other):
    """`status` if it is a failure (non-zero), else `other`: how a kernel carries a bad status through
    a sequence of calls. Both are evaluated, so a call in `other` runs either way."""
    return tl.where(status != 0, status, other)
