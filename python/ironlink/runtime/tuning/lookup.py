"""The lookups every tuning table shares: an entry by size in an ascending table, and the
measured world a world without its own measurements takes."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, TypeVar

T = TypeVar("T", bound=tuple)


def covering(entries: Sequence[T], size: int) -> Optional[T]:
    """The first entry (its first field a size limit, ascending) whose limit is at least `size`;
    None past the last (a table whose caller has its own rule there)."""
    return next((e for e in entries if size <= e[0]), None)


def by_size(entries: Sequence[T], size: int) -> T:
    """`covering`, and past the last entry the last."""
    return covering(entries, size) or entries[-1]


def nearest_world(measured: Iterable[int], world: int) -> int:
    """The measured world size that a `world` without measurements of its own takes: itself if
    measured, else the nearest smaller one (its one-shot limits only shrink as peers are added,
    `decode_table.derive`), else the nearest larger one. ValueError if none is measured."""
    worlds = sorted(set(measured), key=lambda m: (m > world, abs(m - world)))
    if not worlds:
        raise ValueError(f"no measured world size to take for world {world}")
    return worlds[0]


__all__ = ["by_size", "covering", "nearest_world"]
