"""MoE token dispatch and combine whose counts never leave the GPU (no host sync, CUDA-graph safe
when the routing changes between replays):

    moe = ironlink.MoeExchange(heap, max_tokens=4096, hidden=7168, topk=8, num_experts=64)
    recv_x, expert_counts, expert_offsets, handle = moe.dispatch(x, topk_idx, topk_weights)
    y = experts(recv_x, expert_counts, expert_offsets)       # grouped GEMM over local experts
    out = moe.combine(y, handle)                               # [T, H], weighted sum over top-k

Experts are split evenly: rank r holds experts r * E / world .. (r + 1) * E / world.

Each token crosses to each rank that holds one of its experts ONCE, however many of its top-k
experts live there (about half the rows of sending one per choice at top-8 of 64 on 4 ranks).
`recv_x` rows `expert_offsets[e] ..` are expert e's tokens, in (source rank, token) order
(low_latency: in arrival order), and combine returns, per token, its k outputs weighted by its
top-k weights: per rank that holds some of them, their weighted sum (fp32, choice order, rounded
to the payload dtype), then those per-rank sums added in rank order in fp32. Identical run to run
and on every path; the rounding of the per-rank sums is the one difference from summing all k
outputs in fp32 at once. Three paths (`choose_path` picks one; `path=` forces it):
- direct (a heap of one node; moe/direct.py): each token is staged once; after a barrier every
  rank reads the others' ids, sorts the (token, choice) pairs by local expert on the GPU and
  pulls each token row once through peer pointers straight into its expert-major rows; combine
  reduces each token's outputs on the expert's rank and stores the sum straight into the
  token's rank, which adds the per-rank rows. `sms` bounds the CTAs of these kernels.
- low_latency (a heap of one node, up to `MoeConfig.low_latency_max_tokens` tokens: decode;
  moe/low_latency.py): one kernel each for dispatch and combine, whose CTAs meet only the peers'
  same-index CTAs; recv_x by expert block (expert e's rows from e * world * max_tokens, in
  arrival order), so it holds num_experts * max_tokens rows.
- relay (a heap of several nodes, or `path="relay"`; moe/relay.py): dispatch packs per
  destination rank, sends with one `ironlink.all_to_all_v` (which crosses nodes) and the receiver
  copies each received token to its expert-major rows; combine reduces on the expert's rank,
  sends back with a second all_to_all_v and sums there.
`MoeExchange` is the front: it checks the arguments, picks the path, holds recv_x, the overflow
summary all paths write and the launch choices (`config`: `tuning.MoeConfig`), and hands
dispatch and combine to the path's object (`DirectPath`, `LowLatencyPath` or `RelayPath`), made
with that config, which allocates and frees that path's heap buffers.

Buffers are sized at construction: the heap holds the staged tokens and world * max_tokens
returning rows (relay: world * max_tokens token rows each way; a token reaches a rank at most
once, so nothing there can overflow; `MoeExchange.heap_bytes` says how many bytes of the heap
that takes) and `recv_x` holds `recv_capacity`
expert rows (default world * max_tokens * topk: every choice of every rank lands here). Routing
that gives this rank's experts more rows than that writes only the first `recv_capacity` rows and
flags it: `moe.check()` (or `dispatch(..., check=True)`) raises an IronlinkError with status
CAPACITY_EXCEEDED naming the expert whose rows cross the limit and the counts. One dispatch /
combine pair at a time per MoeExchange; `recv_x` is reused by the next dispatch. Its rows past
the counts are zeros until a dispatch has written there, then whatever it wrote (a grouped GEMM
may read them as padding; their outputs are never combined).

fp8 dispatch (`dispatch_dtype=torch.float8_e4m3fn`; hidden a multiple of 128): the sender
quantizes each token per 128 channels on its way into the send buffer (scale = amax / 448, one fp32
per group, packed beside the row after the ids and weights) and dispatch returns `recv_x` as the
pair (fp8 rows [recv_capacity, H], fp32 scales [recv_capacity, H / 128]) in the same layout, what
an fp8 grouped GEMM with 1x128 scales consumes. `fp8_quantize_reference` is the same quantization
in torch ops (bit for bit); combine still takes and returns `dtype` rows.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from ..language import _abi
from ..runtime.distributed import grid_cap
from ..runtime.errors import IronlinkError
from ..runtime.eager import routed
from ..runtime.handles import register
from . import kernels, sort
from ..runtime.tuning.moe import DEFAULT_MOE_CONFIG, MoeConfig
from .direct import DirectPath
from .handle import Handle
from .low_latency import LowLatencyPath, capacity as low_latency_capacity
from .layout import Layout, _RowLayout, _heap_bytes, _pow2, fp8_dequantize, fp8_quantize_reference
from .relay import RelayPath

PATHS = ("direct", "low_latency", "relay")


def _torch_library() -> Any:
    """dispatch / combine's torch.compile operators (imported only while Dynamo traces: torch)."""
    from . import torch_library

    return torch_library


def choose_path(max_tokens: int, fp8: bool, recv_capacity: Optional[int], multi_node: bool,
                config: MoeConfig) -> str:
    """The path a MoeExchange takes when not told: relay across nodes; on one node low_latency
    for up to `config.low_latency_max_tokens` tokens (any dispatch dtype, fp8 included; it sizes
    its own receive buffer, so not with a `recv_capacity`), else direct."""
    del fp8  # both dispatch dtypes are faster on the low-latency path (docs/moe.md)
    if multi_node:
        return "relay"
    small = max_tokens <= config.low_latency_max_tokens and recv_capacity is None
    return "low_latency" if small else "direct"


def _received() -> None:
    """The receive hook of a dispatch whose receive is already done (paths other than low_latency)."""


class MoeExchange:
    """Dispatch / combine buffers for one MoE layer shape on one heap (collective to create)."""

    def __init__(self, heap: Any, max_tokens: int, hidden: int, topk: int, num_experts: int,
                 dtype: Any = None, recv_capacity: Optional[int] = None, dispatch_dtype: Any = None,
                 sms: Optional[int] = None, path: Optional[str] = None, config: Optional[MoeConfig] = None) -> None:
        """`dtype` (bf16 default, or fp16): the tokens given to dispatch and the rows of combine.
        `dispatch_dtype`: `dtype` (default) or torch.float8_e4m3fn (see the module docs).
        `sms`: the SM budget (DeepEP's num_sms): the exchange kernels run that many CTAs and the
        row-moving local kernels `config.programs_per_sm` per SM of it, leaving the other SMs to a
        concurrent kernel; None or 0: every SM. The same on every rank.
        `path`: "direct" (one node: peer loads and stores, no extra passes), "low_latency" (one
        node: one kernel each for dispatch and combine, recv_x by expert block; moe/low_latency.py),
        "relay" (two all_to_all_v, the only one across nodes), None: `choose_path`. All give the
        same combined bits.
        `config`: the launch choices (`tuning.MoeConfig`: blocks, warps, grids, the
        low-latency token limit); None: `tuning.DEFAULT_MOE_CONFIG`. The same on every rank."""
        import torch

        world = heap.world_size
        if num_experts % world:
            raise ValueError(f"num_experts = {num_experts} must split evenly over {world} ranks")
        if min(max_tokens, hidden, topk) <= 0:
            raise ValueError(f"max_tokens, hidden and topk must be positive, got {max_tokens}, {hidden}, {topk}")
        if topk > num_experts:
            raise ValueError(f"topk = {topk} exceeds num_experts = {num_experts}")
        if config is not None and not isinstance(config, MoeConfig):
            raise TypeError(f"config must be a MoeConfig (ironlink.moe.MoeConfig), got {type(config).__name__}")
        self.config = config or DEFAULT_MOE_CONFIG
        self.dtype = dtype or torch.bfloat16
        if self.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"MoeExchange moves bf16 or fp16 rows, got {self.dtype}")
        self.dispatch_dtype = dispatch_dtype or self.dtype
        self.fp8 = self.dispatch_dtype == torch.float8_e4m3fn
        if self.dispatch_dtype not in (self.dtype, torch.float8_e4m3fn):
            raise TypeError(f"dispatch_dtype must be {self.dtype} (dtype) or torch.float8_e4m3fn, got {dispatch_dtype}")
        if self.fp8 and hidden % kernels.FP8_GROUP:
            raise ValueError(f"fp8 dispatch scales each token per {kernels.FP8_GROUP} channels: hidden = {hidden} "
                             f"must be a multiple of {kernels.FP8_GROUP}")
        if self.fp8 and min(self.config.row_block, self.config.low_latency_block) < kernels.FP8_GROUP:
            raise ValueError(f"fp8 dispatch quantizes whole {kernels.FP8_GROUP}-channel groups per block: "
                             f"config.row_block and config.low_latency_block must be at least {kernels.FP8_GROUP}")
        self.heap, self.world, self.rank = heap, world, heap.rank
        self.max_tokens, self.hidden, self.topk, self.num_experts = max_tokens, hidden, topk, num_experts
        self.local_experts = num_experts // world
        self.capacity = recv_capacity or world * max_tokens * topk
        if self.capacity <= 0:
            raise ValueError(f"recv_capacity must be positive, got {recv_capacity}")
        if sms is not None and sms < 0:
            raise ValueError(f"sms must be None, 0 (every SM) or positive, got {sms}")
        multi_node = bool(getattr(heap, "multi_node", False))
        if path not in (None, *PATHS):
            raise ValueError(f"path must be None, 'direct', 'low_latency' or 'relay', got {path!r}")
        if path in ("direct", "low_latency") and multi_node:
            raise ValueError(f"path={path!r} needs a heap of one node (peers on other nodes have no peer pointer); "
                             "this heap spans several: use path='relay' or None")
        if path == "low_latency" and recv_capacity is not None:
            raise ValueError("path='low_latency' lays recv_x out by expert block, num_experts * max_tokens rows "
                             "(its own capacity): no recv_capacity")
        self.path = path or choose_path(max_tokens, self.fp8, recv_capacity, multi_node, self.config)
        if self.path == "low_latency":
            self.capacity = low_latency_capacity(world, max_tokens, self.local_experts)
        layout = _RowLayout.of(hidden, topk, self.fp8)
        self.groups, self.meta_col, self.meta_cols, self.scale_col, self.row = layout
        dev = heap.device
        cuda = torch.device(dev).type == "cuda"
        device_sms = torch.cuda.get_device_properties(dev).multi_processor_count if cuda else 2
        self.sms = min(sms or device_sms, device_sms)
        # Launch sizes the paths share: the row kernels' grid (programs_per_sm per SM of the
        # budget), the counting sorts' programs, the top-k block.
        self.programs = self.config.programs_per_sm * self.sms
        self.sort_programs = self.config.sort_programs if cuda else 2
        self.kb = _pow2(topk)
        # Zeros, not empty: a grouped GEMM over padded expert tiles reads rows past the counts, and
        # those must be defined values (compute-sanitizer initcheck flagged them), once per layer.
        self.recv_x = torch.zeros(self.capacity, hidden, dtype=self.dispatch_dtype, device=dev)
        self.recv_scales = torch.zeros(self.capacity, self.groups, dtype=torch.float32, device=dev)
        # The layout's counting-sort summary (moe.sort.SUMMARY): whether recv_x overflowed (over,
        # the expert crossing the limit, its rows, all rows); every path writes it, `check` reads it.
        self.overflow = torch.zeros(len(sort.SUMMARY), dtype=torch.int64, device=dev)
        # The path's object, which allocates the path's heap buffers: the direct or low-latency
        # path where every peer's heap is mapped (one node), the relay path (two all_to_all_v,
        # which cross nodes) on a heap of several nodes. `simulated_peers`: tests.
        sim = getattr(heap, "simulated_peers", None)
        ctas = min(self.sms, grid_cap(dev)) if cuda else 2
        self.impl: Union[DirectPath, LowLatencyPath, RelayPath]
        try:
            if self.path == "direct":
                per_sm = self.config.ctas_per_sm if cuda and ctas == device_sms else 1  # every SM in the budget
                self.impl = DirectPath(self, heap, ctas, self.config, sim, per_sm)
            elif self.path == "low_latency":
                self.impl = LowLatencyPath(self, heap, ctas, self.config, sim)
            else:
                self.impl = RelayPath(self, heap, self.config, sms)
        except IronlinkError as e:  # the heap's out-of-memory: say what this exchange needs
            need = self.heap_bytes(world, max_tokens, hidden, topk, self.fp8, multi_node, self.path, recv_capacity,
                                   self.config)
            raise IronlinkError(f"MoeExchange ({self.path} path) needs {need} bytes of the symmetric heap "
                                f"(MoeExchange.heap_bytes with these arguments): {e}") from e
        self.op_handle = register(self)  # what torch.compile graphs carry instead (moe/torch_library.py)

    @property
    def direct(self) -> Optional[DirectPath]:
        """The direct path's object, where this exchange takes it (tests and bench/moe.py run its steps)."""
        return self.impl if isinstance(self.impl, DirectPath) else None

    @property
    def low_latency(self) -> Optional[LowLatencyPath]:
        """The low-latency path's object, where this exchange takes it."""
        return self.impl if isinstance(self.impl, LowLatencyPath) else None

    @property
    def relay(self) -> Optional[RelayPath]:
        """The relay path's object, where this exchange takes it."""
        return self.impl if isinstance(self.impl, RelayPath) else None

    def _inputs(self, x: Any, topk_idx: Any, topk_weights: Any) -> tuple[int, Any, Any, Any]:
        """(tokens, x, topk_idx, topk_weights contiguous), once their shapes and dtypes are checked."""
        import torch

        t = x.shape[0]
        if tuple(x.shape) != (t, self.hidden) or x.dtype != self.dtype:
            raise ValueError(f"x must be [tokens, {self.hidden}] {self.dtype}, got {tuple(x.shape)} {x.dtype}")
        if t > self.max_tokens:
            raise ValueError(f"{t} tokens: this MoeExchange holds at most {self.max_tokens}")
        for name, v in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
            if tuple(v.shape) != (t, self.topk):
                raise ValueError(f"{name} must be [{t}, {self.topk}], got {tuple(v.shape)}")
        if topk_idx.is_floating_point() or topk_idx.is_complex() or topk_idx.dtype == torch.bool:
            raise TypeError(f"topk_idx must hold integers, got {topk_idx.dtype}")
        if not topk_weights.is_floating_point():
            raise TypeError(f"topk_weights must be floating point, got {topk_weights.dtype}")
        return t, x.contiguous(), topk_idx.contiguous(), topk_weights.contiguous()

    @routed(_torch_library, enter=False)
    def dispatch(self, x: Any, topk_idx: Any, topk_weights: Any, check: bool = False,
                 return_recv_hook: bool = False) -> tuple[Any, ...]:
        """(recv_x, expert_counts [local experts], expert_offsets, handle); see the module docs.
        With an fp8 dispatch_dtype, recv_x is the pair (fp8 rows, fp32 scales [rows, hidden / 128]).
        `return_recv_hook`: a fifth value, `hook`. On the low-latency path the receive is then
        deferred: dispatch launches the send, and `hook()` launches the receive, after which (in
        stream order) recv_x, the counts and the offsets hold this dispatch's rows; the stream may
        run other work in between (an attention block) while the rows travel. Call it once, before
        the next dispatch or combine (RuntimeError otherwise); CUDA-graph capturable like the rest.
        On the other paths the receive is done when dispatch returns and `hook()` does nothing.
        `check=True` then checks after the receive. Not under torch.compile."""
        if return_recv_hook and self.low_latency is not None:
            t, x, topk_idx, topk_weights = self._inputs(x, topk_idx, topk_weights)
            lay, receive = self.low_latency.send(x, topk_idx, topk_weights, t, check)

            def hook() -> None:
                receive(check)
                if check:
                    self.check()

            done = self._dispatched(lay, Handle(t, None, lay.slot, lay.weight, lay.received), False)
            return (*done, hook)  # checked in hook(), after the receive
        done = self._dispatch(x, topk_idx, topk_weights, check)
        return (*done, _received) if return_recv_hook else done

    def _dispatch(self, x: Any, topk_idx: Any, topk_weights: Any, check: bool) -> tuple[Any, Any, Any, Handle]:
        """Dispatch, its receive included."""
        t, x, topk_idx, topk_weights = self._inputs(x, topk_idx, topk_weights)
        lay = self.impl.dispatch(x, topk_idx, topk_weights, t, check)
        return self._dispatched(lay, Handle(t, lay.send_row, lay.slot, lay.weight, lay.received), check)

    def _dispatched(self, lay: Layout, handle: Handle, check: bool) -> tuple[Any, Any, Any, Handle]:
        if check:
            self.check()
        recv = (self.recv_x, self.recv_scales) if self.fp8 else self.recv_x
        return recv, lay.counts, lay.offsets, handle

    def _stage(self, x: Any, topk_idx: Any, topk_weights: Any) -> int:
        """Direct path, dispatch step 1 alone (moe/direct.py): the tokens staged (for the
        benchmark's and the simulator's step-by-step runs)."""
        assert self.direct is not None
        t, x, topk_idx, topk_weights = self._inputs(x, topk_idx, topk_weights)
        self.direct.stage_tokens(x, topk_idx, topk_weights, t)
        return t

    @routed(_torch_library, enter=False)
    def combine(self, y: Any, handle: Handle, check: bool = False) -> Any:
        """[T, H]: each token's k expert outputs (rows of `y`, laid out as dispatch's recv_x)
        weighted by its top-k weights and summed; see the module docs."""
        if tuple(y.shape) != (self.capacity, self.hidden):
            raise ValueError(f"y must be [{self.capacity}, {self.hidden}] (dispatch's layout), got {tuple(y.shape)}")
        y = y.to(self.dtype).contiguous()
        if self.path != "relay" and handle.send_row is not None:
            raise ValueError(f"combine got a handle of the relay path; this MoeExchange takes the {self.path} path")
        if self.path == "relay" and handle.send_row is None:
            raise ValueError("combine got a handle of the direct path; this MoeExchange takes the relay path")
        lay = Layout(None, None, handle.slot, handle.weight, handle.received, handle.send_row)
        return self.impl.combine(y, lay, handle.tokens, check)

    @property
    def ctas(self) -> int:
        """The CTAs its widest exchange kernel launches (the direct path's pull_rows and
        reduce_push: two per SM when the budget is every SM; else one per SM of `sms`)."""
        return self.impl.grid()

    @staticmethod
    def heap_bytes(world: int, max_tokens: int, hidden: int, topk: int, fp8: bool = False,
                   multi_node: bool = False, path: Optional[str] = None, recv_capacity: Optional[int] = None,
                   config: Optional[MoeConfig] = None) -> int:
        """The heap bytes a MoeExchange of this shape allocates (`fp8`: an fp8 dispatch;
        `multi_node`: on a heap of several nodes; `path`, `recv_capacity`, `config` as given to it:
        they pick the path): a `SymmetricHeap` of at least this many bytes holds it. Needs the
        compiled extension."""
        from ..runtime.native import load_native

        chosen = path or choose_path(max_tokens, fp8, recv_capacity, multi_node, config or DEFAULT_MOE_CONFIG)
        return _heap_bytes(world, max_tokens, hidden, topk, fp8, load_native().ALLOC_ALIGN, path=chosen)

    def check(self) -> None:
        """Raises (and clears) a capacity overflow flagged by a dispatch on this rank; waits for
        the GPU. Also raises what the heap recorded (`heap.check()`)."""
        bad_ids = self.impl.bad_ids()
        if bad_ids:
            raise IronlinkError(
                f"MoeExchange.dispatch on rank {self.rank}: INVALID_ARGUMENT: topk_idx held {bad_ids} expert ids "
                f"outside [0, {self.num_experts}); those choices were not sent",
                status=_abi.STATUS["INVALID_ARGUMENT"], function="MoeExchange.dispatch")
        flag, expert, rows, total, _ = self.overflow.tolist()
        if flag and self.low_latency is not None:
            self.overflow.zero_()
            block = self.world * self.max_tokens
            raise IronlinkError(
                f"MoeExchange.dispatch on rank {self.rank}: CAPACITY_EXCEEDED: expert {expert} received {rows} rows "
                f"but its block of recv_x holds {block} (world * max_tokens: a token chose it more than once); "
                f"rows past the block were dropped",
                status=_abi.STATUS["CAPACITY_EXCEEDED"], function="MoeExchange.dispatch")
        if flag:
            self.overflow.zero_()
            raise IronlinkError(
                f"MoeExchange.dispatch on rank {self.rank}: CAPACITY_EXCEEDED: this rank's experts received "
                f"{total} rows but recv_x holds {self.capacity} (recv_capacity); expert {expert} "
                f"({rows} rows) crosses the limit and rows from there on were dropped",
                status=_abi.STATUS["CAPACITY_EXCEEDED"], function="MoeExchange.dispatch")
        self.heap.check()

    def close(self) -> None:
        """Frees the heap buffers (collective: same order on every rank)."""
        self.impl.free()


__all__ = ["Handle", "MoeExchange", "PATHS", "choose_path", "fp8_dequantize", "fp8_quantize_reference"]
