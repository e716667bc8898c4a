"""How many ranks' slots `lamport_reduce_values` polls in one loop (language.slots.poll_group):
every rank's at once where their blocks fit in registers, else the largest group of 4 or 2 that
fits, else peer by peer; and at 2 ranks (one peer) always peer by peer. The kernels' code for each
choice is compiled in tests/compile and run interpreted in tests/with_torch."""

from __future__ import annotations

import pytest

from ironlink.language.slots import POLL_TOGETHER_MAX_ELEMENTS, poll_group

MAX = POLL_TOGETHER_MAX_ELEMENTS.value


@pytest.mark.parametrize("world, block, group", [
    (2, 1024, 0), (2, MAX, 0),  # one peer: nothing to poll together
    (4, MAX // 4, 4), (4, MAX // 2, 2), (4, MAX, 0),
    (8, MAX // 8, 8), (8, MAX // 4, 4), (8, MAX // 2, 2), (8, MAX, 0),
    (6, 1024, 0),  # not a power of two: peer by peer
])
def test_the_largest_group_whose_blocks_fit(world: int, block: int, group: int) -> None:
    assert poll_group(world, block) == group
    if group:
        assert world % group == 0 and group * block <= MAX
