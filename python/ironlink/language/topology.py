"""Which contexts span several nodes, and how a kernel compiled for one says so.

ironlink has one name per collective (``ilt.all_reduce``, ``il.symm_all_reduce``, ...). On a
context of one node it is the node-local algorithm; on a context of several nodes the
hierarchical one (node-local steps over NVLink, NVSHMEM puts between nodes), a different device
symbol (``symm_all_reduce_hierarchical``). The choice is made here, once per compiled kernel:

- the host runtime marks each context of several nodes (`mark_several_nodes`, when a heap of
  several nodes opens; `forget` when it closes);
- `@ironlink.jit` looks at the launch's ``ctx`` argument: on a marked context it links ironlink's
  NVSHMEM bitcode (and NVSHMEM's) under the key `SEVERAL_NODES_LIB_NAME` instead of `LIB_NAME`;
- while Triton traces the kernel, the language wrappers read that key from the compile options
  (`several_nodes`) and call the hierarchical symbol.

Triton keys its caches on the extern libraries, so a kernel launched on both kinds of context
compiles once for each, and a kernel that only ever runs on one node never links NVSHMEM.
"""

from __future__ import annotations

from typing import Any, Optional

# The extern_libs keys of ironlink's bitcode: Triton links by path and ignores keys, so the key
# can carry the one bit the language wrappers need at trace time.
LIB_NAME = "ironlink"
SEVERAL_NODES_LIB_NAME = "ironlink_several_nodes"

# Device addresses of the live contexts that span several nodes (set by the host runtime).
_SEVERAL_NODE_CONTEXTS: set[int] = set()


def mark_several_nodes(ctx: int) -> None:
    """Records that the context at device address `ctx` spans several nodes."""
    _SEVERAL_NODE_CONTEXTS.add(int(ctx))


def forget(ctx: int) -> None:
    """Forgets the context at `ctx` (its heap closed: the address may be reused)."""
    _SEVERAL_NODE_CONTEXTS.discard(int(ctx))


def spans_several_nodes(ctx: Any) -> bool:
    """Whether a launch argument `ctx` is a context marked as spanning several nodes."""
    return isinstance(ctx, int) and ctx in _SEVERAL_NODE_CONTEXTS


def linked_libs(_semantic: Any) -> Optional[dict[str, str]]:
    """The extern libraries of the kernel being traced; None where the front end does not say
    how it links (e.g. the interpreter)."""
    options = getattr(getattr(_semantic, "builder", None), "options", None)
    if options is None:
        return None
    return dict(getattr(options, "extern_libs", None) or ())


def several_nodes(_semantic: Any) -> bool:
    """Whether the kernel being traced was compiled for a context of several nodes."""
    return SEVERAL_NODES_LIB_NAME in (linked_libs(_semantic) or {})


def ironlink_path(libs: dict[str, str]) -> str:
    """The path ironlink's bitcode is linked from in `libs`, under either key ("" if neither)."""
    return libs.get(LIB_NAME) or libs.get(SEVERAL_NODES_LIB_NAME) or ""


__all__ = ["LIB_NAME", "SEVERAL_NODES_LIB_NAME", "forget", "ironlink_path", "linked_libs", "mark_several_nodes",
           "several_nodes", "spans_several_nodes"]
