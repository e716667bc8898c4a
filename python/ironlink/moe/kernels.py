"""The row kernels MoeExchange's paths share (moe/exchange.py): the pack of a token into a send row
(the relay path's send buffer, the direct path's stage), the fp8 quantization of every fp8 dispatch
and the weighted sum of every combine (`weighted_chunk`: one arithmetic, so the paths' bits agree).
None of them talks to a peer; the relay path's own copies and reductions are in
moe/relay_kernels.py.

Rows are `hidden` elements of a 2-byte dtype; every kernel walks a row in BLOCK-element chunks
(MoeConfig.row_block: 16-byte vectors per thread). An fp8 dispatch (`pack_rows_fp8`) quantizes each token per
FP8_GROUP channels on its way into the send buffer; the buffers still count in 2-byte words (an
fp8 row of `hidden` bytes is hidden / 2 words), so the exchange and the copies move it unchanged.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..language import fp8

# fp8 dispatch: one fp32 scale per 128 channels of a token (the 1x128 blocks of DeepEP's fp8
# dispatch and DeepGEMM's fp8 grouped GEMMs), scale = amax / 448 (e4m3's largest finite value).
# (Passed to the kernel as constexprs: a Triton kernel reads no plain module globals.)
FP8_GROUP = 128
FP8_MAX = fp8.FP8_MAX.value
FP8_MIN_AMAX = 1e-4  # an all-zero group still gets a finite scale (and zero bytes)


@triton.jit
def _pack_meta(idx, weights, send_row, words, t, meta_word, meta_words, row_words, num_experts,
               WORLD: tl.constexpr, K: tl.constexpr, META_BLOCK: tl.constexpr):
    """Token t's expert ids (int32; -1 for an id outside [0, num_experts), which no receiver
    counts) and weights (fp32 bits) at word meta_word of row send_row[t, p] of the send buffer's
    4-byte words, for every rank p the token goes to; zeros up to meta_words. Read straight from
    topk_idx / topk_weights (any integer / float dtype; the range is checked on the id as given,
    as the routing's sort checks it): the head of both pack kernels."""
    j = tl.arange(0, META_BLOCK)
    e = tl.load(idx + t * K + j, mask=j < K, other=0)
    e = tl.where((e >= 0) & (e < num_experts), e, -1).to(tl.int32)
    w = tl.load(weights + t * K + (j - K), mask=(j >= K) & (j < 2 * K), other=0.0).to(tl.float32)
    v = tl.where(j < K, e, tl.where(j < 2 * K, w.to(tl.int32, bitcast=True), 0))
    for p in tl.static_range(WORLD):
        r = tl.load(send_row + t * WORLD + p)
        tl.store(words + r * row_words + meta_word + j, v, mask=(j < meta_words) & (r >= 0))


@triton.jit
def pack_rows(x, idx, weights, send_row, out, words, hidden, meta_word, meta_words, row, num_experts,
              WORLD: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr, META_BLOCK: tl.constexpr):
    """Token t's row of `x` (at column 0) and its ids and weights (at 4-byte word meta_word, see
    _pack_meta) into row send_row[t, p] of the send buffer (`row` 2-byte words; `out` / `words`
    are its 2-byte and 4-byte views), for every rank p the token goes to (send_row < 0: not to
    p). One program per token: its row is loaded once and stored up to WORLD times."""
    t = tl.program_id(0).to(tl.int64)
    _pack_meta(idx, weights, send_row, words, t, meta_word, meta_words, row // 2, num_experts, WORLD, K, META_BLOCK)
    offs = tl.arange(0, BLOCK)
    for c in range(0, hidden, BLOCK):
        m = c + offs < hidden
        v = tl.load(x + t * hidden + c + offs, mask=m)
        for p in tl.static_range(WORLD):
            r = tl.load(send_row + t * WORLD + p)
            tl.store(out + r * row + c + offs, v, mask=m & (r >= 0))


@triton.jit
def _e4m3_bits(y):
    """float8_e4m3fn bits (uint8) of fp32 `y`, rounded to nearest even as torch's
    `.to(torch.float8_e4m3fn)` rounds (|y| >= 464 gives NaN, 0x7f, as there). Integer arithmetic
    rather than Triton's conversion, which saturates on the GPU and rounds ties away from zero in
    the interpreter: this way the GPU, the interpreter and torch agree bit for bit."""
    bits = y.to(tl.uint32, bitcast=True)
    a = bits & 0x7FFFFFFF
    # |y| >= 2^-6 (fp8 normal): rebias the exponent (127 -> 7), then drop 20 mantissa bits with
    # round to nearest even (add just under half, plus the kept lowest bit); a carry bumps the exponent.
    normal = (a - (120 << 23) + 0x7FFFF + ((a >> 20) & 1)) >> 20
    # Below 2^-6 (fp8 subnormal, steps of 2^-9): 2^14's fp32 ulp is 2^-9, so adding 2^14 rounds
    # |y| to that step (to nearest even, as every fp32 add does) and the low bits are the code.
    sub = (a.to(tl.float32, bitcast=True) + 16384.0).to(tl.uint32, bitcast=True) - (141 << 23)
    code = tl.where(a < (121 << 23), sub, normal)
    code = tl.where(a >= (1087 << 20), 0x7F, code)  # 1087 << 20: the bits of 464.0
    return (code | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def quantize_chunk(v, BLOCK: tl.constexpr, GROUP: tl.constexpr, QMAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    """(float8_e4m3fn bits [BLOCK] uint8, fp32 scales [BLOCK / GROUP]) of the chunk `v` [BLOCK]
    (any float dtype; masked-off lanes 0), per GROUP channels: amax = max(|v|, MIN_AMAX), scale =
    amax / QMAX, bits = e4m3(v * (QMAX / amax)), both divisions IEEE (div_rn): what
    `moe.fp8_quantize_reference` computes with torch ops. Every fp8 dispatch quantizes with it."""
    g = tl.reshape(v.to(tl.float32), (BLOCK // GROUP, GROUP))
    amax = tl.maximum(tl.max(tl.abs(g), axis=1), MIN_AMAX)
    scale = tl.math.div_rn(amax, tl.full((BLOCK // GROUP,), QMAX, tl.float32))
    inv = tl.math.div_rn(tl.full((BLOCK // GROUP,), QMAX, tl.float32), amax)
    return tl.reshape(_e4m3_bits(g * inv[:, None]), (BLOCK,)), scale


@triton.jit
def pack_rows_fp8(x, idx, weights, send_row, out8, words, hidden, meta_word, meta_words, row, scale_word,
                  num_experts, WORLD: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr, META_BLOCK: tl.constexpr,
                  GROUP: tl.constexpr, QMAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    """pack_rows with the token quantized to float8_e4m3fn per GROUP channels (`quantize_chunk`):
    row send_row[t, p] of the send buffer (`row` 2-byte words; `out8` / `words` are its byte and
    4-byte views) gets the fp8 bytes at byte 0, the ids and weights at word `meta_word`
    (_pack_meta) and the hidden / GROUP fp32 scales at word `scale_word`. hidden is a multiple of
    GROUP, so a group lies wholly inside or outside the row."""
    t = tl.program_id(0).to(tl.int64)
    # The ids and weights first: after the row loop they made Triton 3.5's fp8 kernel spill.
    _pack_meta(idx, weights, send_row, words, t, meta_word, meta_words, row // 2, num_experts, WORLD, K, META_BLOCK)
    offs = tl.arange(0, BLOCK)
    gi = tl.arange(0, BLOCK // GROUP)
    for c in range(0, hidden, BLOCK):
        m = c + offs < hidden
        q, scale = quantize_chunk(tl.load(x + t * hidden + c + offs, mask=m, other=0.0), BLOCK, GROUP, QMAX, MIN_AMAX)
        gm = c + gi * GROUP < hidden
        for p in tl.static_range(WORLD):
            r = tl.load(send_row + t * WORLD + p)
            tl.store(out8 + r * (2 * row) + c + offs, q, mask=m & (r >= 0))
            tl.store(words + r * (row // 2) + scale_word + c // GROUP + gi, scale.to(tl.int32, bitcast=True),
                     mask=gm & (r >= 0))


@triton.jit
def weighted_chunk(y, slot, weight, r, c, hidden, K: tl.constexpr, BLOCK: tl.constexpr):
    """fp32 [BLOCK]: the sum over j < K, in order, of weight[r, j] * y[slot[r, j], c:c + BLOCK],
    skipping slot < 0 (columns from `hidden` on read as 0). The one arithmetic of combine's
    weighted sum: every path's combine calls it, so their bits agree."""
    offs = tl.arange(0, BLOCK)
    m = c + offs < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(K):
        s = tl.load(slot + r * K + j)
        w = tl.load(weight + r * K + j)
        v = tl.load(y + s * hidden + c + offs, mask=m & (s >= 0), other=0.0)
        acc += tl.where(s >= 0, w, 0.0) * v.to(tl.float32)
    return acc


__all__ = ["FP8_GROUP", "FP8_MAX", "FP8_MIN_AMAX", "pack_rows", "pack_rows_fp8", "quantize_chunk", "weighted_chunk"]
