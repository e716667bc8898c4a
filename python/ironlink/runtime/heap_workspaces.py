"""`SymmetricHeap`'s kept workspaces: the heap tensors that ops keep between calls under their
names (`workspaces.kept_workspace`), taken from the stack at the user region's end, so they sit at
the same offsets on every rank whatever tensors the ranks allocated."""

from __future__ import annotations

from typing import Any, Callable, Optional

from .errors import IronlinkError
from .native import load_torch
from .workspaces import kept_workspace


class HeapWorkspaces:
    """Mixed into `SymmetricHeap`, which sets `_workspaces` and defines `_open` and `_tensor_at`."""

    _workspaces: dict[str, list[Any]]  # fused ops' scratch tensors, by op name

    def _open(self, what: str = "") -> Any:
        raise NotImplementedError

    def _tensor_at(self, offset: int, nbytes: int, dims: tuple[int, ...], dtype: Any) -> Any:
        raise NotImplementedError

    def workspace(self, name: str, nbytes: int, zeroed_prefix: int = 0,
                  init: Optional[Callable[[Any], None]] = None) -> Any:
        """A uint8 heap tensor of at least `nbytes` that op `name` keeps between calls (collective),
        as `workspaces.kept_workspace` says: from the stack at the user region's end, at offsets
        that follow from the workspace calls alone, the same on every rank whatever tensors the
        ranks allocated (peers store into them at this rank's offsets)."""
        torch = load_torch()
        return kept_workspace(self._workspaces, name, nbytes, self._new_workspace,
                              torch.cuda.is_current_stream_capturing, zeroed_prefix, init)

    def _new_workspace(self, name: str, size: int) -> Any:
        """A new workspace of op `name`, `size` bytes, from the stack at the region's end."""
        native = self._open()
        try:
            offset = native.alloc_top(size)
        except IronlinkError as e:
            raise IronlinkError(f"ironlink.{name} needs a workspace of {size} bytes: {e}") from e
        return self._tensor_at(offset, size, (size,), load_torch().uint8)

    def has_workspace(self, name: str, nbytes: int) -> bool:
        """Whether the workspace `name` of at least `nbytes` exists (`workspace` would not make one)."""
        kept = self._workspaces.get(name, [])
        return bool(kept) and kept[-1].numel() >= nbytes


__all__ = ["HeapWorkspaces"]
