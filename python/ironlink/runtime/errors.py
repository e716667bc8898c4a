"""ironlink's exception type, and turning device-side status codes into messages.

`IronlinkError` lives in pure Python so that code can import and catch it without the compiled
extension; the extension (`ironlink._native`) raises it with the host library's message.
"""

from __future__ import annotations

from ..language import _abi


class IronlinkError(RuntimeError):
    """An ironlink operation failed. The message names the problem (ranks, GPUs, sizes).

    Errors recorded by device functions carry ``status`` (the negative code from
    ``ironlink.language._abi.STATUS``) and ``function`` (the device function that recorded it); both are
    None for host-side errors.
    """

    def __init__(self, message: str, status: int | None = None, function: str | None = None):
        super().__init__(message)
        self.status = status
        self.function = function


# What a recorded status means, after "device function F on rank R recorded NAME (code)".
HINTS = {
    "TIMEOUT": (": a peer did not arrive within the context's timeout (a rank skipped the call, "
                "launched it with another grid or other sizes, or is stuck; with check=True the host-level "
                "ops compare every rank's call before launching)"),
    "HEAP_ASYMMETRIC": (": the ranks' symmetric heaps differ (a rank allocated or freed a tensor that "
                        "the others did not, or one of another size, or in another order), so one "
                        "offset names different tensors on different ranks; nothing was moved. Every "
                        "rank must make the same heap.empty/free calls in the same order"),
    "GRID_MISMATCH": (": ranks launched this call with grids of different sizes; nothing was moved. A "
                      "kernel that calls whole-tensor collectives must have the same grid on every rank"),
}


def status_name(code: int) -> str:
    """``-7`` -> ``"TIMEOUT"``; unknown codes are shown as numbers."""
    for name, value in _abi.STATUS.items():
        if value == code:
            return name
    return f"status {code}"


# The `error_detail` the host records beside a failure it found itself, not a device function:
# check=True's comparison of the ranks' calls, when a rank never made the call (`call_check`). The
# device's details are export-table indices, never negative.
CALL_COMPARISON_DETAIL = -1
CALL_COMPARISON = "the comparison of the ranks' calls (check=True)"


def function_name(index: int) -> str:
    """The device function with this index in the export table (what `error_detail` holds)."""
    if index == CALL_COMPARISON_DETAIL:
        return CALL_COMPARISON
    names = list(_abi.FUNCTIONS)
    return names[index] if 0 <= index < len(names) else f"device function #{index}"


def device_error(code: int, detail: int, rank: int | None = None) -> IronlinkError:
    """The exception for a status recorded in the context (by a device function, or by the host's
    comparison of the calls)."""
    where = "" if rank is None else f" on rank {rank}"
    fn = function_name(detail)
    who = fn if detail == CALL_COMPARISON_DETAIL else f"device function {fn}"
    hint = HINTS.get(status_name(code), "")
    return IronlinkError(
        f"{who}{where} recorded {status_name(code)} ({code}){hint}",
        status=code,
        function=fn,
    )
