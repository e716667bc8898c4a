"""MoeExchange's relay path: dispatch and combine through two `ironlink.all_to_all_v` exchanges,
the one path across nodes (peers on other nodes have no peer pointer), or wherever
`path="relay"` (kernels: moe/relay_kernels.py, and the pack of moe/kernels.py). Per layer, in
stream order on every rank:

dispatch
1. `route` (the counting sort by destination rank, moe.sort): each token's row in the send
   buffer per rank it goes to (`send_row`, rank-major) and the send counts; `pack` (one program
   per token): the token's row, its ids and weights into those rows (an fp8 dispatch quantizes it
   there);
2. `exchange`: all_to_all_v of the send buffer into the receive buffer (a token reaches a rank
   at most once: world * max_tokens rows each way, nothing there can overflow);
3. `place`: the counting sort by local expert over the received ids (moe.sort) gives each
   (token, choice) its recv_x row, and `gather_rows` copies each received token into them.
combine
4. `reduce_here` (`weighted_partial_sums`): per received token, its outputs of this rank's
   experts weighted and summed (fp32, choice order), one row per token;
5. `exchange` back, the counts reversed;
6. `sum_ranks` (`sum_rank_rows`): each token's rows from the ranks it went to, added in rank
   order in fp32.

Nothing reads a count on the host, so a CUDA graph replays it with new routing.
"""

from __future__ import annotations

from typing import Any, Optional

from ..ops.variable_all_to_all import all_to_all_v
from ..runtime.distributed import grid_cap
from ..runtime.tuning import all_to_all_v_launch
from . import kernels, relay_kernels as rk, sort
from ..runtime.tuning.moe import MoeConfig
from .layout import Layout, _heap_shapes, _pow2, _Sort

_NO_LIMIT = (1 << 62)  # bucket_scan's limit for a sort that cannot overflow


class RelayPath:
    """The relay path's buffers and launches for one MoeExchange `m` (whose shapes, recv_x and
    overflow summary it uses), launched as `config` says. `sms`: the SM budget as given to
    MoeExchange (None or 0: every SM), which also bounds the exchanges' CTAs."""

    def __init__(self, m: Any, heap: Any, config: MoeConfig, sms: Optional[int] = None) -> None:
        import torch

        self.m, self.heap, self.config = m, heap, config
        dev = heap.device
        # Heap allocation order: layout._heap_shapes(path="relay"). back_*: combine's one reduced
        # row per received token.
        words, counts = _heap_shapes(m.world, m.max_tokens, m.hidden, m.row, "relay")
        # Peers put into these at this rank's offsets: at the heap's top (`heap.empty(at_top=True)`).
        self.send_buf, self.recv_buf, self.back_send, self.back_recv = (heap.empty(shape, m.dtype, at_top=True)
                                                                        for shape in words)
        # Zeroed once: an exchange that fails at its first barrier (a lost peer, HEAP_ASYMMETRIC)
        # writes no receive counts, and the layout after it then places no row rather than
        # whatever the heap's memory held (an exchange that went through wrote them; they stay in
        # bounds).
        self.counts = [heap.empty(shape, torch.int64, at_top=True).zero_() for shape in counts]
        self.send_counts, self.recv_counts, self.recv_offsets, self.back_counts, self.back_offsets = self.counts
        # The routing sort's summary (moe.sort.SUMMARY): its extra bucket counts the out-of-range
        # expert ids.
        self.route_summary = torch.zeros(len(sort.SUMMARY), dtype=torch.int64, device=dev)
        self.send_offsets = torch.zeros(m.world, dtype=torch.int64, device=dev)
        # Same on every rank (the exchanges match CTAs by index): sized by the largest exchange.
        a2a_bytes = 2 * m.world * m.max_tokens * m.row
        self.a2a_ctas = min(all_to_all_v_launch(a2a_bytes)[0], grid_cap(dev), sms or grid_cap(dev))
        # By destination rank, with one more bucket for ids outside [0, num_experts); by local expert.
        self.by_rank = _Sort.make(m.sort_programs, m.world + 1, m.kb, dev, config)
        self.by_expert = _Sort.make(m.sort_programs, m.local_experts, m.kb, dev, config)

    def free(self) -> None:
        for t in (*reversed(self.counts), self.back_recv, self.back_send, self.recv_buf, self.send_buf):
            self.heap.free(t)

    def grid(self) -> int:
        """The CTAs of its exchanges (all_to_all_v's)."""
        return int(self.a2a_ctas)

    def dispatch(self, x: Any, idx: Any, weights: Any, t: int, check: bool) -> Layout:
        """Steps 1 to 3: x [t, hidden], idx / weights [t, topk] (contiguous) packed, exchanged and
        placed into recv_x; the layout, with the tokens' send rows (combine's way back)."""
        send_row = self.pack(x, idx, weights, t)
        self.exchange(self.send_buf, self.send_counts, self.recv_buf, self.recv_counts, self.recv_offsets, check)
        return self.place()._replace(send_row=send_row)

    def combine(self, y: Any, layout: Layout, t: int, check: bool) -> Any:
        """Steps 4 to 6: [t, hidden], each own token's expert outputs weighted and summed (y:
        [capacity, hidden] in recv_x's layout, `dtype`, contiguous)."""
        self.reduce_here(y, layout)
        self.exchange(self.back_send, self.recv_counts, self.back_recv, self.back_counts, self.back_offsets, check)
        return self.sum_ranks(layout, t)

    def route(self, idx: Any, t: int) -> Any:
        """send_row [t, world]: where each token of `idx` (topk_idx, contiguous) goes in the send
        buffer (rank-major, token order), -1 where it does not go; fills send_counts. A counting
        sort by destination rank on the GPU (moe.sort); ids outside [0, num_experts) go nowhere
        and are counted for `check`."""
        import torch

        m, s, k = self.m, self.by_rank, self.m.topk
        send_row = torch.empty(t, m.world, dtype=torch.int64, device=idx.device)
        grid = (m.sort_programs,)
        sort.rank_histogram[grid](idx, t, m.local_experts, m.world, s.hist, K=k, BR=s.br, KB=m.kb, BB=s.bb)
        sort.bucket_scan[(1,)](s.hist, m.sort_programs, m.world, _NO_LIMIT, 0, s.base, self.send_counts,
                               self.send_offsets, self.route_summary, BB=s.bb, PB=s.pb,
                               num_warps=self.config.scan_warps)
        sort.rank_place[grid](idx, t, m.local_experts, m.world, s.base, send_row, K=k, BR=s.br, KB=m.kb,
                              BB=s.bb, WB=_pow2(m.world))
        return send_row

    def pack(self, x: Any, idx: Any, weights: Any, t: int) -> Any:
        """Step 1: the send buffer and send_counts filled from x [t, hidden], idx / weights
        [t, topk] (contiguous); send_row (`route`)."""
        import torch

        m, c = self.m, self.config
        send_row = self.route(idx, t)
        if not t:
            return send_row
        k, b, words = kernels, self.send_buf, self.send_buf.view(torch.int32)
        meta = (m.meta_col // 2, m.meta_cols // 2)  # the ids and weights, in 4-byte words
        meta_block = _pow2(max(16, meta[1]))
        if m.fp8:
            k.pack_rows_fp8[(t,)](x, idx, weights, send_row, b.view(torch.uint8), words, m.hidden, *meta,
                                  m.row, m.scale_col // 2, m.num_experts, WORLD=m.world, K=m.topk,
                                  BLOCK=c.row_block, META_BLOCK=meta_block, GROUP=k.FP8_GROUP, QMAX=k.FP8_MAX,
                                  MIN_AMAX=k.FP8_MIN_AMAX, num_warps=c.row_warps)
        else:
            k.pack_rows[(t,)](x, idx, weights, send_row, b, words, m.hidden, *meta, m.row,
                              m.num_experts, WORLD=m.world, K=m.topk, BLOCK=c.row_block, META_BLOCK=meta_block,
                              num_warps=c.row_warps)
        return send_row

    def exchange(self, inp: Any, send_counts: Any, out: Any, recv_counts: Any, recv_offsets: Any,
                 check: bool) -> None:
        """Steps 2 and 5, the collective ones (tests/with_torch/scripts/_moe_sim.py runs them in Python between
        simulated ranks)."""
        all_to_all_v(inp, send_counts, out, recv_counts, recv_offsets, heap=self.heap, check=check,
                     ctas=self.a2a_ctas)

    def place(self) -> Layout:
        """Step 3, from the received tokens' ids: the layout (counts, offsets, slot, weight,
        received), recv_x filled, the overflow summary set. A counting sort by local expert on the
        GPU (moe.sort): its work follows the rows received, not the buffers' capacity."""
        import torch

        m, s = self.m, self.by_expert
        rows, k, le = self.recv_buf.shape[0], m.topk, m.local_experts
        dev = self.recv_buf.device
        stride = m.row // 2  # a row in 4-byte words
        ids = self.recv_buf.view(torch.int32)[:, m.meta_col // 2:]
        weights = self.recv_buf.view(torch.float32)[:, m.meta_col // 2 + k:]
        counts = torch.empty(le, dtype=torch.int64, device=dev)
        offsets = torch.empty(le, dtype=torch.int64, device=dev)
        slot = torch.empty(rows, k, dtype=torch.int64, device=dev)
        weight = torch.empty(rows, k, dtype=torch.float32, device=dev)
        received = torch.empty(1, dtype=torch.int64, device=dev)
        source = torch.empty(m.capacity, dtype=torch.int64, device=dev)
        lo, grid, wb = m.rank * le, (m.sort_programs,), _pow2(m.world)
        sort.expert_histogram[grid](ids, stride, self.recv_counts, m.world, lo, le, s.hist, received, WB=wb, K=k,
                                    BR=s.br, KB=m.kb, BB=s.bb)
        sort.bucket_scan[(1,)](s.hist, m.sort_programs, le, m.capacity, lo, s.base, counts, offsets,
                               m.overflow, BB=s.bb, PB=s.pb, num_warps=self.config.scan_warps)
        sort.expert_place[grid](ids, stride, weights, self.recv_counts, m.world, lo, le, s.base, m.capacity,
                                slot, weight, source, WB=wb, K=k, BR=s.br, KB=m.kb, BB=s.bb)
        self._gather(source, m.overflow[3:4])
        return Layout(counts, offsets, slot, weight, received)

    def _gather(self, rows: Any, total: Any) -> None:
        """recv_x[i] (and recv_scales[i]) = received token rows[i]'s payload, i < min(total, capacity)."""
        import torch

        m, c = self.m, self.config
        if m.fp8:  # copied as raw 2-byte words (int16: no float conversion): the bytes, and the scales beside them
            rk.gather_rows[(m.programs,)](self.recv_buf.view(torch.int16), m.row, rows, total, m.capacity,
                                          m.recv_x.view(torch.int16), m.hidden // 2, m.scale_col,
                                          m.recv_scales.view(torch.int16), 2 * m.groups, BLOCK=c.row_block,
                                          SIDE_BLOCK=_pow2(max(16, 2 * m.groups)), num_warps=c.row_warps)
        else:
            rk.gather_rows[(m.programs,)](self.recv_buf, m.row, rows, total, m.capacity, m.recv_x, m.hidden, 0,
                                          m.recv_x, 0, BLOCK=c.row_block, SIDE_BLOCK=0, num_warps=c.row_warps)

    def reduce_here(self, y: Any, layout: Layout) -> None:
        """Step 4: back_send[r] = received token r's outputs of this rank's experts, weighted and
        summed."""
        m, c = self.m, self.config
        rk.weighted_partial_sums[(m.programs,)](y, layout.slot, layout.weight, layout.received, self.back_send,
                                                m.hidden, K=m.topk, BLOCK=c.row_block, num_warps=c.row_warps)

    def sum_ranks(self, layout: Layout, t: int) -> Any:
        """Step 6: [t, hidden], each token's per-rank sums (back from the ranks it went to, along
        `layout.send_row`) added in rank order."""
        import torch

        m = self.m
        out = torch.empty(t, m.hidden, dtype=m.dtype, device=self.back_recv.device)
        if t:
            rk.sum_rank_rows[(t,)](self.back_recv, layout.send_row, out, m.hidden, WORLD=m.world,
                                   BLOCK=self.config.row_block, num_warps=self.config.row_warps)
        return out

    def bad_ids(self) -> int:
        """Expert ids outside [0, num_experts) in this rank's last dispatch (waits for the GPU);
        clears the count."""
        bad = int(self.route_summary.tolist()[4])
        if bad:
            self.route_summary.zero_()
        return bad


__all__ = ["RelayPath"]
