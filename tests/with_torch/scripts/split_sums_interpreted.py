"""all_reduce_rmsnorm mode split's slice sums in Triton's interpreter (TRITON_INTERPRET=1, set by
tests/with_torch/test_interpreted.py): a slice's words carry the launch's flag and its f32 bits, the row's sum
is taken once every slice of the row carries the flag, and a slice whose word
keeps an older flag gives TIMEOUT after the context's timeout, recorded in the context, instead
of a sum of stale values.
The interpreter runs one CTA at a time, so the other slices' words are written beforehand, as
they would have been by CTAs already past their publication."""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from ironlink.fused.all_reduce_rmsnorm_exchanges import SPLIT_WORDS, share_slice_sums
from ironlink.language import _abi

import _interpreter_shims  # tests/with_torch/scripts/, beside this file

_interpreter_shims.install()


@triton.jit
def one_slice(ctx, words, out, flag, mine, PARTS: tl.constexpr, FP8: tl.constexpr):
    total, top, s = share_slice_sums(ctx, words, tl.load(flag), tl.load(mine), tl.load(mine + 1), PARTS, FP8)
    tl.store(out, total)
    tl.store(out + 1, top)
    tl.store(out + 2, s.to(tl.float32))


def tagged(flag: int, v: float) -> int:
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    return struct.unpack("<q", struct.pack("<Q", (flag << 32) | bits))[0]


def run(parts: int, fp8: bool, stale: bool, timeout_ns: int) -> list[float]:
    ctx = torch.zeros(_abi.CONTEXT_SIZE // 8, dtype=torch.int64)
    ctx[_abi.CONTEXT_FIELDS["timeout_ns"][0] // 8] = timeout_ns
    words = torch.zeros(SPLIT_WORDS.value, dtype=torch.int64)
    half = SPLIT_WORDS.value // 2
    flag = 7
    for g in range(1, parts):  # the row's other slices, already published
        words[g] = tagged(flag - 1 if stale and g == parts - 1 else flag, float(g))
        words[half + g] = tagged(flag, 10.0 * g)
    out = torch.zeros(3, dtype=torch.float32)
    one_slice[(1,)](ctx.data_ptr(), words, out, torch.tensor([flag], dtype=torch.int32),
                    torch.tensor([0.5, 3.0], dtype=torch.float32), PARTS=parts, FP8=fp8)
    assert words[0] == tagged(flag, 0.5), "this slice's sum, tagged"
    if fp8:
        assert words[half] == tagged(flag, 3.0), "this slice's peak, tagged"
    error, detail = ctx.view(torch.int32)[[_abi.CONTEXT_FIELDS[f][0] // 4 for f in ("error", "error_detail")]].tolist()
    if stale:
        assert (error, list(_abi.FUNCTIONS)[detail]) == (_abi.STATUS["TIMEOUT"], "symm_tile_all_reduce"), (error, detail)
    else:
        assert error == 0, error
    return out.tolist()


def main() -> None:
    for parts in (2, 8):
        total, top, s = run(parts, fp8=False, stale=False, timeout_ns=10**9)
        assert s == 0 and total == 0.5 + sum(range(1, parts)), (parts, total, s)
        total, top, s = run(parts, fp8=True, stale=False, timeout_ns=10**9)
        assert s == 0 and top == max(3.0, 10.0 * (parts - 1)), (parts, top, s)
        total, top, s = run(parts, fp8=False, stale=True, timeout_ns=1000)
        assert s == _abi.STATUS["TIMEOUT"], (parts, s)
    print("ok: slice sums once every flag is this launch's; a stale one times out")


if __name__ == "__main__":
    main()
