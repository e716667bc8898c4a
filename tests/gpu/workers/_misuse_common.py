"""What the misuse suite's parts share (`tests/gpu/workers/misuse_worker.py` runs them): the
heaps' timeouts in the cases that time out, the check that a call raises, exact inputs."""

from __future__ import annotations

from typing import Any

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the CPU machines have no torch
    torch = None  # type: ignore[assignment]

TIMEOUT_S = 1.0  # the heaps' wait timeout in the cases that time out
SLACK_S = 5.0  # a timed-out call must raise within TIMEOUT_S + SLACK_S
# The wait timeout while a case's first calls compile their kernels: on a cold Triton cache the
# ranks finish compiling seconds apart (8 ranks on 2 H200s: more than TIMEOUT_S), and a rank that
# launches first waits for the others. A case lowers it to TIMEOUT_S once every rank is in step.
COMPILE_TIMEOUT_S = 60.0


def expect_error(call: Any, *words: str) -> Any:
    """Runs `call`, which must raise IronlinkError with every one of `words` in its message."""
    import ironlink

    try:
        call()
    except ironlink.IronlinkError as e:
        for w in words:
            assert w in str(e), f"{w!r} not in the message: {e}"
        return e
    raise AssertionError(f"no IronlinkError (wanted one naming {words})")


def ints(n: int) -> Any:
    """Small integers: every sum is exact in fp32, so results compare bitwise."""
    return torch.randint(-8, 9, (n,), device="cuda").float()


def summed(x: Any) -> Any:
    want = x.clone()
    dist.all_reduce(want)
    return want
