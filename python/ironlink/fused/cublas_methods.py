"""The sequence-parallel ops by ironlink transfers around cuBLAS GEMMs (torch.matmul) on streams:
what `all_gather_matmul` and `matmul_reduce_scatter` run unless `method="kernel"` asks for their
one-kernel Triton versions (`method_for` says which runs). `gather_then_multiply` is
all_gather_matmul's, `multiply_then_scatter` matmul_reduce_scatter's. Two methods;
`tuning.sp_method` picks one per op and M:

- "collective": the whole exchange as one ironlink collective and one GEMM. Best while the GEMM
  is small: one GEMM reads b once, a GEMM split by rank block reads it `world` times.
- "overlap": the GEMM split by rank block, overlapped with copy-engine transfers over NVLink
  (they take no SMs from the GEMM); device-side ironlink barriers (`barrier.device_barrier`)
  order the ranks, so nothing waits on the host and the whole op captures into a CUDA graph.
  all_gather_matmul: barrier (peers are done reading this rank's block of a_full) - own shard into
  a_full - barrier (every shard in place) - a side stream pulls the peers' blocks one after another
  (rank + 1 first) while the main stream multiplies the own block, then each peer block once its
  pull is done. (Pulling all peers at once on one stream each measured slower on 4 H200s: no block
  arrives before the last, so no GEMM overlaps them.)
  matmul_reduce_scatter: barrier (peers are done reading their slots) - the main stream computes
  the partial products for ranks rank + 1, rank + 2, ... (a side stream pushes each into slot
  `rank` of its owner as soon as it is done), then its own into its own slot - join - barrier
  (every slot written) - sum of the slots in rank order (fp32 accumulation).

Replicated results are bitwise identical across ranks: every rank runs the same GEMMs, of the
same shapes, on the same data.

On a heap of several nodes "collective" runs the hierarchical all-gather / reduce-scatter (the
host-level ops pick them); "overlap" is refused: the copy engine reaches only the peers of this
node.
"""

from __future__ import annotations

from typing import Any, Optional

from ..ops import all_gather, reduce_scatter
from ..runtime import streams, tuning
from ..runtime.registry import holds
from .barrier import device_barrier

# matmul_reduce_scatter's heap workspaces of M x N elements: the partial products ("collective",
# "overlap", the kernel on several nodes) and the products sent from ("overlap", the copy engine).
PARTIALS, SENDS = "matmul_reduce_scatter/partials", "matmul_reduce_scatter/sends"


def method_for(op: str, m: int, method: Optional[str], multi_node: bool, world: int) -> str:
    """The method `op` runs by for an M-row product at `world` ranks: `method` if given (checked),
    else the tuning table's; on a heap of several nodes (`multi_node`) never "overlap" (see the
    module docs)."""
    if method is None:
        return "collective" if multi_node else tuning.sp_method(op, m, world)
    tuning.check_sp_method(method)
    if multi_node and method == "overlap":
        raise ValueError(f"{op}: method 'overlap' copies from peers' memory with the copy engine, which reaches "
                         "only this node; on a heap of several nodes use 'collective' (the default there) or 'kernel'")
    return method


def _block(t: Any, p: int, rows: int) -> Any:
    """Rank p's block of rows of `t`."""
    return t[p * rows:(p + 1) * rows]


def gather_then_multiply(a_shard: Any, b: Any, heap: Any, a_full: Any, out: Any, method: str, check: bool) -> None:
    """all_gather_matmul by cuBLAS: a_full <- every rank's a_shard, out = a_full @ b, by `method` (see
    the module docs)."""
    import torch

    w, r, rows = heap.world_size, heap.rank, a_shard.shape[0]
    mine = _block(a_full, r, rows)
    if method == "collective":
        mine.copy_(a_shard)
        all_gather(a_full, mine, heap=heap, check=check)
        torch.matmul(a_full, b, out=out)
        return
    device_barrier(heap, check)
    mine.copy_(a_shard)
    device_barrier(heap, check)
    main = torch.cuda.current_stream()
    (side,) = streams.side_streams(heap.device.index, 1, main)
    side.wait_stream(main)
    pulled = []
    for i in range(1, w):
        p = (r + i) % w
        with torch.cuda.stream(side):
            _block(a_full, p, rows).copy_(_block(heap.peer_tensor(a_full, p), p, rows))
        done = torch.cuda.Event()
        done.record(side)
        pulled.append((p, done))
    torch.matmul(mine, b, out=_block(out, r, rows))
    for p, done in pulled:
        main.wait_event(done)
        torch.matmul(_block(a_full, p, rows), b, out=_block(out, p, rows))
    main.wait_stream(side)


def multiply_then_scatter(a: Any, b: Any, heap: Any, out: Any, method: str, check: bool) -> None:
    """matmul_reduce_scatter by cuBLAS: out = this rank's rows of the sum over ranks of a @ b, by
    `method` (see the module docs)."""
    import torch

    w, r = heap.world_size, heap.rank
    m, n = a.shape[0], b.shape[1]
    rows = m // w
    nbytes = m * n * a.element_size()
    partials = heap.workspace(PARTIALS, nbytes)[:nbytes].view(a.dtype).view(m, n)
    if method == "collective":
        torch.matmul(a, b, out=partials)
        mine = _block(partials, r, rows)
        if holds(heap, out):
            reduce_scatter(out, partials, heap=heap, check=check)
        else:
            reduce_scatter(mine, partials, heap=heap, check=check)
            out.copy_(mine)
        return
    # `partials` holds the slots: block q = rank q's partial product of this rank's rows.
    sends = heap.workspace(SENDS, nbytes)[:nbytes].view(a.dtype).view(m, n)
    device_barrier(heap, check)
    main = torch.cuda.current_stream()
    (side,) = streams.side_streams(heap.device.index, 1, main)
    for i in range(1, w):
        p = (r + i) % w
        torch.matmul(_block(a, p, rows), b, out=_block(sends, p, rows))
        side.wait_stream(main)
        with torch.cuda.stream(side):
            _block(heap.peer_tensor(partials, p), r, rows).copy_(_block(sends, p, rows))
    torch.matmul(_block(a, r, rows), b, out=_block(partials, r, rows))
    if w > 1:  # with one rank the side stream did nothing: joining it breaks a CUDA-graph capture
        main.wait_stream(side)
    device_barrier(heap, check)
    torch.sum(partials.view(w, rows, n), 0, out=out)


__all__ = ["PARTIALS", "SENDS", "gather_then_multiply", "method_for", "multiply_then_scatter"]
