"""A tensor-parallel decoder stack shaped like Llama 3 70B (bench/e2e.py times it).

`--layers` (8) pre-norm layers, hidden 8192, 64 query / 8 KV heads of 128, SiLU-gated FFN 28672,
RMSNorm eps 1e-5, bf16; column-parallel QKV and gate/up (heads / world query heads, kv_heads /
world KV heads, ffn / world columns a rank), row-parallel output and down projections, each
followed by the all-reduce of [tokens, hidden], the residual add and the next RMSNorm (the next
layer's input norm; after the last layer the final norm). Attention:
F.scaled_dot_product_attention over a KV cache preallocated at context + new tokens; no RoPE (no
communication in it, the same cost for every contender). Each full weight is drawn from one seed
on every rank, each rank keeps its shard: the same model at any world size.

A contender is a `Step` whose `reduce` (a row-parallel projection, its all-reduce, the add and the
next norm) is its own; the rest of the step is shared. A step reads from the runner `b` it is
built with: d, world, layers, final_norm, gqa, x0, res, and per contender group or heap and bufs.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

try:  # the pure parts (dimensions, phases) need neither torch nor a GPU (tests/cpu/test_e2e.py)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import ironlink
    from ironlink_bench import randn_bf16
except ImportError:
    torch = None

PRESETS: dict[str, dict[str, int]] = {
    "llama3-70b-dense": dict(layers=8, hidden=8192, heads=64, kv_heads=8, ffn=28672, context=2048, prefill=2048),
    "small": dict(layers=2, hidden=1024, heads=8, kv_heads=8, ffn=2048, context=128, prefill=128),
}

FLOOR = "compute_only"  # the row of ComputeOnlyStep (bench/e2e.py times it beside the contenders)
SYMM_ONE_SHOT_MAX_BYTES = 64 << 10  # symm_mem's one-shot up to here, else two-shot (allreduce-*xNVIDIA-H200 runs)


class Dims(NamedTuple):
    model: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    context: int
    prefill: int
    eps: float


class Phase(NamedTuple):
    phase: str  # "decode" or "prefill"
    batch: int
    context: int  # tokens in the cache before the step
    new: int  # tokens per sequence in the step

    @property
    def tokens(self) -> int:
        return self.batch * self.new


def resolve_dims(config: str, overrides: dict[str, Optional[int]], eps: float) -> Dims:
    """Preset `config` with the options given (None: the preset's; head_dim: hidden / heads), named
    after the preset it equals, else "custom"."""
    def full(d: dict[str, int]) -> dict[str, int]:
        return {**d, "head_dim": d.get("head_dim") or d["hidden"] // d["heads"]}

    dims = full({**PRESETS[config], **{k: v for k, v in overrides.items() if v is not None}})
    name = next((n for n, p in PRESETS.items() if full(p) == dims), "custom")
    return Dims(model=name, eps=eps, **dims)


def dims_problem(d: Dims, world: int) -> Optional[str]:
    """Why `d` cannot be split over `world` ranks, or None."""
    for what, n, by in (("heads", d.heads, d.kv_heads), ("heads", d.heads, world), ("kv_heads", d.kv_heads, world),
                        ("ffn", d.ffn, world)):
        if n % by:
            return f"{what} = {n} is not divisible by {by}"
    return None


def phases(names: list[str], batches: list[int], d: Dims, prefill_batch: int) -> list[Phase]:
    out = [Phase("decode", b, d.context, 1) for b in batches] if "decode" in names else []
    return out + ([Phase("prefill", prefill_batch, 0, d.prefill)] if "prefill" in names else [])


ModuleBase: Any = torch.nn.Module if torch is not None else object


def shard(shape: tuple[int, ...], dim: int, seed: int, rank: int, world: int) -> Any:
    """This rank's part along `dim` of a full [in, out] weight drawn from `seed` (the same on
    every rank), scaled by 1 / sqrt(in)."""
    return randn_bf16(shape, seed, shape[0] ** -0.5).chunk(world, dim)[rank].contiguous()


class Layer(ModuleBase):
    def __init__(self, d: Dims, rank: int, world: int, seed: int) -> None:
        super().__init__()
        h, hd = d.hidden, d.head_dim

        def part(j: int, shape: tuple[int, int], dim: int) -> Any:
            return shard(shape, dim, seed + j, rank, world)

        self.wqkv = torch.cat([part(0, (h, d.heads * hd), 1), part(1, (h, d.kv_heads * hd), 1),
                               part(2, (h, d.kv_heads * hd), 1)], 1)
        self.wo = part(3, (d.heads * hd, h), 0)
        self.wgu = torch.cat([part(4, (h, d.ffn), 1), part(5, (h, d.ffn), 1)], 1)  # [gate | up] of this rank
        self.wd = part(6, (d.ffn, h), 0)
        self.attn_norm, self.mlp_norm = (1 + 0.1 * randn_bf16((h,), seed + j) for j in (7, 8))
        self.k_cache: Any = None  # [batch, kv heads of this rank, context + new, head_dim], set by phase
        self.v_cache: Any = None


class Step(ModuleBase):
    """One step of the whole stack for one phase, from the input `x0` to `final`; the contenders
    differ in `reduce` alone (a row-parallel projection, its all-reduce, the add and next norm)."""

    def __init__(self, b: Any, ph: Phase) -> None:
        super().__init__()
        d = b.d
        self.layers, self.final_norm = b.layers, b.final_norm
        self.hidden, self.eps, self.head_dim = d.hidden, d.eps, d.head_dim
        self.hq, self.hkv = d.heads // b.world, d.kv_heads // b.world
        self.batch, self.context, self.new, self.gqa = ph.batch, ph.context, ph.new, b.gqa
        self.x0, self.res = b.x0, b.res  # res: the residual stream, restarted from x0 by every step
        self.final = torch.empty_like(b.x0)

    def forward(self) -> Any:
        self.res.copy_(self.x0)
        h = self.norm(self.layers[0].attn_norm)
        for i, layer in enumerate(self.layers):
            after = self.layers[i + 1].attn_norm if i + 1 < len(self.layers) else self.final_norm
            h = self.reduce(self.attention(layer, h @ layer.wqkv), layer.wo, layer.mlp_norm, 0)
            gate, up = (h @ layer.wgu).chunk(2, dim=1)
            h = self.reduce(F.silu(gate) * up, layer.wd, after, 1)
        self.final.copy_(h)
        return self.final

    def norm(self, weight: Any) -> Any:
        return F.rms_norm(self.res, (self.hidden,), weight, self.eps)

    def attention(self, layer: Any, qkv: Any) -> Any:
        b, c, n, hd, hq, hkv = self.batch, self.context, self.new, self.head_dim, self.hq, self.hkv
        q, k, v = qkv[:, :hq * hd], qkv[:, hq * hd:(hq + hkv) * hd], qkv[:, (hq + hkv) * hd:]
        if n == 1:  # decode: the query heads of a KV head as its query rows (exact for one token, no mask, no KV copy)
            layer.k_cache[:, :, c].copy_(k.view(b, hkv, hd))
            layer.v_cache[:, :, c].copy_(v.view(b, hkv, hd))
            o = F.scaled_dot_product_attention(q.view(b, hkv, hq // hkv, hd), layer.k_cache[:, :, :c + 1],
                                               layer.v_cache[:, :, :c + 1])
            return o.reshape(b, hq * hd)
        layer.k_cache[:, :, c:c + n].copy_(k.view(b, n, hkv, hd).transpose(1, 2))  # prefill: c = 0
        layer.v_cache[:, :, c:c + n].copy_(v.view(b, n, hkv, hd).transpose(1, 2))
        kc, vc = layer.k_cache[:, :, :c + n], layer.v_cache[:, :, :c + n]
        qt = q.view(b, n, hq, hd).transpose(1, 2)
        if self.gqa:
            o = F.scaled_dot_product_attention(qt, kc, vc, is_causal=True, enable_gqa=True)
        else:  # a torch without enable_gqa: the KV heads repeated for their query heads
            rep = hq // hkv
            o = F.scaled_dot_product_attention(qt, kc.repeat_interleave(rep, 1), vc.repeat_interleave(rep, 1),
                                               is_causal=True)
        return o.transpose(1, 2).reshape(b * n, hq * hd)

    def reduce(self, a: Any, w: Any, norm_weight: Any, which: int) -> Any:
        raise NotImplementedError


class NcclStep(Step):
    def reduce(self, a: Any, w: Any, norm_weight: Any, which: int) -> Any:
        p = a @ w
        dist.all_reduce(p)
        self.res.add_(p)
        return self.norm(norm_weight)


class ComputeOnlyStep(Step):
    """Every contender's step without its all-reduces (each projection's product added to the
    residual as it is, then the next norm): the floor of a step at this world. A contender's time
    above it is what its all-reduces cost; the step can be at most (nccl - floor) / (ironlink -
    floor) faster through them."""

    def reduce(self, a: Any, w: Any, norm_weight: Any, which: int) -> Any:
        self.res.add_(a @ w)
        return self.norm(norm_weight)


class SymmStep(Step):
    def __init__(self, b: Any, ph: Phase, bufs: tuple[Any, Any]) -> None:
        super().__init__(b, ph)
        self.bufs, self.group = bufs, b.group  # one buffer for each projection: the next overwrite waits a collective
        self.one_shot = ph.tokens * self.hidden * 2 <= SYMM_ONE_SHOT_MAX_BYTES

    def reduce(self, a: Any, w: Any, norm_weight: Any, which: int) -> Any:
        buf = self.bufs[which]
        torch.mm(a, w, out=buf)
        if self.one_shot:
            self.res.add_(torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", self.group))
        else:
            torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", self.group)
            self.res.add_(buf)
        return self.norm(norm_weight)


class IronlinkStep(Step):
    def __init__(self, b: Any, ph: Phase, kinds: tuple[str, ...]) -> None:
        super().__init__(b, ph)
        self.heap, self.bufs, self.kinds = b.heap, b.bufs, kinds  # heap tensors: attributes (docs/python.md)

    def reduce(self, a: Any, w: Any, norm_weight: Any, which: int) -> Any:
        x, kind = self.bufs[which], self.kinds[which]
        if kind == "mm":
            ironlink.matmul_all_reduce(a, w, out=x, heap=self.heap)
        else:
            torch.mm(a, w, out=x)
            if kind == "norm":
                return ironlink.all_reduce_rmsnorm(x, self.res, norm_weight, self.eps, heap=self.heap)[0]
            ironlink.all_reduce(x, heap=self.heap)
        self.res.add_(x)
        return self.norm(norm_weight)


def sdpa_takes_gqa() -> bool:
    q, kv = (torch.zeros(1, h, 4, 64, device="cuda", dtype=torch.bfloat16) for h in (2, 1))
    try:
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False
