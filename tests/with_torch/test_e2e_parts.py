"""The step parts the end-to-end benchmarks time beside their contenders run on the CPU:
bench/e2e_moe.py's (`models.moe`: ExpertsOnlyStep, ExchangeOnlyStep, ReceivedExpertsStep, with a
stand-in exchange: shapes, the experts' group ends, one dispatch and combine pair at a time) and
bench/e2e.py's floor (`models.dense.ComputeOnlyStep`: the step without all-reduces). The GPU runs
time them; this catches a part that would stop a timed run before its first row."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import models.dense as dense  # noqa: E402
import models.moe as moe  # noqa: E402


class StandInExchange:
    """MoeExchange's direct-path interface at world 1: every choice a row of recv_x, grouped by
    expert (rows past the last group unused, as its receive buffer's capacity); combine weights and
    sums each token's rows. Checks that dispatches and combines alternate."""

    def __init__(self, experts: int, capacity: int) -> None:
        self.experts, self.capacity, self.open = experts, capacity, False

    def dispatch(self, h: Any, idx: Any, weights: Any) -> tuple[Any, Any, Any, Any]:
        assert not self.open, "a dispatch before the last one's combine"
        self.open = True
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.experts)
        offsets = torch.cumsum(counts, 0) - counts
        recv = torch.zeros(self.capacity, h.shape[1], dtype=h.dtype)
        recv[: len(order)] = h[order // idx.shape[1]]
        return recv, counts, offsets, (order, weights)

    def combine(self, y: Any, handle: Any) -> Any:
        assert self.open and y.shape[0] == self.capacity
        self.open = False
        order, weights = handle
        t, k = weights.shape
        rows = torch.empty(t * k, y.shape[1], dtype=y.dtype)
        rows[order] = y[: t * k]
        return moe.weighted_sum(rows, weights)


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Any:
    def randn_bf16(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> Any:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    monkeypatch.setattr(moe, "randn_bf16", randn_bf16)
    d = moe.MoeDims(model="tiny", layers=2, hidden=16, experts=4, topk=2, ffn=8, eps=1e-6)
    tokens = 6
    layers = [moe.MoeLayer(d, 0, 1, 100 * (i + 1)) for i in range(d.layers)]
    moe.route_phase(layers, d, tokens, 0, 0, 1, device="cpu")
    x0 = randn_bf16((tokens, d.hidden), 1)
    return SimpleNamespace(d=d, world=1, rank=0, layers=layers, x0=x0, res=torch.empty_like(x0),
                           exchange=StandInExchange(d.experts, 2 * tokens * d.topk))


def test_each_part_runs_a_whole_step_of_the_models_shape(runner: Any) -> None:
    for part in (moe.ExpertsOnlyStep, moe.ExchangeOnlyStep, moe.ReceivedExpertsStep):
        step = part(runner)
        out = step()
        assert out.shape == runner.x0.shape and out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
        assert not runner.exchange.open


def test_the_floor_takes_the_groups_the_routing_brings_and_sums_them_as_the_contenders_do(runner: Any) -> None:
    step = moe.ExpertsOnlyStep(runner)
    layer, h, k = runner.layers[0], runner.x0, runner.d.topk
    ends = torch.cumsum(torch.bincount(layer.idx.reshape(-1), minlength=4), 0)
    assert layer.recv_ends.dtype == torch.int32 and layer.recv_ends.tolist() == ends.tolist()
    assert step.rows_of == [h.shape[0] * k] * runner.d.layers  # world 1: every row its own
    y = moe.experts_ffn(h.repeat_interleave(k, dim=0), layer.recv_ends, layer, runner.d.ffn)
    want = moe.weighted_sum(y, layer.weights).float()
    assert torch.allclose(step.moe(layer, h).float(), want, rtol=2e-2, atol=2e-2)


def test_every_rank_redraws_the_same_routing_and_receives_each_choice_once() -> None:
    d = moe.MoeDims(model="tiny", layers=2, hidden=16, experts=8, topk=2, ffn=8, eps=1e-6)
    world, tokens = 4, 5
    layers = [[SimpleNamespace() for _ in range(d.layers)] for _ in range(world)]  # route_phase sets their routing
    for r in range(world):
        moe.route_phase(layers[r], d, tokens, 3, r, world, device="cpu")
    for i in range(d.layers):
        every = torch.cat([layers[r][i].idx for r in range(world)]).reshape(-1)
        for r in range(world):
            local = every[(every >= 2 * r) & (every < 2 * r + 2)] - 2 * r
            assert layers[r][i].recv_ends.tolist() == torch.cumsum(torch.bincount(local, minlength=2), 0).tolist()
        assert sum(int(layers[r][i].recv_ends[-1]) for r in range(world)) == world * tokens * d.topk


def test_the_received_rows_part_keeps_each_layers_own_dispatch(runner: Any) -> None:
    step = moe.ReceivedExpertsStep(runner)
    assert len(step.received) == runner.d.layers
    for layer, (rows, ends) in zip(runner.layers, step.received):
        assert rows.shape == (runner.exchange.capacity, runner.d.hidden) and ends.dtype == torch.int32
        assert ends.tolist() == torch.cumsum(torch.bincount(layer.idx.reshape(-1), minlength=4), 0).tolist()


def test_the_dense_floor_is_the_step_with_its_all_reduces_taken_out(monkeypatch: pytest.MonkeyPatch) -> None:
    def randn_bf16(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> Any:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    monkeypatch.setattr(dense, "randn_bf16", randn_bf16)
    d = dense.resolve_dims("small", {"layers": 1}, 1e-5)
    ph = dense.Phase("decode", 2, 8, 1)
    layers = [dense.Layer(d, 0, 1, 1000)]
    for layer in layers:
        full = (ph.batch, d.kv_heads, ph.context + ph.new, d.head_dim)
        layer.k_cache, layer.v_cache = randn_bf16(full, 1), randn_bf16(full, 2)
    x0 = randn_bf16((ph.tokens, d.hidden), 3)
    b = SimpleNamespace(d=d, world=1, layers=layers, final_norm=1 + 0.1 * randn_bf16((d.hidden,), 4), gqa=True,
                        x0=x0, res=torch.empty_like(x0))
    got = dense.ComputeOnlyStep(b, ph)().clone()
    # The nccl contender at world 1, where its all-reduces change nothing: the same bits.
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        want = dense.NcclStep(b, ph)()
    finally:
        dist.destroy_process_group()
    assert torch.equal(got, want)
    assert not torch.equal(got, dense.ComputeOnlyStep(SimpleNamespace(**{**vars(b), "x0": x0 + 1}), ph)())

