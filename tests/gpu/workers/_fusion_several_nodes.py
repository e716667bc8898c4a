"""The fusion suite's cases of the fused ops' kernels for heaps of several nodes (grid barriers
around a hierarchical collective), relinked with the P2P bitcode and run on a one-node heap as if
it spanned several (`as_several_nodes`): their own logic checked on any GPUs, without NVSHMEM
(tests/gpu/workers/nvshmem_worker.py runs them across simulated nodes)."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, Iterator

import torch

import ironlink
from ironlink.fused.all_reduce_rmsnorm import MODES, ONE_NODE_MODES

from _cases import Cases, small  # tests/gpu/workers/, the script's own directory
from _fusion_ops import Suite


class SeveralNodesView:
    """Suite `s`'s one-node heap (the one it holds now: `Suite.renew_heap` may replace it) saying
    it spans several nodes: the fused ops take their hierarchical kernels on it. Everything else
    is the heap's own."""

    multi_node = True

    def __init__(self, s: Suite) -> None:
        self._suite = s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._suite.heap, name)


# Each host module's own binding of its kernel: what its launch calls. The modules by their paths:
# ironlink.fused's attributes named after the ops are the ops.
HIERARCHICAL_KERNELS = tuple((importlib.import_module(f"ironlink.fused.{module}"), kernel) for module, kernel in (
    ("all_reduce_rmsnorm", "allreduce_rmsnorm_hierarchical_kernel"),
    ("matmul_all_reduce", "matmul_allreduce_hierarchical_kernel"),
    ("all_gather_matmul", "allgather_matmul_hierarchical_kernel"),
    ("matmul_reduce_scatter", "matmul_reducescatter_hierarchical_kernel")))


@contextlib.contextmanager
def as_several_nodes(s: Suite) -> Iterator[Suite]:
    """A Suite over `SeveralNodesView(s.heap)`, with the fused ops' hierarchical kernels linked
    with the P2P bitcode instead of the NVSHMEM one: on one node their hierarchical collectives
    are the node-local part alone, which the P2P bitcode serves (no NVSHMEM needed)."""
    saved = [(module, name, getattr(module, name)) for module, name in HIERARCHICAL_KERNELS]
    for module, name, kernel in saved:
        setattr(module, name, ironlink.jit(kernel.fn, several_nodes=True))  # P2P bitcode, hierarchical calls
    view = Suite(s.heap)
    view.heap = SeveralNodesView(s)  # type: ignore[assignment]
    try:
        yield view
    finally:
        for module, name, kernel in saved:
            setattr(module, name, kernel)


def refused(call: Callable[[], object], words: str) -> None:
    """`call` must raise ValueError naming `words`."""
    try:
        call()
    except ValueError as e:
        assert words in str(e), f"{words!r} not in the message: {e}"
        return
    raise AssertionError(f"no ValueError (wanted one naming {words!r})")


def hierarchical_cases(cases: Cases, s: Suite, world: int) -> None:
    """The fused ops by their kernels for several nodes (`as_several_nodes`), checked as above."""
    dtype = torch.bfloat16
    with as_several_nodes(s) as v:
        for tokens, hidden in small(((1, 8192), (33, 8192), (300, 5120)), ((1, 8192), (33, 8192))):
            for mode in MODES:
                if mode in ONE_NODE_MODES:  # refused before any launch
                    cases.run(f"several-node kernel: all_reduce_rmsnorm {mode} {tokens}x{hidden} refused",
                              lambda: refused(lambda: v.rmsnorm(tokens, hidden, dtype, mode, graph=False),
                                              "one node only"))
                    continue
                cases.run(f"several-node kernel: all_reduce_rmsnorm {mode} {tokens}x{hidden}",
                          lambda: v.rmsnorm(tokens, hidden, dtype, mode, graph=False))
        cases.run("several-node kernel: all_reduce_rmsnorm in a CUDA graph",
                  lambda: v.rmsnorm(32, 8192, dtype, None, graph=True))
        for m, n, k in small(((16, 8192, 512), (100, 1000, 300), (1030, 2050, 1024)), ((100, 1000, 300),)):
            cases.run(f"several-node kernel: matmul_all_reduce {m}x{n}x{k}",
                      lambda: v.matmul(m, n, k, dtype, graph=False))
            cases.run(f"several-node kernel: matmul_reduce_scatter {m * world}x{n}x{k}",
                      lambda: v.matmul_scatter(m * world, n, k, dtype, False, "kernel"))
            cases.run(f"several-node kernel: all_gather_matmul {m}x{n}x{k}",
                      lambda: v.gather_matmul(m, n, k, dtype, False, "kernel"))
        cases.run("several-node kernel: matmul_all_reduce 8 launches back to back",
                  lambda: v.matmul(100, 1000, 300, dtype, graph=False, launches=8))
        cases.run("several-node kernel: matmul_reduce_scatter 8 launches back to back",
                  lambda: v.matmul_scatter(100 * world, 1000, 300, dtype, False, "kernel", launches=8))
        cases.run("several-node kernel: all_gather_matmul 8 launches back to back",
                  lambda: v.gather_matmul(100, 1000, 300, dtype, False, "kernel", launches=8))
        cases.run("several-node kernel: matmul_all_reduce in a CUDA graph",
                  lambda: v.matmul(200, 4096, 512, dtype, graph=True))
        cases.run("several-node kernel: matmul_reduce_scatter in a CUDA graph",
                  lambda: v.matmul_scatter(200 * world, 4096, 512, dtype, True, "kernel"))
        cases.run("several-node kernel: all_gather_matmul in a CUDA graph",
                  lambda: v.gather_matmul(200, 4096, 512, dtype, True, "kernel"))
