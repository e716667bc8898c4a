"""A kernel defined in a script run as __main__, as tests/gpu/workers/collectives_worker.py's are
(test_compile_ahead runs it, with no GPU): `record ARCH PATH` writes the record of its compile,
`launch ARCH` compiles it as a launch would (from Triton's cache if it holds it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl
from triton.runtime import driver
from triton.runtime.jit import MockTensor

from ironlink.runtime import compile_ahead


@triton.jit
def script_kernel(x, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x + i, tl.load(x + i, mask=i < n) * 2, mask=i < n)


def launch() -> Any:
    return script_kernel.warmup(MockTensor(tl.float32), 5, BLOCK=32, grid=(1,))


if __name__ == "__main__":
    driver.set_active(compile_ahead._TargetOnly(int(sys.argv[2])))
    if sys.argv[1] == "record":
        recorder = compile_ahead.Recorder()
        recorder.start()
        launch()
        recorder.stop()
        compile_ahead.write(Path(sys.argv[3]), list(recorder.entries.values()))
    else:
        launch()
