"""From the tuner's timings to a decode table, and its summary: pure functions, no GPU."""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

from ..runtime.tuning.decode_table import ALL_REDUCE_PATHS, MATMUL_METHODS, NO_LIMIT, DecodeTable, Entries

# bytes -> candidate -> microseconds (the max over ranks of each rank's median).
Timings = Mapping[int, Mapping[str, float]]


def ranked(times: Mapping[str, float], order: Sequence[str]) -> list[str]:
    """The candidates of `times`, fastest first; equal times in `order` (then by name). Every rank
    holds the same numbers (the max over ranks), so every rank ranks them the same way."""
    def key(name: str) -> tuple[float, int, str]:
        return times[name], order.index(name) if name in order else len(order), name

    return sorted(times, key=key)


def choose_entries(timings: Timings, order: Sequence[str]) -> Entries:
    """Table entries from `timings`: at each measured size the fastest candidate (`ranked`),
    neighbours with the same one merged; an entry's max_bytes is the largest size it won (past
    the last, the table's rule for the op applies)."""
    entries: list[tuple[int, str]] = []
    for nbytes in sorted(timings):
        if not timings[nbytes]:
            continue
        best = ranked(timings[nbytes], order)[0]
        if entries and entries[-1][1] == best:
            entries[-1] = (nbytes, best)
        else:
            entries.append((nbytes, best))
    return tuple(entries)


def choose_table(all_reduce: Timings, rmsnorm: Timings, modes: Sequence[str],
                 unbounded: Sequence[str] = (), matmul: Optional[Timings] = None) -> DecodeTable:
    """The decode table from the all_reduce paths' timings, all_reduce_rmsnorm's (`modes`: the
    op's MODES, the order of preference on a tie) and matmul_all_reduce's methods' (past the
    largest size measured, the op's rule). Where the largest size measured chose a mode outside
    `unbounded` (one that keeps a heap workspace sized by x: 2 to 6 times x), the sizes past it
    take the fastest of `unbounded` there instead of growing that workspace without a
    measurement."""
    entries = choose_entries(rmsnorm, modes) or DecodeTable().all_reduce_rmsnorm
    if rmsnorm and unbounded and entries[-1][1] not in unbounded:
        largest = rmsnorm[max(rmsnorm)]
        tail = [m for m in ranked(largest, modes) if m in unbounded]
        if tail:
            entries = (*entries, (NO_LIMIT, tail[0]))
    return DecodeTable(choose_entries(all_reduce, ALL_REDUCE_PATHS), entries,
                       choose_entries(matmul or {}, MATMUL_METHODS))


def size_text(nbytes: int) -> str:
    """`nbytes` in KiB or MiB where whole, else bytes."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def summary(op: str, timings: Timings, order: Sequence[str], label: Callable[[int], str] = size_text) -> list[str]:
    """Lines of a table: per size (`label`) the fastest candidate and its us, the runner-up and its."""
    rows = [("size", "choice", "us", "runner-up", "us")]
    for nbytes in sorted(timings):
        r = ranked(timings[nbytes], order)
        if not r:
            continue
        second = (r[1], f"{timings[nbytes][r[1]]:.2f}") if len(r) > 1 else ("-", "-")
        rows.append((label(nbytes), r[0], f"{timings[nbytes][r[0]]:.2f}", *second))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return [op] + ["  " + "  ".join(cell.rjust(w) if i in (2, 4) else cell.ljust(w)
                                    for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


__all__ = ["Timings", "choose_entries", "choose_table", "ranked", "size_text", "summary"]
