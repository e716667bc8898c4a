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

# The Triton releases beside the pinned one (the Makefile's test-triton-range sets
# IRONLINK_COMPILE_SAMPLED=1) run a sample of the case families that only repeat one check over
# many kernels: what differs between releases there (the linking of the NVSHMEM bitcode, inlining)
# is the same for every kernel; the pinned Triton runs every case.
SAMPLED = os.environ.get("IRONLINK_COMPILE_SAMPLED", "") == "1"


def sampled(cases: list[str], sample: list[str]) -> list[str]:
    """`cases`, or only those of `sample` where the run samples (`SAMPLED`)."""
    missing = set(sample) - set(cases)
    if missing:
        raise ValueError(f"the sample names cases that do not exist: {sorted(missing)}")
    return [c for c in cases if c in sample] if SAMPLED else list(cases)

