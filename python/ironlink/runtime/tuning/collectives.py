"""Launch choices of the host-level collectives (`ironlink.ops`): the grid and warps of each
collective by size and world (the table `runtime/tuning_table.py`, generated from a benchmark by
`bench/report/make_tuning.py`), the device's algorithm limits, all_to_all_v's grid, the lamport
path of the small all_reduce and PDL for the decode kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ...language._abi import MAX_CTAS
from . import decode_table
from ..tuning_table import ALGORITHM_LIMITS, TABLES
from .lookup import by_size, nearest_world

Tables = Mapping[str, Mapping[int, Sequence[tuple[int, int, int]]]]


def choose(collective: str, nbytes: int, world: int, tables: Tables = TABLES) -> tuple[int, int]:
    """(ctas, num_warps) for a `collective` of `nbytes` bytes over `world` ranks.

    A size between two measured ones takes the next larger one's config (above the largest, the
    largest's); an unmeasured world size takes `lookup.nearest_world`'s table.
    The result depends only on the arguments, so every rank launches the same grid."""
    by_world = tables.get(collective)
    if by_world is None:
        raise ValueError(f"no tuning for {collective!r}; known: {', '.join(tables)}")
    _, ctas, warps = by_size(by_world[nearest_world(by_world, world)], nbytes)
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
    `world` ranks: `lookup.nearest_world`'s; None if nothing was measured."""
    if not limits:
        return None
    return limits[nearest_world(limits, world)]


# all_to_all_v's grid, by a bound on the bytes it moves that is the same on every rank (its ranks
# send different amounts, and CTAs are matched by index, so the grid cannot follow the counts):
# (max_bytes, ctas), ascending; above the last, the last. ironlink.all_to_all_v called without
# `ctas` takes the first (small exchanges); MoeExchange passes its buffers' size.
ALL_TO_ALL_V_CTAS: tuple[tuple[int, int], ...] = ((1 << 20, 32), (1 << 62, 132))


def all_to_all_v_launch(max_bytes: int = 0) -> tuple[int, int]:
    """(ctas, num_warps) of an all_to_all_v moving at most `max_bytes` per rank."""
    _, ctas = by_size(ALL_TO_ALL_V_CTAS, max_bytes)
    return min(ctas, MAX_CTAS), 16


# Programmatic dependent launch (ironlink.runtime.pdl, ironlink.language.pdl) for the latency-bound kernels: all_reduce_rmsnorm
# and the all_reduce op. The default of their `pdl=None`; it takes effect only on compute
# capability 9.0 and later (griddepcontrol). The all_reduce op in a graph of 20 back to back on 2
# H200s (git 93d22eb, bench/results/experiments/allreduce-public-op-2xH200-93d22eb.json), us with /
# without: 5.03 / 4.94 at 1 KiB, 4.51 / 4.64 at 4 KiB, 6.95 / 7.40 at 16 KiB, 5.64 / 5.85 at 64 KiB;
# all_reduce_rmsnorm: bench/fused.py's [rows] and [rows,pdl] rows (docs/fused.md).
DECODE_PDL = True


# ironlink.all_reduce through lamport slots (language/slots.py: each CTA's elements stored into every
# peer, read as they land, no signal, barrier or fence), where the decode table takes it on one
# node, runs a CTA per ALL_REDUCE_LAMPORT_CTA_BYTES of ALL_REDUCE_LAMPORT_WARPS warps (one 16-byte
# unit a thread). Why world 2 takes it up to 256 KiB: 2 H100s, bf16, graph us, lamport / the
# device library's one-shot LL (the op's default before), in turns (git 55e318e, its loads still
# 2 bytes wide, bench/results/experiments/allreduce-lamport-2xH100-55e318e.json): 1 KiB 4.09 /
# 4.80, 4 KiB 4.21 / 4.51, 16 KiB 4.51 / 4.67, 64 KiB 4.56 / 5.03, 256 KiB 5.80 / 6.33. With
# 16-byte units (git 0ed3781, allreduce-lamport-on-2xH100-0ed3781.json): 4.09 / 4.99, 3.99 / 4.84,
# 4.66 / 5.43, 4.09 / 5.07, 4.59 / 6.17 (NCCL 9.7-11.4).
ALL_REDUCE_LAMPORT_CTA_BYTES = 2 << 10
ALL_REDUCE_LAMPORT_WARPS = 4


@dataclass(frozen=True)
class AllReduceConfig:
    """ironlink.all_reduce's choices beyond its decode table (`all_reduce(config=)`): the grid of
    its lamport path, bytes a CTA and warps (bench/allreduce.py --lamport-grids times others)."""

    lamport_cta_bytes: int = ALL_REDUCE_LAMPORT_CTA_BYTES
    lamport_warps: int = ALL_REDUCE_LAMPORT_WARPS


def all_reduce_takes_lamport(nbytes: int, world: int) -> bool:
    """Whether ironlink.all_reduce of `nbytes` over `world` ranks of one node runs through lamport
    slots (the decode table's all_reduce path, `decode_table.table_for`)."""
    return nbytes > 0 and decode_table.table_for(world).all_reduce_path(nbytes) == "lamport"


__all__ = ["ALGORITHM_LIMITS", "ALL_REDUCE_LAMPORT_CTA_BYTES", "AllReduceConfig", "ALL_REDUCE_LAMPORT_WARPS", "ALL_TO_ALL_V_CTAS", "DECODE_PDL",
           "FORCED_LIMITS", "TABLES", "algorithm_limits", "all_reduce_takes_lamport", "all_to_all_v_launch", "choose"]
