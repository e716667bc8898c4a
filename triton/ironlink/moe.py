"""MoE token dispatch and combine whose counts never leave the GPU (no host sync, CUDA-graph safe
when the routing changes between replays):

    moe = ironlink.MoeExchange(heap, max_tokens=4096, hidden=7168, topk=8, num_experts=64)
    recv_x, expert_counts, expert_offsets, handle = moe.dispatch(x, topk_idx, topk_weights)
    y = experts(recv_x, expert_counts, expert_offsets)       # grouped GEMM over local experts
    out = moe.combine(y, handle)                               # [T, H], weighted sum over top-k

Experts are split evenly: rank r holds experts r * E / world .. (r + 1) * E / world. Dispatch sorts
this rank's (token, choice) pairs by expert (so by destination rank), gathers their rows into a
heap send buffer and sends them with `ironlink.all_to_all_v` (the expert ids go along in a second,
one-element-row exchange); the receiver orders what it got by local expert. `recv_x` rows
`expert_offsets[e] ..` hold expert e's tokens; rows past the total are unspecified. Combine
undoes both orders, sends each row back to its token's rank, and sums each token's k rows
weighted by its top-k weights in fp32, in choice order (identical run to run).

Buffers are sized at construction from a worst case: `recv_capacity` rows per rank (default
world * max_tokens * topk: every choice of every rank lands here). Routing that would exceed it
fails on every rank with CAPACITY_EXCEEDED (`IronlinkError` from `heap.check()`, or at once with
`check=True`); `recv_counts` then holds how many rows each rank would have sent here. One
dispatch / combine pair at a time per MoeExchange (combine reads dispatch's receive counts).

Status: written against the simulator-tested `symm_all_to_all_v`; the GPU cases
(`tests/gpu/run.sh ops`) have not run yet.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from .variable_all_to_all import all_to_all_v


def _count(values: Any, bins: int) -> Any:
    """int64 [bins]: how often each of 0..bins appears in `values` (on the device; torch.bincount
    reads the maximum back to the host, which a CUDA graph cannot capture)."""
    import torch

    return torch.zeros(bins, dtype=torch.int64, device=values.device).scatter_add_(0, values, torch.ones_like(values))


class Handle(NamedTuple):
    """What combine needs from a dispatch."""

    tokens: int
    order: Any  # [T * k] int64: (token, choice) pairs sorted by expert
    perm: Any  # [recv_capacity] int64: received rows sorted by local expert
    recv_counts: Any  # [world] int64 heap: rows received from each rank (= rows to send back)
    weights: Any  # [T, k] the top-k weights


class MoeExchange:
    """Dispatch / combine buffers for one MoE layer shape on one heap (collective to create)."""

    def __init__(self, heap: Any, max_tokens: int, hidden: int, topk: int, num_experts: int,
                 dtype: Any = None, recv_capacity: Optional[int] = None) -> None:
        import torch

        world = heap.world_size
        if num_experts % world:
            raise ValueError(f"num_experts = {num_experts} must split evenly over {world} ranks")
        if min(max_tokens, hidden, topk) <= 0:
            raise ValueError(f"max_tokens, hidden and topk must be positive, got {max_tokens}, {hidden}, {topk}")
        self.heap, self.world, self.rank = heap, world, heap.rank
        self.max_tokens, self.hidden, self.topk, self.num_experts = max_tokens, hidden, topk, num_experts
        self.local_experts = num_experts // world
        self.dtype = dtype or torch.bfloat16
        self.capacity = recv_capacity or world * max_tokens * topk
        rows = max_tokens * topk
        e = heap.empty
        self.send_x = e((rows, hidden), self.dtype)
        self.recv_x = e((self.capacity, hidden), self.dtype)
        self.send_ids = e((rows, 1), torch.float32)  # expert ids (int32 bits) beside the rows
        self.recv_ids = e((self.capacity, 1), torch.float32)
        self.send_counts = e((world,), torch.int64)
        self.recv_counts = e((world,), torch.int64)
        self.recv_offsets = e((world,), torch.int64)
        self.back_counts = e((world,), torch.int64)
        self.back_offsets = e((world,), torch.int64)
        self.back_y = e((self.capacity, hidden), self.dtype)  # combine's send buffer
        self.back_x = e((rows, hidden), self.dtype)  # combine's receive buffer

    def _check(self, x: Any, topk_idx: Any, topk_weights: Any) -> int:
        t = x.shape[0]
        if x.shape != (t, self.hidden) or x.dtype != self.dtype:
            raise ValueError(f"x must be [tokens, {self.hidden}] {self.dtype}, got {tuple(x.shape)} {x.dtype}")
        if t > self.max_tokens:
            raise ValueError(f"{t} tokens: this MoeExchange holds at most {self.max_tokens}")
        for name, v in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
            if tuple(v.shape) != (t, self.topk):
                raise ValueError(f"{name} must be [{t}, {self.topk}], got {tuple(v.shape)}")
        return t

    def dispatch(self, x: Any, topk_idx: Any, topk_weights: Any, check: bool = False) -> tuple[Any, Any, Any, Handle]:
        """(recv_x, expert_counts [local experts], expert_offsets, handle); see the module docs."""
        import torch

        t = self._check(x, topk_idx, topk_weights)
        n, w, le = t * self.topk, self.world, self.local_experts
        experts = topk_idx.reshape(-1).to(torch.int64)
        order = torch.argsort(experts, stable=True)  # by expert, so by destination rank
        torch.index_select(x, 0, order // self.topk, out=self.send_x[:n])
        self.send_ids[:n, 0].copy_(experts[order].to(torch.int32).view(torch.float32))
        self.send_counts.copy_(_count(experts // le, w))
        all_to_all_v(self.send_x[:n], self.send_counts, self.recv_x, self.recv_counts, self.recv_offsets,
                     heap=self.heap, check=check)
        all_to_all_v(self.send_ids[:n], self.send_counts, self.recv_ids, self.recv_counts, self.recv_offsets,
                     heap=self.heap, check=check)
        # Received rows by local expert; rows past the total (key le) last.
        got = torch.arange(self.capacity, device=x.device) < self.recv_counts.sum()
        local = self.recv_ids[:, 0].view(torch.int32).to(torch.int64) - self.rank * le
        key = torch.where(got, local, le)
        perm = torch.argsort(key, stable=True)
        counts = _count(key, le + 1)[:le]
        recv_x = self.recv_x[perm]
        return recv_x, counts, torch.cumsum(counts, 0) - counts, Handle(t, order, perm, self.recv_counts, topk_weights)

    def combine(self, y: Any, handle: Handle, check: bool = False) -> Any:
        """[T, H]: each token's k expert outputs (rows of `y`, laid out as dispatch's recv_x)
        weighted by its top-k weights and summed in fp32."""
        import torch

        if tuple(y.shape) != (self.capacity, self.hidden):
            raise ValueError(f"y must be [{self.capacity}, {self.hidden}] (dispatch's layout), got {tuple(y.shape)}")
        n = handle.tokens * self.topk
        self.back_y.index_copy_(0, handle.perm, y.to(self.dtype))  # back to the order received
        all_to_all_v(self.back_y, handle.recv_counts, self.back_x, self.back_counts, self.back_offsets,
                     heap=self.heap, check=check)
        rows = torch.empty_like(self.back_x[:n])
        rows.index_copy_(0, handle.order, self.back_x[:n])  # back to (token, choice) order
        k = self.topk
        out = (rows.view(handle.tokens, k, self.hidden).float() * handle.weights.float()[..., None]).sum(1)
        return out.to(self.dtype)

    def close(self) -> None:
        """Frees the buffers (collective: same order on every rank)."""
        for t in (self.back_x, self.back_y, self.back_offsets, self.back_counts, self.recv_offsets, self.recv_counts,
                  self.send_counts, self.recv_ids, self.send_ids, self.recv_x, self.send_x):
            self.heap.free(t)


__all__ = ["Handle", "MoeExchange"]
