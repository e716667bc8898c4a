"""The kernels of the simulated-nodes cases (`_nvshmem_nodes.py`): each calls one device function
of the hierarchical (several-node) build over an NVSHMEM heap and stores its status, and
`launch_ok` runs one and asserts every CTA returned OK."""

from __future__ import annotations

from typing import Any

import torch
import triton.language as tl

import ironlink
import ironlink.language as il
import ironlink.typed as ilt


@ironlink.jit(nvshmem=True, several_nodes=True)
def _all_to_all_hierarchical_kernel(ctx, inp, out, n, status):
    tl.store(status + tl.program_id(0), ilt.all_to_all(ctx, inp, out, n))


@ironlink.jit(nvshmem=True, several_nodes=True)
def _barriers_kernel(ctx, rounds, status):
    s = il.symm_barrier(ctx)
    for _ in range(1, rounds):
        s = tl.minimum(s, il.symm_barrier(ctx))
    tl.store(status + tl.program_id(0), s)


@ironlink.jit(nvshmem=True, several_nodes=True)
def _broadcast_reduce_kernel(ctx, buf, inp, out, n, root, status):
    s = ilt.broadcast(ctx, buf, n, root)
    s = tl.minimum(s, ilt.reduce(ctx, inp, out, n, 0, root))  # 0: REDUCE_OP_SUM
    tl.store(status + tl.program_id(0), s)


@ironlink.jit(nvshmem=True, several_nodes=True)
def _tiles_kernel(ctx, inp, out, rows, cols, stride, bstride, rank, status, OP: tl.constexpr, TR: tl.constexpr,
                  TC: tl.constexpr):
    # Every TR x TC tile of a rows x cols matrix (rows `stride` apart), rank r running tile t on CTA
    # (t + r) % grid, so only matching by tile index pairs the calls: OP "all_gather" (in place in
    # `inp`'s world blocks, `bstride` apart), "all_reduce" (in place in `inp`), "reduce_scatter"
    # (`inp`'s world blocks into `out`).
    pid, grid = tl.program_id(0), tl.num_programs(0)
    tiles_c = tl.cdiv(cols, TC)
    worst = pid * 0
    for t in range(0, tl.cdiv(rows, TR) * tiles_c):
        if (t + rank) % grid == pid:
            i0, j0 = (t // tiles_c) * TR, (t % tiles_c) * TC
            r, c, at = tl.minimum(TR, rows - i0), tl.minimum(TC, cols - j0), i0 * stride + j0
            if OP == "all_gather":
                s = ilt.tile_all_gather(ctx, inp + at, r, c, stride, bstride, t)
            elif OP == "all_reduce":
                s = ilt.tile_all_reduce(ctx, inp + at, r, c, stride, t)
            else:
                s = ilt.tile_reduce_scatter(ctx, inp + at, out + at, r, c, stride, bstride, t)
            worst = ilt.failure_or(s, worst)
    tl.store(status + pid, worst)


@ironlink.jit(nvshmem=True)
def _signals_kernel(ctx, world, rank, slot, status):
    # Every other rank's slot + 1 (over NVSHMEM for ranks of the other node), then wait for ours.
    s = il.symm_signal(ctx, slot, 1, 1, (rank + 1) % world)  # 1: SIGNAL_OP_ADD
    for k in range(2, world):
        s = tl.minimum(s, il.symm_signal(ctx, slot, 1, 1, (rank + k) % world))
    s = tl.minimum(s, il.symm_signal_wait(ctx, slot, 4, world - 1))  # 4: CMP_GE
    tl.store(status, s)


def launch_ok(kernel: Any, ctas: int, warps: int, *args: Any) -> None:
    """Runs `kernel[(ctas,)](*args, status)`, each CTA storing its status, and asserts all are 0."""
    status = torch.full((ctas,), -1, dtype=torch.int32, device="cuda")
    kernel[(ctas,)](*args, status, num_warps=warps)
    torch.cuda.synchronize()
    assert status.tolist() == [0] * ctas, f"statuses {status.tolist()}"
