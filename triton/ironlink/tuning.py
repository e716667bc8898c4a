"""Launch configs (CTAs, num_warps) of ironlink's host-level collectives.

The measurements live in `tuning_table.py`, generated from a benchmark by `bench/make_tuning.py`;
this module only looks them up.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from ._abi import MAX_CTAS
from .tuning_table import ALGORITHM_LIMITS, TABLES

Tables = Mapping[str, Mapping[int, Sequence[tuple[int, int, int]]]]


def choose(collective: str, nbytes: int, world: int, tables: Tables = TABLES) -> tuple[int, int]:
    """(ctas, num_warps) for a `collective` of `nbytes` bytes over `world` ranks.

    A size between two measured ones takes the next larger one's config (above the largest, the
    largest's); an unmeasured world size takes the nearest measured one's table (larger on a tie).
    The result depends only on the arguments, so every rank launches the same grid."""
    by_world = tables.get(collective)
    if by_world is None:
        raise ValueError(f"no tuning for {collective!r}; known: {', '.join(tables)}")
    w = min(by_world, key=lambda m: (abs(m - world), -m))
    ctas, warps = 1, 4
    for max_bytes, ctas, warps in by_world[w]:
        if nbytes <= max_bytes:
            break
    return max(1, min(MAX_CTAS, ctas)), warps


# Context limits (one_shot_max_bytes, ll_max_bytes, gather_ll_max_bytes) under which each
# algorithm is the one chosen wherever its packets fit: how the benchmark and the GPU suite
# measure and test every algorithm at every size.
_ALWAYS = 1 << 62
FORCED_LIMITS: dict[str, tuple[int, int, int]] = {
    "one_shot_ll": (_ALWAYS, _ALWAYS, 0),
    "two_shot_ll": (0, _ALWAYS, 0),
    "two_shot": (0, 0, 0),
    "gather_ll": (0, 0, _ALWAYS),
    "gather_bulk": (0, 0, 0),
}


def algorithm_limits(
    world: int, limits: Mapping[int, tuple[int, int, int]] = ALGORITHM_LIMITS
) -> Optional[tuple[int, int, int]]:
    """The measured algorithm limits (one_shot_max_bytes, ll_max_bytes, gather_ll_max_bytes) for
    `world` ranks: the nearest measured world size's (larger on a tie); None if nothing was
    measured."""
    if not limits:
        return None
    w = min(limits, key=lambda m: (abs(m - world), -m))
    return limits[w]


__all__ = ["ALGORITHM_LIMITS", "FORCED_LIMITS", "MAX_CTAS", "TABLES", "algorithm_limits", "choose"]
