"""The push kernels' launch counters in Triton's interpreter (TRITON_INTERPRET=1, set by
tests/with_torch/test_interpreted.py): `advance_epochs` sets every one of the MAX_CTAS counters, whatever the
grid, and `launch_slots` gives alternate halves of the workspace in alternate launches."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ironlink.language.slots import advance_epochs, launch_slots
from ironlink.language import _abi


@triton.jit
def one_launch(ws, epochs, parities, M, N, WORLD: tl.constexpr):
    epoch, parity, slots = launch_slots(ws, epochs, M, N, WORLD)
    tl.store(parities + tl.program_id(0), parity)
    tl.store(slots + tl.program_id(0), 100 + epoch)  # marks this launch's half
    advance_epochs(epochs, epoch + 1)


def main() -> None:
    m, n, world = 4, 8, 3
    ws = torch.zeros(2 * (world - 1) * m * n, dtype=torch.int32)
    epochs = torch.zeros(_abi.MAX_CTAS, dtype=torch.int32)
    half = (world - 1) * m * n
    for launch, grid in enumerate((1, 3, 32, 7, 1)):
        parities = torch.full((grid,), -1, dtype=torch.int32)
        one_launch[(grid,)](ws, epochs, parities, m, n, WORLD=world)
        assert torch.equal(parities, torch.full((grid,), launch % 2, dtype=torch.int32)), (launch, grid, parities)
        start = (launch % 2) * half
        assert torch.equal(ws[start:start + grid], torch.full((grid,), 100 + launch, dtype=torch.int32)), launch
        assert torch.equal(epochs, torch.full((_abi.MAX_CTAS,), launch + 1, dtype=torch.int32)), (launch, grid, epochs)
    print("ok: every launch counter advanced at grids 1, 3, 32, 7, 1; halves alternate")


if __name__ == "__main__":
    main()
