"""PyTorch's contenders of bench/moe.py, the same work as MoeExchange's dispatch and combine:
- `torch_a2a`: the tokens sorted by expert, the counts exchanged with all_to_all_single and read
  back to the host, the rows by all_to_all_single and back, a weighted sum (it syncs with the
  host, so it is timed eagerly);
- `torch_nvshmem` (`NvshmemPath`, `setup`): the same sort, rows and weighted sum with PyTorch's
  NVSHMEM all-to-all, whose split sizes are read from device memory, so nothing syncs with the host:

    torch.ops.symm_mem.all_to_all_vdev(input, out, in_splits, out_splits_offsets, group_name)

What the bench relies on (PyTorch 2.11, torch/csrc/distributed/c10d/symm_mem/nvshmem_extension.cu):
- all four tensors are NVSHMEM symmetric memory (`symm_mem.set_backend("NVSHMEM")` before the
  process's first symmetric allocation, `symm_mem.empty`, `symm_mem.rendezvous`); the receivers
  pull the rows from the senders' `input`;
- `in_splits` int64 [world]: rows (dim 0) for each rank, packed in rank order from row 0;
  `out_splits_offsets` int64 [2, world] is written: rows received from each rank, and where they
  start in `out` (in rank order); nothing checks that they fit `out`, so it is sized for the worst
  case (every rank sends everything here);
- its copy kernel gives each peer `grid / world` blocks and asserts that a peer's bytes split
  evenly over them; the grid is 64 blocks on one node for inputs of 4 MiB and more
  (TORCH_SYMMMEM_NBLOCKS overrides it), so the buffers here are at least 4 MiB and a row's bytes
  must divide by 64 / world (true at hidden 7168 bf16 for 2, 4 and 8 ranks);
- PyTorch's NVSHMEM allocator refuses a group of 1 (world 1 is skipped);
- the NVSHMEM heap is NVSHMEM_SYMMETRIC_SIZE bytes (1 GiB by default), read once when NVSHMEM
  starts (the first allocation): the bench sets it, unless set, to what the buffers need.

all_to_all_vdev_2d (rows grouped by expert on arrival) is not used: it caps the experts per rank
at 16 (64 experts need 4 ranks or more) and does other work than torch_a2a.

No ironlink import, torch imported where used: tests/cpu/test_moe_bench.py checks the pure parts
without GPUs.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Optional

OP_ARGS = ["input", "out", "in_splits", "out_splits_offsets", "group_name"]
ONE_NODE_BLOCKS = 64  # all_to_all_vdev's grid on one node once its input has 4 MiB
MIN_BUFFER_BYTES = 4 << 20
HEAP_SLACK_BYTES = 1 << 30  # NVSHMEM's own allocations and the memory pool's rounding


def blocks_per_peer(world: int, env: Mapping[str, str]) -> int:
    """The blocks all_to_all_vdev's copy kernel gives each peer (see the module docs)."""
    try:
        blocks = int(env.get("TORCH_SYMMMEM_NBLOCKS", "0"))
    except ValueError:
        blocks = 0
    return max((blocks if blocks > 0 else ONE_NODE_BLOCKS) // world, 1)


def skip_reason(world: int, row_bytes: int, symm_mem: Any, ops: Any, env: Mapping[str, str]) -> Optional[str]:
    """Why this process cannot run the contender, or None. `symm_mem`:
    torch.distributed._symmetric_memory, `ops`: torch.ops.symm_mem."""
    if world < 2:
        return "world size 1: PyTorch's NVSHMEM symmetric memory refuses a group of 1"
    op = getattr(ops, "all_to_all_vdev", None)
    if op is None:
        return "this torch has no torch.ops.symm_mem.all_to_all_vdev"
    args = [a.name for a in op.default._schema.arguments]
    if args != OP_ARGS:
        return f"this torch's all_to_all_vdev takes ({', '.join(args)}), not ({', '.join(OP_ARGS)})"
    available = getattr(symm_mem, "is_nvshmem_available", None)
    if available is None or not available():
        return "torch.distributed._symmetric_memory.is_nvshmem_available() is false (no NVSHMEM in this torch or system)"
    bpp = blocks_per_peer(world, env)
    if row_bytes % bpp:
        return (f"a row of {row_bytes} bytes does not split over the {bpp} blocks all_to_all_vdev gives each "
                "peer (its kernel asserts it does)")
    return None


def buffer_rows(world: int, max_tokens: int, topk: int, row_bytes: int) -> tuple[int, int]:
    """(send rows, receive rows): every (token, choice) of this rank once, and of every rank (all
    routed here); at least MIN_BUFFER_BYTES each, for the grid `blocks_per_peer` assumes."""
    least = -(-MIN_BUFFER_BYTES // row_bytes)
    return max(max_tokens * topk, least), max(world * max_tokens * topk, least)


def heap_bytes(world: int, max_tokens: int, topk: int, row_bytes: int) -> int:
    """NVSHMEM_SYMMETRIC_SIZE for the buffers: send and back (send rows), receive, splits."""
    send, recv = buffer_rows(world, max_tokens, topk, row_bytes)
    return (2 * send + recv) * row_bytes + HEAP_SLACK_BYTES


def weighted_sum(rows: Any, weights: Any) -> Any:
    """[T, H]: rows [T * k, H] (token-major, choice order) weighted by weights [T, k] in fp32."""
    t, k = weights.shape
    return (rows.view(t, k, -1).float() * weights.float()[..., None]).sum(1).to(rows.dtype)


def torch_a2a(x: Any, idx: Any, w: Any, world: int, num_experts: int,
              topk: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(dispatch, dispatch + combine) of the torch_a2a contender for these tokens: dispatch
    returns (the rows received, the order it sorted by, send counts, receive counts); the layer
    returns the combined [T, H]."""
    import torch
    import torch.distributed as dist

    le, k = num_experts // world, topk

    def dispatch() -> Any:
        experts = idx.reshape(-1)
        order = torch.argsort(experts, stable=True)  # by expert, so by rank, tokens in order
        send = x[order // k]
        counts = torch.bincount(experts // le, minlength=world)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)
        sc, rc = counts.tolist(), recv_counts.tolist()  # the host sync
        recv = torch.empty(sum(rc), x.shape[1], device="cuda", dtype=x.dtype)
        dist.all_to_all_single(recv, send, rc, sc)
        return recv, order, sc, rc

    def layer() -> Any:
        recv, order, sc, rc = dispatch()
        back = torch.empty(len(order), x.shape[1], device="cuda", dtype=x.dtype)
        dist.all_to_all_single(back, recv, sc, rc)
        rows = torch.empty_like(back)
        rows[order] = back
        return weighted_sum(rows, w)

    return dispatch, layer


class NvshmemPath:
    """Buffers for the largest token count (collective to create: every rank, same order)."""

    def __init__(self, world: int, max_tokens: int, hidden: int, topk: int, experts: int, dtype: Any) -> None:
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        self.world, self.hidden, self.topk, self.local_experts = world, hidden, topk, experts // world
        self.group = dist.group.WORLD.group_name
        row_bytes = hidden * torch.tensor([], dtype=dtype).element_size()
        send_rows, recv_rows = buffer_rows(world, max_tokens, topk, row_bytes)
        os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(heap_bytes(world, max_tokens, topk, row_bytes)))
        symm_mem.set_backend("NVSHMEM")

        device = torch.device("cuda", torch.cuda.current_device())  # an index: see bench/moe.py's main

        def sym(*shape: int, dt: Any = dtype) -> Any:
            with torch.cuda.device(device):
                t = symm_mem.empty(shape, dtype=dt, device=device)
                symm_mem.rendezvous(t, self.group)
            return t

        self.send, self.recv, self.back = sym(send_rows, hidden), sym(recv_rows, hidden), sym(send_rows, hidden)
        # all_to_all_vdev's count exchange writes into the peers' out_splits_offsets before its
        # closing barrier, maybe while a slower peer still reads them in the previous call's copy:
        # back-to-back dispatches (timing) alternate two sets of splits (a rank starts call k + 2
        # only after every rank has left call k's copy). Combine's are kept apart by dispatch.
        self.splits = [sym(world, dt=torch.int64) for _ in range(2)]
        self.recv_splits = [sym(2, world, dt=torch.int64) for _ in range(2)]
        self.turn = 0
        self.back_splits, self.back_recv_splits = sym(world, dt=torch.int64), sym(2, world, dt=torch.int64)
        self.a2a = torch.ops.symm_mem.all_to_all_vdev

    def contender(self, x: Any, idx: Any, w: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
        """(dispatch, dispatch + combine) for these tokens: dispatch returns the flat (token,
        choice) order it sorted by; the layer returns the combined [T, H]."""
        import torch

        k, n = self.topk, idx.numel()
        ones = torch.ones(n, dtype=torch.int64, device=idx.device)

        # Timed back to back, a call may refill `send` while a slower peer still pulls the last
        # call's rows from it: the same rows (the routing is fixed), so the race changes nothing.
        def dispatch() -> Any:
            self.turn ^= 1
            splits = self.splits[self.turn]
            experts = idx.reshape(-1)
            order = torch.argsort(experts, stable=True)  # by expert, so by rank, tokens in order
            splits.zero_().scatter_add_(0, experts // self.local_experts, ones)  # (torch.bincount syncs)
            torch.index_select(x, 0, order // k, out=self.send[:n])
            self.a2a(self.send, self.recv, splits, self.recv_splits[self.turn], self.group)
            return order

        def layer() -> Any:
            order = dispatch()
            # Each rank's rows go back to it: they arrive in the order this rank sent them.
            self.back_splits.copy_(self.recv_splits[self.turn][0])
            self.a2a(self.recv, self.back, self.back_splits, self.back_recv_splits, self.group)
            rows = torch.empty_like(self.back[:n])
            rows[order] = self.back[:n]
            return weighted_sum(rows, w)

        return dispatch, layer

    def received(self) -> Any:
        """The rows the last dispatch brought here (reads the count back: for checks only)."""
        return self.recv[:int(self.recv_splits[self.turn][0].sum())]


def setup(world: int, max_tokens: int, hidden: int, topk: int, experts: int, dtype: Any,
          gather: Callable[[Optional[str]], list[Optional[str]]]) -> tuple[Optional[NvshmemPath], Optional[str]]:
    """(the contender, None), or (None, why not). `gather` collects every rank's skip reason
    (all_gather_object), so all ranks skip together or none does."""
    import torch

    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:
        symm_mem = None  # a torch without symmetric memory: no is_nvshmem_available either
    row_bytes = hidden * torch.tensor([], dtype=dtype).element_size()
    reasons = gather(skip_reason(world, row_bytes, symm_mem, torch.ops.symm_mem, os.environ))
    why = next((f"rank {r}: {m}" for r, m in enumerate(reasons) if m), None)
    if why:
        return None, why
    try:  # NVSHMEM starts here; a failure on every rank (its configuration) is a skip, not a crash
        return NvshmemPath(world, max_tokens, hidden, topk, experts, dtype), None
    except Exception as e:
        return None, f"setting up NVSHMEM symmetric memory failed: {type(e).__name__}: {e}"


__all__ = ["NvshmemPath", "blocks_per_peer", "buffer_rows", "heap_bytes", "setup", "skip_reason", "torch_a2a",
           "weighted_sum"]
