"""The slot kernels' launch counters and halves in Triton's interpreter (TRITON_INTERPRET=1, set by
tests/with_torch/test_interpreted.py): `advance_epochs` sets every one of the MAX_CTAS counters, whatever the
grid; `launch_slots` gives alternate halves of the workspace in alternate launches, each half
`slot_half` of it whatever the launch's shape, so a launch of any shape leaves the previous
launch's slots (which a slower peer may still read) untouched. With halves placed by the shape
((world - 1) x M x N, before 2026-11-29) the second launch below wrote over the first's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ironlink.language.slots import advance_epochs, launch_slots
from ironlink.language import _abi
from ironlink.runtime.workspaces import slot_half

import _interpreter_shims  # tests/with_torch/scripts/, beside this file

_interpreter_shims.install()
BLOCK = 64


@triton.jit
def one_launch(ws, epochs, parities, half, n, BLOCK: tl.constexpr):
    """Fills this launch's layout (`n` elements from the start of its half) with 100 + its count."""
    epoch, parity, slots = launch_slots(ws, epochs, half)
    pid, grid = tl.program_id(0), tl.num_programs(0)
    tl.store(parities + pid, parity)
    for start in range(pid * BLOCK, n, grid * BLOCK):
        at = start + tl.arange(0, BLOCK)
        tl.store(slots + at, 100 + epoch + at * 0, mask=at < n)
    advance_epochs(epochs, epoch + 1)


def launches(shapes: list[tuple[int, int]], world: int, by_shape: bool) -> str:
    """Runs one launch a shape (grids 1, 3, 32, 7, 1) with the halves `slot_half` of the workspace
    apart, or (`by_shape`) (world - 1) x M x N apart as before: "" if every launch kept to its half
    and left the previous launch's slots as they were, else what went wrong."""
    largest = max((world - 1) * m * n for m, n in shapes)
    ws = torch.zeros(2 * largest, dtype=torch.int32)
    epochs = torch.zeros(_abi.MAX_CTAS, dtype=torch.int32)
    before = None  # the previous launch's slots: (range, mark)
    for launch, ((m, n), grid) in enumerate(zip(shapes, (1, 3, 32, 7, 1))):
        parities = torch.full((grid,), -1, dtype=torch.int32)
        size = (world - 1) * m * n
        half = size if by_shape else slot_half(ws)
        one_launch[(grid,)](ws, epochs, parities, half, size, BLOCK=BLOCK)
        assert torch.equal(parities, torch.full((grid,), launch % 2, dtype=torch.int32)), (launch, grid, parities)
        start = (launch % 2) * half
        assert torch.equal(ws[start:start + size], torch.full((size,), 100 + launch, dtype=torch.int32)), launch
        if before is not None:
            (lo, hi), mark = before
            if not torch.equal(ws[lo:hi], torch.full((hi - lo,), mark, dtype=torch.int32)):
                return f"launch {launch} ({m} x {n}) wrote into launch {launch - 1}'s slots"
        before = ((start, start + size), 100 + launch)
        assert torch.equal(epochs, torch.full((_abi.MAX_CTAS,), launch + 1, dtype=torch.int32)), (launch, grid, epochs)
    return ""


def main() -> None:
    shapes = [(16, 16), (2, 8), (4, 8), (16, 8), (1, 8)]  # (M, N) of each launch: its slots (world - 1) x M x N
    wrong = launches(shapes, 3, by_shape=False)
    assert not wrong, wrong
    # The check finds what halves placed by the shape did: the small second launch's half began
    # inside the large first launch's slots.
    assert launches(shapes, 3, by_shape=True) == "launch 1 (2 x 8) wrote into launch 0's slots"
    print("ok: every launch counter advanced at grids 1, 3, 32, 7, 1; halves alternate and stay apart "
          "whatever the shapes")


if __name__ == "__main__":
    main()
