"""Launch-tagged flag words that a kernel waits on by itself, without a device-library signal: an
int64 word whose high half is a launch count plus one (never the zero the words are made with)
and whose low half a 32-bit value. all_reduce_rmsnorm's split mode publishes its slices' sums so
within a rank; the MoE low-latency dispatch announces each CTA's sends so across ranks when its
receive runs in a later launch (a tile signal left pending across other kernels could be taken by
theirs). A wait is bounded by the context's timeout and then records TIMEOUT in the context as a
device function records its errors (`runtime::context::record_error`), so heap.check() raises."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

from . import _abi

_TIMEOUT_WORD = tl.constexpr(_abi.CONTEXT_FIELDS["timeout_ns"][0] // 8)  # the context's timeout, in i64 words
_TIMEOUT = tl.constexpr(_abi.STATUS["TIMEOUT"])
_ERROR_WORD = tl.constexpr(_abi.CONTEXT_FIELDS["error"][0] // 4)  # the context's error and detail words (i32)
_DETAIL_WORD = tl.constexpr(_abi.CONTEXT_FIELDS["error_detail"][0] // 4)


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
    if s != 0:
        errors = ctx.to(tl.pointer_type(tl.int32))
        if tl.atomic_cas(errors + _ERROR_WORD, 0, s) == 0:
            tl.store(errors + _DETAIL_WORD, FUNCTION)
    return got, s
