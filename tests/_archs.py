"""The compute capabilities the compile tests build their kernels for, each against its own
bitcode: sm_80, sm_90 and sm_100, or those $IRONLINK_COMPILE_ARCHS names ("90" or "90,100").
`make test` runs every one with the pinned Triton and fewer with the other Triton releases it
checks (the Makefile's `test-triton-range`, docs/triton-versions.md)."""

from __future__ import annotations

import os

ALL = (80, 90, 100)
CAPABILITIES = tuple(int(cc) for cc in os.environ.get("IRONLINK_COMPILE_ARCHS", "80,90,100").split(","))
if not set(CAPABILITIES) <= set(ALL):
    raise ValueError(f"IRONLINK_COMPILE_ARCHS names {CAPABILITIES}; the bitcode is built for {ALL}")
