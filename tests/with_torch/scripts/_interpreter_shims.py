"""What Triton's interpreter lacks for ironlink's kernels, given by `install()`:
- no %globaltimer: the kernels' bounded flag waits (`ironlink.language._flags`) get a clock that
  advances 1 us per reading, so a wait that never sees its flag times out after (timeout / 1 us)
  polls;
- an address below 2**31 (a CPU tensor's, on some hosts) reaches a kernel as an int32, and the
  interpreter turns an integer into a pointer by reinterpreting its bytes, which fails for 4 of
  them: the integer is widened to 64 bits first, as the compiled kernel's inttoptr does;
- a scalar is a one-element array there, and numpy >= 2.4 refuses `int()` of one (`range()` over
  a scalar in a kernel): the index is taken from its one element."""

from __future__ import annotations

import types

import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter

from ironlink.language import _flags

_CLOCK = [0]


@triton.jit
def _globaltimer():
    _CLOCK[0] += 1000
    return tl.full((), _CLOCK[0], tl.int64)


def _int_to_ptr(self: interpreter.InterpreterBuilder, src: interpreter.TensorHandle,
                dst_type: object) -> interpreter.TensorHandle:
    return interpreter.TensorHandle(src.data.astype(np.uint64), dst_type.scalar)  # type: ignore[attr-defined]


def _patch_lang_tensor(tensor: type, scope: interpreter._LangPatchScope) -> None:
    _patch_lang_tensor_as_shipped(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


_patch_lang_tensor_as_shipped = interpreter._patch_lang_tensor


def install() -> None:
    _flags.tl_cuda = types.SimpleNamespace(globaltimer=_globaltimer)  # type: ignore[assignment]
    interpreter.InterpreterBuilder.create_int_to_ptr = _int_to_ptr  # type: ignore[method-assign]
    interpreter._patch_lang_tensor = _patch_lang_tensor
