"""MoeExchange's low-latency path: dispatch and combine of few tokens (decode) on a heap of one
node, one kernel launch each (kernels: moe/low_latency_kernels.py, whose docs give the protocol,
and the bookkeeping of its buffers' copies, moe/low_latency_copies.py).

Its recv_x is laid out by expert block: expert e's rows start at e * world * max_tokens (the most
rows an expert can get: every token of every rank), `expert_offsets` says so and `expert_counts`
how many of them it got; a grouped GEMM over (counts, offsets) reads it as it reads the packed
layout of the other paths. The rows' order within an expert varies run to run (atomic adds);
combine's sums do not (each token's choices in order, then the ranks in order: the bits of the
other paths). The price is memory: recv_x holds local_experts * world * max_tokens rows, against
world * max_tokens * topk packed, so `MoeExchange` takes this path for small `max_tokens` only
(`MoeConfig.low_latency_max_tokens`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..language import _abi
from ..language._abi import MAX_CTAS
from ..language._flags import EMPTY_BITS
from ..runtime.launch import launch_with_status
from . import kernels, low_latency_kernels as llk
from ..runtime.tuning.moe import MoeConfig
from .layout import Layout, _pow2, take_count
from .low_latency_copies import COPIES


# Simulation: how long a flag wait polls before TIMEOUT (the interpreter's clock: 1 us a reading).
SIM_TIMEOUT_NS = 50_000


def capacity(world: int, max_tokens: int, local_experts: int) -> int:
    """recv_x's rows on the low-latency path: a block of world * max_tokens per local expert."""
    return local_experts * world * max_tokens


class LowLatencyPath:
    """The low-latency path's buffers and launches for one MoeExchange `m`, launched as `config`
    says. `sim_deltas` (tests): int64 [world] byte distances to the simulated peers' heaps; the
    kernels then run in two phases the test orders, without the device library
    (moe/low_latency_kernels.py, SIM)."""

    def __init__(self, m: Any, heap: Any, ctas: int, config: MoeConfig, sim_deltas: Optional[Any] = None) -> None:
        import torch

        self.m, self.heap, self.ctas, self.config, self.sim = m, heap, ctas, config, sim_deltas
        dev = heap.device
        w, mt = m.world, m.max_tokens
        # Heap allocation order: layout._heap_shapes(path="low_latency"). Every element a peer
        # writes starts "empty" (language._flags) and is emptied again by its reader a call later;
        # the fills come before the barrier, so no peer's first store can precede them. COPIES of
        # each, used by calls in turn.
        copies = COPIES.value
        # Peers store into these at this rank's offsets: at the heap's top (`heap.empty(at_top=True)`).
        self.landing = heap.empty((copies, w, mt, m.row), m.dtype, at_top=True)
        self.back = heap.empty((copies, w, mt, m.hidden), m.dtype, at_top=True)
        self.counts = heap.empty((copies, w, MAX_CTAS), torch.int64, at_top=True)  # dispatch's token count words
        self.back_counts = heap.empty((copies, w, MAX_CTAS), torch.int64, at_top=True)  # combine's
        self._make_empty()
        if sim_deltas is None:
            heap.barrier()
        self.receive_pending = False  # a deferred dispatch's receive not yet launched
        # Diagnostics (bench/probes/moe_timeline.py): int64 [ctas, language.trace.TRACE_SLOTS], zeroed by the
        # caller; while set, the kernels are built with TRACE and stamp the phases of each CTA.
        self.trace: Optional[Any] = None
        i32, i64 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.int64, device=dev)
        # Each CTA's calls so far (the half of landing / back it uses), one counter each way.
        self.dispatch_calls, self.combine_calls = torch.zeros(MAX_CTAS, **i32), torch.zeros(MAX_CTAS, **i32)
        # What each CTA read in its previous call, which it empties in the next: dispatch's token
        # counts per source and which rows came; combine's T and, per call parity, which rows came.
        self.seen, self.seen_rows = torch.zeros(w, MAX_CTAS, **i32), torch.zeros(w, mt, **i32)
        self.seen_tokens, self.seen_back = torch.zeros(MAX_CTAS, **i32), torch.zeros(2, w, mt, **i32)
        # The experts' row counters and the CTAs' arrivals: zero between dispatches.
        self.counters, self.arrivals = torch.zeros(m.local_experts, **i32), torch.zeros(1, **i32)
        self.own_ids = torch.zeros(mt, m.topk, **i32)  # this rank's ids as sent, for combine
        self.src_counts = torch.zeros(w, **i64)
        self.bad = torch.zeros(ctas, **i64)
        self.sim_status = torch.zeros(MAX_CTAS, **i32)
        # Simulation: a context for the kernels' flag waits (its timeout and error words).
        self.sim_ctx = torch.zeros(_abi.CONTEXT_SIZE // 8, dtype=torch.int64) if sim_deltas is not None else None
        if self.sim_ctx is not None:
            self.sim_ctx[_abi.CONTEXT_FIELDS["timeout_ns"][0] // 8] = SIM_TIMEOUT_NS

    def _make_empty(self) -> None:
        """Fills every element a peer writes with "empty" (language._flags, by width): the
        payload of each landing row (bf16 / fp16 values, or fp8 bytes), its int32 words (ids,
        weights, fp8 scales), back's rows and the count words (their low int32 half is the word)."""
        import torch

        m = self.m
        if m.fp8:
            self.landing.view(torch.int8)[..., :m.hidden].fill_(EMPTY_BITS[8])
        else:
            self.landing.view(torch.int16)[..., :m.hidden].fill_(EMPTY_BITS[16])
        self.landing.view(torch.int32)[..., m.meta_col // 2:].fill_(EMPTY_BITS[32])
        self.back.view(torch.int16).fill_(EMPTY_BITS[16])
        for c in (self.counts, self.back_counts):
            c.view(torch.int32).fill_(EMPTY_BITS[32])

    def free(self) -> None:
        for t in (self.back_counts, self.counts, self.back, self.landing):
            self.heap.free(t)

    def grid(self) -> int:
        """The CTAs of its two kernels."""
        return int(self.ctas)

    def dispatch(self, x: Any, idx: Any, weights: Any, t: int, check: bool, phase: int = 0) -> Layout:
        """x [t, hidden], idx / weights [t, topk] (contiguous) to the ranks of their experts: the
        layout (counts, offsets, slot, weight, received); recv_x filled. `phase` (simulation): 1
        send, 2 receive."""
        self._no_receive_pending()
        lay, args, meta = self._dispatch_args(x, idx, weights, t)
        self._run("moe_dispatch", llk.ll_dispatch, args, check, phase, **meta)
        return lay

    def send(self, x: Any, idx: Any, weights: Any, t: int, check: bool) -> tuple[Layout, Callable[[bool], None]]:
        """`dispatch` with its receive deferred: the send launched now, and `receive(check)` to
        launch the receive later in stream order (once), after which recv_x and the layout hold
        what `dispatch` would have given. Between the two the stream may run other kernels (an
        attention block): the receive waits for flag words of its own, not for tile signals."""
        self._no_receive_pending()
        lay, args, meta = self._dispatch_args(x, idx, weights, t)
        self._run("moe_dispatch", llk.ll_dispatch, args, check, 1, **meta)
        self.receive_pending = True

        def receive(check_now: bool = False) -> None:
            if not self.receive_pending:
                raise RuntimeError("MoeExchange: this dispatch's receive hook was already called")
            self.receive_pending = False
            self._run("moe_dispatch", llk.ll_dispatch, args, check_now, 2, **meta)

        return lay, receive

    def _no_receive_pending(self) -> None:
        if self.receive_pending:
            raise RuntimeError("MoeExchange: the last dispatch's receive hook has not been called (call it before "
                               "the next dispatch or combine)")

    def _dispatch_args(self, x: Any, idx: Any, weights: Any, t: int) -> tuple[Layout, tuple[Any, ...],
                                                                              dict[str, Any]]:
        """The layout's tensors (made here) and ll_dispatch's arguments and meta-parameters."""
        import torch

        m = self.m
        rows = m.world * m.max_tokens
        slot = torch.empty(rows, m.topk, dtype=torch.int64, device=x.device)
        weight = torch.empty(rows, m.topk, dtype=torch.float32, device=x.device)
        counts = torch.empty(m.local_experts, dtype=torch.int64, device=x.device)
        offsets = torch.empty(m.local_experts, dtype=torch.int64, device=x.device)
        received = torch.empty(1, dtype=torch.int64, device=x.device)
        if m.fp8:  # the fp8 bytes and their scales' bits move as raw integers (no float conversion)
            data, recv, side = self.landing.view(torch.uint8), m.recv_x.view(torch.uint8), m.recv_scales.view(
                torch.int32)
            side_words, side_block = m.groups, _pow2(max(16, m.groups))
        else:
            data, recv, side = self.landing, m.recv_x, m.recv_x
            side_words, side_block = 0, 0
        args = (x, idx, weights, t, data, self.landing.view(torch.int32), self.counts, recv, side, slot, weight,
                self.own_ids, self.src_counts, received, self.dispatch_calls, self.seen, self.seen_rows,
                self.counters, self.arrivals, counts, offsets, m.overflow, self.bad, m.rank, m.num_experts,
                m.local_experts, m.max_tokens, m.hidden, m.row, m.meta_col // 2, m.scale_col // 2, side_words)
        meta = dict(LB=_pow2(m.local_experts), SIDE_BLOCK=side_block, FP8=m.fp8, GROUP=kernels.FP8_GROUP,
                    QMAX=kernels.FP8_MAX, MIN_AMAX=kernels.FP8_MIN_AMAX)
        return Layout(counts, offsets, slot, weight, received), args, meta

    def combine(self, y: Any, layout: Layout, t: int, check: bool, phase: int = 0) -> Any:
        """[t, hidden]: each own token's rows from the ranks it went to, summed (y: [capacity,
        hidden] in recv_x's layout, `dtype`, contiguous)."""
        import torch

        self._no_receive_pending()
        m = self.m
        out = torch.empty(t, m.hidden, dtype=m.dtype, device=y.device)
        args = (y, layout.slot, layout.weight, self.src_counts, self.own_ids, self.back, self.back_counts,
                self.combine_calls, self.seen_tokens, self.seen_back, out, t, m.rank, m.local_experts, m.max_tokens,
                m.hidden)
        self._run("moe_combine", llk.ll_combine, args, check, phase)
        return out

    def _run(self, name: str, kernel: Any, args: tuple[Any, ...], check: bool, phase: int, **meta: Any) -> None:
        """`kernel[(ctas,)](ctx, *args, deltas, status, ...)` in steps of BLOCK elements of a row,
        PHASE `phase` (0: all of it; dispatch 1 / 2: send / receive), its statuses checked as every
        ironlink call's; simulated, the plain Triton kernel without the library."""
        m = self.m
        block = min(self.config.low_latency_block, _pow2(m.hidden))
        meta = dict(WORLD=m.world, K=m.topk, KB=m.kb, BLOCK=block, num_warps=self.config.low_latency_warps, **meta)
        if self.sim_ctx is not None:
            kernel.fn[(self.ctas,)](self.sim_ctx.data_ptr(), *args, self.sim, self.sim_status, self.sim_status,
                                    PHASE=phase, SIM=True, **meta)
            return
        h, trace = self.heap, self.trace

        def call(status: Any) -> None:
            kernel[(self.ctas,)](h.ctx, *args, self.src_counts, status, status if trace is None else trace,
                                 PHASE=phase, SIM=False, TRACE=trace is not None, **meta)

        function = {0: "the wait for the peers' rows", 1: "the send of a deferred dispatch",
                    2: "the wait for the peers' rows of a deferred dispatch"}[phase]
        launch_with_status(name, h, self.ctas, call, check, function=function)

    def bad_ids(self) -> int:
        """Expert ids outside [0, num_experts) in this rank's last dispatch (waits for the GPU);
        clears the count."""
        return take_count(self.bad)


__all__ = ["LowLatencyPath", "capacity"]
