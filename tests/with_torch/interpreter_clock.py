"""Triton's interpreter has no %globaltimer: `install()` gives the kernels' bounded flag waits
(`ironlink.language._flags`) a clock that advances 1 us per reading, so a wait that never sees its
flag times out after (timeout / 1 us) polls."""

from __future__ import annotations

import types

import triton
import triton.language as tl

from ironlink.language import _flags

_CLOCK = [0]


@triton.jit
def _globaltimer():
    _CLOCK[0] += 1000
    return tl.full((), _CLOCK[0], tl.int64)


def install() -> None:
    _flags.tl_cuda = types.SimpleNamespace(globaltimer=_globaltimer)  # type: ignore[assignment]
