"""The collective steps over a heap's process group: gathering a value from every rank, agreeing
on a step's outcome (so that a failure on one rank raises on every rank instead of leaving the
others waiting), barriers, and whether the group is still alive.

torch.distributed is imported in each step, so this module imports without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .errors import IronlinkError


def same_requests(requests: Sequence[tuple[int, int]]) -> Optional[str]:
    """None if every rank asked for the same (nbytes, scratch_bytes), else a message naming them."""
    groups: dict[tuple[int, int], list[int]] = {}
    for rank, req in enumerate(requests):
        groups.setdefault((req[0], req[1]), []).append(rank)
    if len(groups) <= 1:
        return None
    parts = []
    for (nbytes, scratch), ranks in groups.items():
        who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        parts.append(f"{who}: nbytes={nbytes}, scratch_bytes={scratch}")
    return "ranks asked for different symmetric heap sizes (all must pass the same): " + "; ".join(parts)


def group_alive(dist: Any, group: Any) -> bool:
    """Whether `group` (a ProcessGroup object) is still a live group of torch.distributed: false
    once `destroy_process_group` destroyed it (or the whole default group), also after a new
    `init_process_group` (that makes a new group object)."""
    if not dist.is_initialized():
        return False
    # torch keeps its live groups in _world.pg_map; where a torch version lacks it, only whether
    # torch.distributed is initialized can be checked.
    pg_map = getattr(getattr(getattr(dist, "distributed_c10d", None), "_world", None), "pg_map", None)
    return pg_map is None or group in pg_map


def gather_failures(gathered: Sequence[tuple[str, Any]]) -> Optional[str]:
    """A message naming the ranks that reported ("error", message), grouped by message, or None."""
    by_msg: dict[str, list[int]] = {}
    for r, (kind, m) in enumerate(gathered):
        if kind == "error":
            by_msg.setdefault(str(m), []).append(r)
    if not by_msg:
        return None
    parts = []
    for m, ranks in by_msg.items():
        if len(ranks) == len(gathered) > 1:
            who = "all ranks"
        else:
            who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        parts.append(f"{who}: {m}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Rendezvous:
    """A heap's process group and this rank's place in it."""

    group: Any  # as the user passed it (None: the default group)
    # The group object itself (not None for the default group), so that a heap outliving its
    # group is recognised even after init_process_group made a new default group.
    pg: Any
    rank: int
    world: int
    nccl: bool  # NCCL barriers name the device

    @staticmethod
    def over(group: Any) -> "Rendezvous":
        """The rendezvous over `group` (None: the default group) of an initialized torch.distributed."""
        import torch.distributed as dist

        pg = group if group is not None else dist.group.WORLD
        nccl = "nccl" in str(dist.get_backend(group)).lower()
        return Rendezvous(group, pg, dist.get_rank(group), dist.get_world_size(group), nccl)

    def all_gather(self, obj: Any) -> list[Any]:
        """`obj` (picklable) from every rank, in rank order."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def agree(self, step: Callable[[], Any], what: str) -> Any:
        """Runs `step()` on every rank and returns its result here; if it raised on any rank,
        raises IronlinkError on every rank (naming the ranks), so none waits in a later step."""
        result = None
        try:
            result = step()
            mine: tuple[str, Any] = ("ok", None)
        except Exception as e:
            mine = ("error", str(e))
        failed = gather_failures(self.all_gather(mine))
        if failed:
            raise IronlinkError(f"{what} failed on {failed}")
        return result

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.nccl:
            import torch

            dist.barrier(group=self.group, device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier(group=self.group)

    def alive(self) -> bool:
        """Whether the group is still a live group of torch.distributed (see `group_alive`)."""
        import torch.distributed as dist

        return group_alive(dist, self.pg)


__all__ = ["Rendezvous", "gather_failures", "group_alive", "same_requests"]
