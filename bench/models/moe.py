"""A stack of expert-parallel MoE layers shaped like DeepSeek-V3's (bench/e2e_moe.py times it).

`--layers` (4) pre-norm MoE layers, hidden 7168, top-8 routing over 256 experts (`--experts 64`
the smaller model), SiLU-gated expert FFN 2048, RMSNorm eps 1e-6, bf16. Rank r holds experts
r * E / world .. (r + 1) * E / world; each expert's weights are drawn from its own seed, so the
model is the same at any world size. A layer: h = RMSNorm(x); each token's top-k experts and
weights; the tokens to their experts' ranks; gate/up, SiLU * up, down for each local expert as
grouped GEMMs (torch._grouped_mm over the rows grouped by expert); back, weighted; x += that.

A contender is a `Step` whose `moe` (the exchange there and back around the experts) is its own.
A step reads from the runner `b` it is built with: d, world, rank, layers, x0, res, and for
ironlink its exchange.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from moe_torch import weighted_sum  # bench/: the torch contenders' weighted sum, the same bits

try:  # the pure parts (dimensions) need neither torch nor a GPU (tests/cpu/test_e2e.py)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ironlink_bench import randn_bf16
except ImportError:
    torch = None

PRESETS: dict[str, dict[str, int]] = {
    "deepseek-v3-moe": dict(layers=4, hidden=7168, experts=256, topk=8, ffn=2048),
    "deepseek-v3-moe-64": dict(layers=4, hidden=7168, experts=64, topk=8, ffn=2048),
    "small-moe": dict(layers=2, hidden=1024, experts=16, topk=4, ffn=512),
}

class MoeDims(NamedTuple):
    model: str
    layers: int
    hidden: int
    experts: int
    topk: int
    ffn: int
    eps: float


def resolve(config: str, overrides: dict[str, Optional[int]], eps: float) -> MoeDims:
    """Preset `config` with the options given (None: the preset's), named after the preset it
    equals, else "custom"."""
    dims = {**PRESETS[config], **{k: v for k, v in overrides.items() if v is not None}}
    name = next((n for n, p in PRESETS.items() if p == dims), "custom")
    return MoeDims(model=name, eps=eps, **dims)


def dims_problem(d: MoeDims, world: int) -> Optional[str]:
    """Why `d` cannot be split over `world` ranks, or None."""
    if d.experts % world:
        return f"experts = {d.experts} is not divisible by {world}"
    if d.topk > d.experts:
        return f"topk = {d.topk} exceeds experts = {d.experts}"
    return None


class MoeLayer:
    """One layer's weights on this rank: its norm, and its local experts' gate/up [le, H, 2F] and
    down [le, F, H] (expert e's drawn from seed + e, the same at any world)."""

    def __init__(self, d: MoeDims, rank: int, world: int, seed: int) -> None:
        le = d.experts // world
        mine = range(rank * le, (rank + 1) * le)
        self.norm = 1 + 0.1 * randn_bf16((d.hidden,), seed)
        self.w13 = torch.stack([randn_bf16((d.hidden, 2 * d.ffn), seed + 2 * e + 1, d.hidden ** -0.5) for e in mine])
        self.w2 = torch.stack([randn_bf16((d.ffn, d.hidden), seed + 2 * e + 2, d.ffn ** -0.5) for e in mine])
        self.idx: Any = None  # this phase's routing: [tokens, topk] expert ids, [tokens, topk] weights,
        self.weights: Any = None
        self.recv_ends: Any = None  # and the groups of rows every rank's routing brings the local experts


def route_phase(layers: list[MoeLayer], d: MoeDims, tokens: int, seed: int, rank: int, world: int,
                device: str = "cuda") -> None:
    """Each layer's routing for a phase of `tokens` tokens a rank: this rank's `draw_routing`, and
    the ends of its experts' groups of the rows every rank's routing sends it (`received_ends`:
    every rank's routing redrawn here, no peer asked)."""
    every = [draw_routing(d, tokens, seed, r, device) for r in range(world)]
    for i, layer in enumerate(layers):
        layer.idx, layer.weights = every[rank][i]
        layer.recv_ends = received_ends([routing[i][0] for routing in every], rank, d.experts // world)


def draw_routing(d: MoeDims, tokens: int, seed: int, rank: int, device: str = "cuda") -> list[tuple[Any, Any]]:
    """Rank `rank`'s routing in each layer for a phase of `tokens` tokens a rank: [tokens, topk]
    expert ids (random scores' top-k) and their softmaxed random weights, drawn from a generator
    seeded by seed + 7 * rank, so any process can redraw any rank's."""
    g = torch.Generator(device=device).manual_seed(seed + 7 * rank)
    out = []
    for _ in range(d.layers):
        idx = torch.rand(tokens, d.experts, device=device, generator=g).topk(d.topk, dim=1).indices
        out.append((idx, torch.softmax(torch.randn(tokens, d.topk, device=device, generator=g), 1)))
    return out


def received_ends(idx_of_ranks: list[Any], rank: int, local_experts: int) -> Any:
    """The ends (int32, cumulative) of rank `rank`'s experts' groups of the rows that every rank's
    expert ids `idx_of_ranks` send it, packed by expert as MoeExchange's direct path lays them."""
    first = rank * local_experts
    counts = sum(torch.bincount(idx.reshape(-1), minlength=first + local_experts)[first:first + local_experts]
                 for idx in idx_of_ranks)
    return torch.cumsum(counts, 0).to(torch.int32)


def experts_ffn(rows: Any, ends: Any, layer: MoeLayer, ffn: int) -> Any:
    """The local experts on rows grouped by expert (group e ends at `ends[e]`, int32 on the GPU)."""
    gu = torch._grouped_mm(rows, layer.w13, offs=ends)
    return torch._grouped_mm(F.silu(gu[:, :ffn]) * gu[:, ffn:], layer.w2, offs=ends)


def stand_in_rows(x0: Any, topk: int, n: int) -> Any:
    """At least `n` rows made of this rank's tokens, each `topk` times (token-major), repeated as
    needed: what the floor's GEMMs run on in place of received rows (an exchange's copies are its
    own cost)."""
    mine = x0.repeat_interleave(topk, dim=0)
    return mine.repeat(-(-n // mine.shape[0]), 1)


def weighted_rows(weights: Any, y: Any) -> Any:
    """Each token's sum of its rows of `y` ([tokens * topk, H], token-major, choice order)
    weighted by `weights` ([tokens, topk]), as one batched GEMM: each row read once."""
    t, k = weights.shape
    return torch.bmm(weights.to(y.dtype)[:, None, :], y.view(t, k, -1)).view(t, -1)


class Step:
    """One step of the whole stack from `x0` to `final`; the contenders differ in `moe` alone."""

    def __init__(self, b: Any) -> None:
        self.b, self.d, self.layers = b, b.d, b.layers
        self.x0, self.res = b.x0, b.res
        self.final = torch.empty_like(b.x0)

    def __call__(self) -> Any:
        self.res.copy_(self.x0)
        for layer in self.layers:
            h = F.rms_norm(self.res, (self.d.hidden,), layer.norm, self.d.eps)
            self.res.add_(self.moe(layer, h))
        self.final.copy_(F.rms_norm(self.res, (self.d.hidden,), None, self.d.eps))
        return self.final

    def moe(self, layer: MoeLayer, h: Any) -> Any:
        raise NotImplementedError


def all_to_all(out: Any, inp: Any, out_splits: Optional[list[int]] = None, in_splits: Optional[list[int]] = None) -> None:
    """dist.all_to_all_single; through host copies on a gloo group (ranks sharing a GPU), whose
    all-to-all takes CPU tensors only."""
    if dist.get_backend() == "nccl":
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        return
    host = out.cpu()
    dist.all_to_all_single(host, inp.cpu(), out_splits, in_splits)
    out.copy_(host)


class TorchStep(Step):
    def moe(self, layer: MoeLayer, h: Any) -> Any:
        world, rank, k, le = self.b.world, self.b.rank, self.d.topk, self.d.experts // self.b.world
        experts = layer.idx.reshape(-1)
        order = torch.argsort(experts, stable=True)  # by expert, so by destination rank
        counts = torch.bincount(experts // le, minlength=world)
        recv_counts = torch.empty_like(counts)
        all_to_all(recv_counts, counts)
        sc, rc = counts.tolist(), recv_counts.tolist()  # the host sync
        recv = h.new_empty(sum(rc), h.shape[1])
        all_to_all(recv, h[order // k], rc, sc)
        recv_e = experts.new_empty(sum(rc))
        all_to_all(recv_e, experts[order], rc, sc)
        local = recv_e - rank * le
        perm = torch.argsort(local, stable=True)
        ends = torch.cumsum(torch.bincount(local, minlength=le), 0).to(torch.int32)
        y = experts_ffn(recv[perm], ends, layer, self.d.ffn)
        out_rows = torch.empty_like(y)
        out_rows[perm] = y
        back = h.new_empty(len(order), h.shape[1])
        all_to_all(back, out_rows, sc, rc)
        rows = torch.empty_like(back)
        rows[order] = back
        return weighted_sum(rows, layer.weights)


class IronlinkStep(Step):
    def moe(self, layer: MoeLayer, h: Any) -> Any:
        # h is not a heap tensor: dispatch copies it into its stage first (the torch path sends h)
        recv_x, counts, offsets, handle = self.b.exchange.dispatch(h, layer.idx, layer.weights)
        ends = (offsets + counts).to(torch.int32)
        return self.b.exchange.combine(experts_ffn(recv_x, ends, layer, self.d.ffn), handle)


class ExchangeOnlyStep(Step):
    """ironlink's step without its experts: dispatch, then combine of the received rows as they
    came (an identity expert). With ExpertsOnlyStep, what the ironlink step's time splits into."""

    def moe(self, layer: MoeLayer, h: Any) -> Any:
        recv_x, _, _, handle = self.b.exchange.dispatch(h, layer.idx, layer.weights)
        return self.b.exchange.combine(recv_x, handle)


class ReceivedExpertsStep(Step):
    """ironlink's step without its exchange: each layer's experts on the rows its dispatch
    received, laid out as it lays them (dispatched once, ahead, and kept), and nothing else. With
    ExpertsOnlyStep (the same GEMMs on evenly spread rows), what the received layout costs."""

    def __init__(self, b: Any) -> None:
        super().__init__(b)
        self.received: list[tuple[Any, Any]] = []
        for layer in self.layers:
            recv_x, counts, offsets, handle = b.exchange.dispatch(b.x0, layer.idx, layer.weights)
            self.received.append((recv_x.clone(), (offsets + counts).to(torch.int32)))
            b.exchange.combine(recv_x, handle)  # one dispatch and combine pair at a time

    def moe(self, layer: MoeLayer, h: Any) -> Any:
        rows, ends = self.received[self.layers.index(layer)]
        return experts_ffn(rows, ends, layer, self.d.ffn)[: h.shape[0]]  # the rows' cost; the values are not a layer's


class ExpertsOnlyStep(Step):
    """What every contender's step computes, without an exchange: each layer's norm, the local
    experts on the groups of rows routing brings this rank (`layer.recv_ends`), the weighted sum,
    the residual. The floor of a step at this world: a contender's time above it is its exchange
    (with, for torch_a2a, the sorts and the host read around it). The received rows are there
    before the step (this rank's input, repeated: an exchange's copies are its own cost), grouped
    as the routing groups them: their sizes vary around the mean and the grouped GEMMs' time with
    them (bench/probes/moe_step_floor.py's `experts_even_ms`). The weighted sum here is one
    batched GEMM (each row read once), not the torch contenders' `weighted_sum` (the rows in fp32,
    written twice) nor ironlink's (inside its combine)."""

    def __init__(self, b: Any) -> None:
        super().__init__(b)
        sent = b.x0.shape[0] * self.d.topk
        # a layer's experts take max(received, sent) rows: the weighted sum reads the sent ones back
        self.rows_of = [max(int(layer.recv_ends[-1]), sent) for layer in self.layers]
        self.rows = stand_in_rows(b.x0, self.d.topk, max(self.rows_of))

    def moe(self, layer: MoeLayer, h: Any) -> Any:
        rows = self.rows[: self.rows_of[self.layers.index(layer)]]
        y = experts_ffn(rows, layer.recv_ends, layer, self.d.ffn)[: layer.weights.numel()]
        return weighted_rows(layer.weights, y)
