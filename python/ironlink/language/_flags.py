"""Launch-tagged flag words that a kernel waits on by itself, without a device-library signal: an
int64 word whose high half is a launch count plus one (never the zero the words are made with)
and whose low half a 32-bit value. all_reduce_rmsnorm's split mode publishes its slices' sums so
within a rank. A wait is bounded by the context's timeout and then records TIMEOUT in the context as a
device function records its errors (`runtime::context::record_error`: the timeout set to 0, so the
waits after a lost peer give up at once), so heap.check() raises.

Also data that is its own flag (Lamport's scheme, as TensorRT-LLM's one-shot all-reduce uses it):
a receive buffer holds "empty" in every element until a peer stores into it (16 and 32 bits: the
sign bit alone, negative zero of a float, the smallest int32; 8 bits, fp8 e4m3 bytes: 0xFF, a NaN
the quantizer never makes from finite values, so a finite fp8 row travels bit for bit), senders
never store it (`unempty`: -0.0 becomes +0.0, the fp8 NaN 0xFF the NaN 0x7F, on every rank
alike), and the receiver polls the data itself until no element is empty (`wait_written`), then
stores empty back (at once, or a call later: moe/low_latency_kernels.py says why it waits). No
signal, no fence: the bytes cross NVLink once and are read as they land. Each element is its own
flag, so nothing depends on how a peer's stores are split into packets. Users: the
lamport all-reduces (language/slots.py) and MoeExchange's low-latency path (moe/low_latency_kernels.py)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

from . import _abi

_TIMEOUT_WORD = tl.constexpr(_abi.CONTEXT_FIELDS["timeout_ns"][0] // 8)  # the context's timeout, in i64 words
_TIMEOUT = tl.constexpr(_abi.STATUS["TIMEOUT"])
_ERROR_WORD = tl.constexpr(_abi.CONTEXT_FIELDS["error"][0] // 4)  # the context's error and detail words (i32)
_DETAIL_WORD = tl.constexpr(_abi.CONTEXT_FIELDS["error_detail"][0] // 4)
# "Empty" per element width in bits, as the signed integer of that width: 0xFF for 8 (an fp8 e4m3
# NaN), the sign bit alone for 16 and 32. The kernels use it through `_empty_bits`; hosts fill new
# receive buffers with it.
EMPTY_BITS = {8: -1, 16: -(1 << 15), 32: -(1 << 31)}
_EMPTY8, _EMPTY16, _EMPTY32 = (tl.constexpr(EMPTY_BITS[w]) for w in (8, 16, 32))


@triton.jit
def tagged(flag, v):
    """An f32 `v` as a word tagged with `flag`."""
    return (flag.to(tl.int64) << 32) | (v.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def all_tagged(got, flag):
    """1 if every word of `got` carries `flag`, else 0."""
    return tl.min(((got >> 32).to(tl.int32) == flag).to(tl.int32))


@triton.jit
def wait_tagged(ctx, ptrs, flag, FUNCTION: tl.constexpr):
    """Polls the words at `ptrs` (any block of pointers; volatile loads) until every one carries
    `flag`, for at most the context's timeout. Returns (their last values, status): 0, or TIMEOUT,
    then recorded in the context with detail FUNCTION (an index of _abi.FUNCTIONS) unless an
    error is recorded there already."""
    got = tl.load(ptrs, volatile=True)
    timeout = tl.load(ctx.to(tl.pointer_type(tl.int64)) + _TIMEOUT_WORD)
    start = tl_cuda.globaltimer()
    now = start
    while (all_tagged(got, flag) == 0) & (now - start <= timeout):
        got = tl.load(ptrs, volatile=True)
        now = tl_cuda.globaltimer()
    s = tl.where(all_tagged(got, flag) == 1, 0, _TIMEOUT)
    _record(ctx, s, FUNCTION)
    return got, s


@triton.jit
def _record(ctx, s, FUNCTION: tl.constexpr):
    """Records status `s` (if not 0) in the context with detail FUNCTION, unless an error is
    recorded there already; a TIMEOUT recorded also sets the context's wait timeout to 0, as the
    device library's `record_error` does (a lost peer: every wait after it gives up at once; the
    host puts the timeout back when it clears the error)."""
    if s != 0:
        errors = ctx.to(tl.pointer_type(tl.int32))
        if tl.atomic_cas(errors + _ERROR_WORD, 0, s) == 0:
            tl.store(errors + _DETAIL_WORD, FUNCTION)
            if s == _TIMEOUT:  # (callers pass earlier statuses on as `failed`: only TIMEOUT stops waits)
                tl.store(ctx.to(tl.pointer_type(tl.int64)) + _TIMEOUT_WORD, 0)


@triton.jit
def _bits(v):
    """v's bits as a signed integer of its width (8, 16 or 32)."""
    if v.dtype.primitive_bitwidth == 8:
        b = v.to(tl.int8, bitcast=True)
    elif v.dtype.primitive_bitwidth == 16:
        b = v.to(tl.int16, bitcast=True)
    else:
        b = v.to(tl.int32, bitcast=True)
    return b


@triton.jit
def _empty_bits(v):
    """"Empty" as a signed integer of v's width: 0xFF for 8 bits (an fp8 e4m3 NaN), the sign bit
    alone for 16 and 32 (negative zero of a float, the smallest integer)."""
    if v.dtype.primitive_bitwidth == 8:
        e = tl.full(v.shape, _EMPTY8, tl.int8)
    elif v.dtype.primitive_bitwidth == 16:
        e = tl.full(v.shape, _EMPTY16, tl.int16)
    else:
        e = tl.full(v.shape, _EMPTY32, tl.int32)
    return e


@triton.jit
def is_empty(v):
    """Where v (8-, 16- or 32-bit: floats, fp8 bytes or integers) holds "empty" (`_empty_bits`)."""
    return _bits(v) == _empty_bits(v)


@triton.jit
def empty_like(v):
    """A block of "empty" shaped and typed as v (from its bits: a -0.0 literal could be folded to
    +0.0)."""
    return _empty_bits(v).to(v.dtype, bitcast=True)


@triton.jit
def unempty(v):
    """v with "empty" replaced: by zero for 16 and 32 bits (-0.0 as +0.0; for integers the
    smallest one as 0), by 0x7F for 8 bits (the fp8 NaN 0xFF as the NaN 0x7F): what a sender
    stores (and uses itself, so every rank has the same values)."""
    other = tl.zeros_like(v)
    if v.dtype.primitive_bitwidth == 8:
        other = tl.full(v.shape, 127, tl.int8).to(v.dtype, bitcast=True)
    return tl.where(is_empty(v), other, v)


@triton.jit
def wait_written(ctx, ptrs, mask, FUNCTION: tl.constexpr, failed=0):
    """Polls the elements at `ptrs` where `mask` (volatile loads; lanes outside it count as
    written) until none is empty, for at most the context's timeout. Returns (the values,
    status): 0, or TIMEOUT, recorded as `wait_tagged` does. Each poll reloads the whole block:
    a written element does not change until its reader empties it, and a mask of the late lanes
    alone would split the 16-byte loads into 2-byte ones. `failed`: the status of the caller's
    earlier waits; where it is not 0 the elements are loaded once, without waiting, and it is
    the status (a kernel that waits row by row stops waiting after its first timeout, so a lost
    peer costs it one timeout, not one a row)."""
    got = tl.load(ptrs, mask=mask, other=0.0, volatile=True)
    timeout = tl.load(ctx.to(tl.pointer_type(tl.int64)) + _TIMEOUT_WORD)
    start = tl_cuda.globaltimer()
    now = start
    while (tl.max(is_empty(got).to(tl.int32)) == 1) & (now - start <= timeout) & (failed == 0):
        got = tl.load(ptrs, mask=mask, other=0.0, volatile=True)
        now = tl_cuda.globaltimer()
    s = tl.where(failed != 0, failed, tl.where(tl.max(is_empty(got).to(tl.int32)) == 1, _TIMEOUT, 0))
    _record(ctx, s, FUNCTION)
    return got, s
