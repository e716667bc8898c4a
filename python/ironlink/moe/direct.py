"""MoeExchange's direct path: dispatch and combine on a heap of one node, where every peer's heap
is mapped (kernels: moe/direct_kernels.py). Per layer, in stream order on every rank:

dispatch
1. `pack_rows` (one program per token): each token once into this rank's stage (its row, then its
   expert ids and weights; an fp8 dispatch quantizes it there), its token count into `tokens`
   (`write_header`); the rows of an x in the heap stay in place (`rows_in_place`: only the ids and
   weights are staged, and `tokens` says where the rows are);
2. `gather_meta` (barrier, then peer loads): every rank's token count, where its rows are, and
   its ids and weights into `meta`, sources in rank order;
3. the counting sort by local expert over `meta` (moe.sort): expert counts and offsets, and per
   (source token, choice) its recv_x row (`slot`) and weight: the layout, computed on the GPU;
4. `pull_rows` (peer loads, then a barrier): each source token with a choice here crosses NVLink
   once and is stored into every recv_x row it takes.
combine
5. `reduce_push` (a barrier, peer stores, a barrier): per source token, its outputs of this
   rank's experts weighted and summed, into row (this rank, token) of the source's `back`;
6. `sum_partials` (local): each token's rows from the ranks it went to, summed in rank order.

Nothing reads a count on the host, so a CUDA graph replays it with new routing. The barriers
order the buffers' reuse: a rank restages (1) only after every rank passed pull_rows' barrier,
so after every read of its stage; it reads `back` (6) after every rank passed reduce_push's
barrier, so after every store into it; and a rank stores into `back` (5) only after every rank
passed reduce_push's first barrier, which each reaches after reading `back` in its last combine
(6), even with no dispatch in between (a combine repeated on one handle, as the benchmark times
it). Each barrier pairs the same-index CTAs of the ranks: every rank launches the same grid.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..language._abi import MAX_CTAS
from ..runtime.launch import launch_with_status
from ..runtime.heap_args import span_bytes
from ..runtime.registry import holds
from . import direct_kernels as dk
from . import kernels, sort
from ..runtime.tuning.moe import MoeConfig
from .layout import Layout, _pow2, _Sort, take_count


class DirectPath:
    """The direct path's buffers and launches for one MoeExchange `m` (whose shapes, recv_x and
    overflow summary it uses), launched as `config` says. `sim_deltas` (tests): int64 [world] byte
    distances to the simulated peers' heaps; the kernels then run without the device library
    (moe/direct_kernels.py, SIM)."""

    def __init__(self, m: Any, heap: Any, ctas: int, config: MoeConfig, sim_deltas: Optional[Any] = None,
                 per_sm: int = 1) -> None:
        import torch

        self.m, self.heap, self.ctas, self.config, self.sim = m, heap, ctas, config, sim_deltas
        self.per_sm = per_sm  # CTAs per SM of pull_rows and reduce_push (config.ctas_per_sm: every SM in the budget)
        dev = heap.device
        # Heap allocation order: layout._heap_shapes(path="direct"). Peers read and write these at
        # this rank's offsets: at the heap's top (`heap.empty(at_top=True)`), the same on every rank.
        self.stage = heap.empty((m.max_tokens, m.row), m.dtype, at_top=True)
        self.back = heap.empty((m.world * m.max_tokens, m.hidden), m.dtype, at_top=True)
        self.tokens = heap.empty((3,), torch.int64, at_top=True)  # the count, and where the token rows are (write_header)
        rows = m.world * m.max_tokens
        self.token_rows = torch.arange(m.max_tokens, dtype=torch.int64, device=dev)  # pack's send_row
        self.meta = torch.zeros(rows, 2 * m.topk, dtype=torch.int32, device=dev)
        self.src_counts = torch.zeros(m.world, dtype=torch.int64, device=dev)
        self.src_rows = torch.zeros(m.world, dk.SOURCE_WORDS.value, dtype=torch.int64, device=dev)  # gather_meta's
        self.bad = torch.zeros(ctas, dtype=torch.int64, device=dev)
        self.source = torch.empty(m.capacity, dtype=torch.int64, device=dev)  # expert_place's, unused here
        self.received = torch.zeros(1, dtype=torch.int64, device=dev)
        self.sim_status = torch.zeros(MAX_CTAS, dtype=torch.int32, device=dev)
        self.wb = _pow2(m.world)
        self.by_expert = _Sort.make(m.sort_programs, m.local_experts, m.kb, dev, config)  # place's counting sort
        self.rows_in_flight = max(1, config.pull_rows // per_sm)  # rows each CTA of pull_rows loads at once

    def free(self) -> None:
        for t in (self.tokens, self.back, self.stage):
            self.heap.free(t)

    def _launch(self, name: str, kernel: Any, grid: int, args: tuple[Any, ...], check: bool, function: str,
                **meta: Any) -> None:
        """`kernel[(grid,)](ctx, *args, deltas, status, SIM=..., **meta)`, its statuses checked as
        every ironlink call's (launch_with_status); simulated: the plain Triton kernel, no library."""
        if self.sim is not None:
            kernel.fn[(grid,)](0, *args, self.sim, self.sim_status, SIM=True, **meta)
            return
        h = self.heap
        call: Callable[[Any], None] = lambda status: kernel[(grid,)](h.ctx, *args, self.src_counts, status,
                                                                     SIM=False, **meta)
        launch_with_status(name, h, grid, call, check, function=function)

    def grid(self) -> int:
        """The CTAs of pull_rows and reduce_push: `per_sm` per SM of the budget."""
        return min(self.ctas * self.per_sm, MAX_CTAS)

    def dispatch(self, x: Any, idx: Any, weights: Any, t: int, check: bool) -> Layout:
        """Steps 1 to 4: x [t, hidden], idx / weights [t, topk] (contiguous) staged, gathered and
        pulled into recv_x; the layout."""
        self.stage_tokens(x, idx, weights, t)
        self.gather(check)
        return self.place(check)

    def combine(self, y: Any, layout: Layout, t: int, check: bool) -> Any:
        """Steps 5 and 6: [t, hidden], each own token's expert outputs weighted and summed."""
        self.push(y, layout, check)
        return self.sum(t)

    def stage_tokens(self, x: Any, idx: Any, weights: Any, t: int) -> None:
        """Step 1: this rank's t tokens' ids and weights into its stage, and their rows: where x
        lies in the heap with rows the peers can read in place (`rows_in_place`) they stay there,
        else into the stage too; t and where the rows are into `tokens` (`write_header`)."""
        import torch

        m, k, c = self.m, kernels, self.config
        in_place = self.rows_in_place(x) if t else None
        offset, row_bytes = in_place or (0, 2 * m.row)
        dk.write_header[(1,)](self.tokens, t, offset, row_bytes)
        if not t:
            return
        words = self.stage.view(torch.int32)
        meta = (m.meta_col // 2, m.meta_cols // 2)
        meta_block = _pow2(max(16, meta[1]))
        rows = self.token_rows
        if in_place:  # the ids and weights alone (no row chunks: hidden 0)
            k.pack_rows[(t,)](x, idx, weights, rows, self.stage, words, 0, *meta, m.row, m.num_experts, WORLD=1,
                              K=m.topk, BLOCK=c.row_block, META_BLOCK=meta_block, num_warps=c.row_warps)
        elif m.fp8:
            k.pack_rows_fp8[(t,)](x, idx, weights, rows, self.stage.view(torch.uint8), words, m.hidden, *meta, m.row,
                                  m.scale_col // 2, m.num_experts, WORLD=1, K=m.topk, BLOCK=c.row_block,
                                  META_BLOCK=meta_block, GROUP=k.FP8_GROUP, QMAX=k.FP8_MAX, MIN_AMAX=k.FP8_MIN_AMAX,
                                  num_warps=c.row_warps)
        else:
            k.pack_rows[(t,)](x, idx, weights, rows, self.stage, words, m.hidden, *meta, m.row, m.num_experts,
                              WORLD=1, K=m.topk, BLOCK=c.row_block, META_BLOCK=meta_block, num_warps=c.row_warps)

    def rows_in_place(self, x: Any) -> Optional[tuple[int, int]]:
        """(bytes from the stage to x, bytes between its rows) where the peers can pull x's rows in
        place: a bf16 / fp16 dispatch (an fp8 one quantizes into the stage), x in this heap with
        unit-stride rows, 16-byte aligned. Else None: the rows are copied into the stage. x must
        then stay unchanged until this dispatch's pull_rows (its last barrier) has passed on this
        rank, as the stage does: the next kernels in stream order may write it."""
        m = self.m
        if m.fp8 or x.dim() != 2 or x.stride(1) != 1 or x.shape[0] == 0:
            return None
        row_bytes, at = x.stride(0) * x.element_size(), x.data_ptr()
        if row_bytes % 16 or at % 16 or not self._holds(x):
            return None
        return at - self.stage.data_ptr(), row_bytes

    def _holds(self, x: Any) -> bool:
        """Whether x lies in this heap (simulated: in its arena)."""
        if self.sim is not None:
            arena = self.heap.arena
            end = x.data_ptr() + span_bytes(x.shape, x.stride(), x.element_size())
            return arena.data_ptr() <= x.data_ptr() and end <= arena.data_ptr() + arena.numel()
        return holds(self.heap, x)

    def gather(self, check: bool) -> None:
        """Step 2: every rank's token count, ids and weights into meta (sources in rank order)."""
        import torch

        m = self.m
        self._launch("moe_dispatch", dk.gather_meta, self.ctas,
                     (self.stage.view(torch.int32), self.tokens, m.rank, m.row // 2, m.meta_col // 2, m.max_tokens,
                      self.meta, self.src_counts, self.src_rows, self.bad),
                     check, "symm_barrier", WORLD=m.world, K=m.topk, MB=_pow2(2 * m.topk),
                     BR=self.config.meta_block_rows, num_warps=self.config.direct_warps)

    def place(self, check: bool) -> Layout:
        """Steps 3 and 4: the layout from meta (a counting sort by local expert), then recv_x
        (and an fp8 dispatch's scales) pulled from the sources' stages."""
        import torch

        m, s = self.m, self.by_expert
        rows, k, le = self.meta.shape[0], m.topk, m.local_experts
        dev = self.meta.device
        counts = torch.empty(le, dtype=torch.int64, device=dev)
        offsets = torch.empty(le, dtype=torch.int64, device=dev)
        slot = torch.empty(rows, k, dtype=torch.int64, device=dev)
        weight = torch.empty(rows, k, dtype=torch.float32, device=dev)
        ids, weights = self.meta, self.meta.view(torch.float32)[:, k:]
        lo, grid = m.rank * le, (m.sort_programs,)
        sort.expert_histogram[grid](ids, 2 * k, self.src_counts, m.world, lo, le, s.hist, self.received, WB=self.wb,
                                    K=k, BR=s.br, KB=m.kb, BB=s.bb)
        sort.bucket_scan[(1,)](s.hist, m.sort_programs, le, m.capacity, lo, s.base, counts, offsets, m.overflow,
                               BB=s.bb, PB=s.pb, num_warps=self.config.scan_warps)
        sort.expert_place[grid](ids, 2 * k, weights, self.src_counts, m.world, lo, le, s.base, m.capacity, slot,
                                weight, self.source, WB=self.wb, K=k, BR=s.br, KB=m.kb, BB=s.bb)
        if m.fp8:  # raw 2-byte words (int16: no float conversion): the bytes, and the scales beside them
            words = m.hidden // 2
            args = (self.stage.view(torch.int16), self.src_counts, self.src_rows, slot, words,
                    m.recv_x.view(torch.int16), m.scale_col, m.recv_scales.view(torch.int16), 2 * m.groups)
            side = _pow2(max(16, 2 * m.groups))
        else:
            words = m.hidden
            args = (self.stage, self.src_counts, self.src_rows, slot, words, m.recv_x, 0, m.recv_x, 0)
            side = 0
        block = min(self.config.pull_block, _pow2(words))
        self._launch("moe_dispatch", dk.pull_rows, self.grid(), args, check, "symm_barrier", WORLD=m.world, WB=self.wb,
                     K=k, KB=m.kb, BLOCK=block, SIDE_BLOCK=side, ROWS=self.rows_in_flight,
                     num_warps=_warps(block, self.config.direct_warps))
        return Layout(counts, offsets, slot, weight, self.received)

    def push(self, y: Any, layout: Layout, check: bool) -> None:
        """Step 5: each source token's outputs of this rank's experts, weighted and summed, into
        its source's `back` (y: [capacity, hidden] in recv_x's layout, `dtype`, contiguous)."""
        m, c = self.m, self.config
        block = min(c.push_block // self.per_sm, _pow2(m.hidden))
        self._launch("moe_combine", dk.reduce_push, self.grid(),
                     (y, self.meta, layout.slot, layout.weight, self.src_counts, self.src_rows, self.back, m.rank,
                      m.rank * m.local_experts, m.local_experts, m.max_tokens, m.hidden),
                     check, "symm_barrier", WORLD=m.world, WB=self.wb, K=m.topk, KB=m.kb, BLOCK=block,
                     num_warps=_warps(block, c.push_warps // self.per_sm))

    def sum(self, t: int) -> Any:
        """Step 6: [t, hidden], each token's partial sums from the ranks it went to, in rank order
        (meta must still hold this dispatch's ids: one dispatch / combine pair at a time)."""
        import torch

        m = self.m
        out = torch.empty(t, m.hidden, dtype=m.dtype, device=self.back.device)
        if t:
            dk.sum_partials[(min(t, m.programs),)](self.back, self.meta, self.src_rows, m.rank, out, m.max_tokens,
                                                   m.hidden, m.local_experts, WORLD=m.world, K=m.topk,
                                                   KB=m.kb, BLOCK=self.config.row_block,
                                                   num_warps=self.config.row_warps)
        return out

    def bad_ids(self) -> int:
        """Expert ids outside [0, num_experts) in this rank's last dispatch (waits for the GPU);
        clears the count."""
        return take_count(self.bad)


def _warps(block: int, warps: int) -> int:
    """`warps` for the blocks of a row (16-byte vectors per thread at 2048 elements and up), 4 below."""
    return warps if block >= 2048 else 4


__all__ = ["DirectPath"]
