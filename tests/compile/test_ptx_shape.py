"""The hardware layer costs nothing: in a kernel calling symm_all_reduce, every hw:: operation is
the single PTX instruction it stands for, inline (no calls), and the barrier carries no full fence.

This is what reading the PTX showed when the layer was written; the test keeps it true.
"""

from __future__ import annotations

import re

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import ironlink.language as il
from _compile import bitcode


@triton.jit
def _all_reduce(ctx, buf, n, op, dt, status):
    tl.store(status + tl.program_id(0), il.symm_all_reduce(ctx, buf, 0, n, op, dt))


def test_all_reduce_ptx_uses_the_intended_instructions() -> None:
    sig = {"ctx": "i64", "buf": "*bf16", "n": "i64", "op": "i32", "dt": "i32", "status": "*i32"}
    k = triton.compile(ASTSource(_all_reduce, sig, {}), target=GPUTarget("cuda", 90, 32),
                       options={"extern_libs": (("ironlink", bitcode(90)),)})
    ptx = k.asm["ptx"]
    expected = {
        "LL packet store (16 B, one transaction)": r"st\.volatile\.global\.v4\.u32",
        "LL packet poll": r"ld\.volatile\.global\.v4\.u32",
        "bulk 16-byte load": r"ld\.global\.v4\.u32",
        "bulk 16-byte store": r"st\.global\.v4\.u32",
        "barrier arrival (release, system scope)": r"st\.release\.sys\.b32",
        "barrier wait (acquire, system scope)": r"ld\.acquire\.sys\.b32",
        "CTA-wide timeout vote": r"bar\.red\.or\.pred",
        "timeout clock": r"%globaltimer",
    }
    missing = [what for what, pat in expected.items() if not re.search(pat, ptx)]
    assert not missing, f"instructions missing from the PTX: {missing}"
    assert not re.search(r"\bcall(\.uni)?\b", ptx), "a call is left in the kernel"
    assert "fence.sc.sys" not in ptx, "the all-reduce path carries a full system fence"
