"""MoeExchange's low-latency path: dispatch and combine of few tokens (decode) on a heap of one
node, one kernel launch each (kernels: moe/low_latency_kernels.py, whose docs give the protocol).

Its recv_x is laid out by expert block: expert e's rows start at e * world * max_tokens (the most
rows an expert can get: every token of every rank), `expert_offsets` says so and `expert_counts`
how many of them it got; a grouped GEMM over (counts, offsets) reads it as it reads the packed
layout of the other paths. The rows' order within an expert varies run to run (atomic adds);
combine's sums do not (each token's choices in order, then the ranks in order: the bits of the
other paths). The price is memory: recv_x holds local_experts * world * max_tokens rows, against
world * max_tokens * topk packed, so `MoeExchange` takes this path for small `max_tokens` only
(`tuning.MOE_LOW_LATENCY_MAX_TOKENS`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..language import _abi
from ..language._abi import MAX_CTAS
from ..ops.collectives import launch_with_status
from . import kernels, low_latency_kernels as llk
from .direct import Layout
from .layout import _pow2, take_count


# Simulation: how long a flag wait polls before TIMEOUT (the interpreter's clock: 1 us a reading).
SIM_TIMEOUT_NS = 50_000


def capacity(world: int, max_tokens: int, local_experts: int) -> int:
    """recv_x's rows on the low-latency path: a block of world * max_tokens per local expert."""
    return local_experts * world * max_tokens


class LowLatencyPath:
    """The low-latency path's buffers and launches for one MoeExchange `m`. `sim_deltas` (tests):
    int64 [world] byte distances to the simulated peers' heaps; the kernels then run in two
    phases the test orders, without the device library (moe/low_latency_kernels.py, SIM)."""

    def __init__(self, m: Any, heap: Any, ctas: int, sim_deltas: Optional[Any] = None) -> None:
        import torch

        self.m, self.heap, self.ctas, self.sim = m, heap, ctas, sim_deltas
        dev = heap.device
        w, mt = m.world, m.max_tokens
        # Heap allocation order: layout._heap_shapes(path="low_latency").
        self.landing = heap.empty((2, w, mt, m.row), m.dtype)
        self.back = heap.empty((2, w, mt, m.hidden), m.dtype)
        # Not zeroed here: a peer may already have written its count into it (a zeroing on this
        # rank's stream could land after that and erase it); a count is read only after its
        # writer's signal.
        self.landing_count = heap.empty((2, w), torch.int64)
        # The senders' flags of a dispatch whose receive is deferred (low_latency_kernels, PHASE 1
        # and 2): zeroed, then a barrier, so no zeroing here can land after a peer's first flag.
        self.arrived = heap.empty((2, w, MAX_CTAS), torch.int64).zero_()
        if sim_deltas is None:
            heap.barrier()
        self.receive_pending = False  # a deferred dispatch's receive not yet launched
        # Diagnostics (bench/moe_timeline.py): int64 [ctas, fused.trace.TRACE_SLOTS], zeroed by the
        # caller; while set, the kernels are built with TRACE and stamp the phases of each CTA.
        self.trace: Optional[Any] = None
        i32, i64 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.int64, device=dev)
        # Each CTA's calls so far (the half of landing / back it uses), one counter each way.
        self.dispatch_calls, self.combine_calls = torch.zeros(MAX_CTAS, **i32), torch.zeros(MAX_CTAS, **i32)
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

    def free(self) -> None:
        for t in (self.arrived, self.landing_count, self.back, self.landing):
            self.heap.free(t)

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
        if m.fp8:  # the fp8 bytes and their scales move as raw 2-byte words (no float conversion)
            landing, recv, side = self.landing.view(torch.int16), m.recv_x.view(torch.int16), m.recv_scales.view(
                torch.int16)
            words, side_words, side_block = m.hidden // 2, 2 * m.groups, _pow2(max(16, 2 * m.groups))
        else:
            landing, recv, side = self.landing, m.recv_x, m.recv_x
            words, side_words, side_block = m.hidden, 0, 0
        args = (x, idx, weights, t, landing, self.landing.view(torch.int32), self.landing.view(torch.uint8),
                self.landing_count, self.arrived, recv, side, slot, weight, self.own_ids, self.src_counts, received,
                self.dispatch_calls, self.counters, self.arrivals, counts, offsets, m.overflow, self.bad, m.rank,
                m.num_experts, m.local_experts, m.max_tokens, m.hidden, m.row, m.meta_col, words, m.scale_col,
                side_words)
        meta = dict(WB=_pow2(m.world), LB=_pow2(m.local_experts), SIDE_BLOCK=side_block, FP8=m.fp8,
                    GROUP=kernels.FP8_GROUP, QMAX=kernels.FP8_MAX, MIN_AMAX=kernels.FP8_MIN_AMAX)
        return Layout(counts, offsets, slot, weight, received), args, meta

    def combine(self, y: Any, layout: Layout, t: int, check: bool, phase: int = 0) -> Any:
        """[t, hidden]: each own token's rows from the ranks it went to, summed (y: [capacity,
        hidden] in recv_x's layout, `dtype`, contiguous)."""
        import torch

        self._no_receive_pending()
        m = self.m
        out = torch.empty(t, m.hidden, dtype=m.dtype, device=y.device)
        args = (y, layout.slot, layout.weight, self.src_counts, self.own_ids, self.back, self.combine_calls, out, t,
                m.rank, m.local_experts, m.max_tokens, m.hidden)
        self._run("moe_combine", llk.ll_combine, args, check, phase)
        return out

    def _run(self, name: str, kernel: Any, args: tuple[Any, ...], check: bool, phase: int, **meta: Any) -> None:
        """`kernel[(ctas,)](ctx, *args, deltas, status, ...)` in steps of BLOCK elements of a row,
        PHASE `phase` (0: all of it; dispatch 1 / 2: send / receive), its statuses checked as every
        ironlink call's; simulated, the plain Triton kernel without the library."""
        m = self.m
        block = min(llk.BLOCK, _pow2(m.hidden))
        meta = dict(WORLD=m.world, K=m.topk, KB=m.kb, BLOCK=block, num_warps=llk.WARPS, **meta)
        if self.sim_ctx is not None:
            kernel.fn[(self.ctas,)](self.sim_ctx.data_ptr(), *args, self.sim, self.sim_status, self.sim_status,
                                    PHASE=phase, SIM=True, **meta)
            return
        h, trace = self.heap, self.trace

        def call(status: Any) -> None:
            kernel[(self.ctas,)](h.ctx, *args, self.src_counts, status, status if trace is None else trace,
                                 PHASE=phase, SIM=False, TRACE=trace is not None, **meta)

        function = {0: "symm_tile_signal_others/symm_tile_wait_others", 1: "the send of a deferred dispatch",
                    2: "the wait for the senders' flags of a deferred dispatch"}[phase]
        launch_with_status(name, h, self.ctas, call, check, function=function)

    def bad_ids(self) -> int:
        """Expert ids outside [0, num_experts) in this rank's last dispatch (waits for the GPU);
        clears the count."""
        return take_count(self.bad)


__all__ = ["LowLatencyPath", "capacity"]
