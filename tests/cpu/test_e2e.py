"""bench/e2e.py's pure helpers without torch or a GPU: the configurations, the phases, what each
ironlink composition runs at the Llama 3 70B shapes (and the fallback where a fused op refuses a
shape), the heap it sizes and the check's rule."""

from __future__ import annotations

import math
from typing import Any

import pytest

from _bench_scripts import load_bench  # tests/, the helpers' folder

SMALL_FLAGS = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "head_dim": None, "ffn": 2048,
               "context": 128, "prefill": 128}  # the brief's correctness configuration, as flags


def load() -> Any:
    return load_bench("e2e")


def test_configurations() -> None:
    m = load()
    d = m.resolve_dims("llama3-70b-dense", {}, 1e-5)
    assert (d.model, d.layers, d.hidden, d.heads, d.kv_heads, d.head_dim, d.ffn) == \
        ("llama3-70b-dense", 8, 8192, 64, 8, 128, 28672)
    assert (d.context, d.prefill, d.eps) == (2048, 2048, 1e-5)
    # The small configuration by name or by its flags over the 70B preset: the same, named "small".
    assert m.resolve_dims("llama3-70b-dense", SMALL_FLAGS, 1e-5) == m.resolve_dims("small", {}, 1e-5)
    assert m.resolve_dims("small", {}, 1e-5).model == "small"
    custom = m.resolve_dims("llama3-70b-dense", {"layers": 2}, 1e-5)
    assert (custom.model, custom.layers, custom.hidden) == ("custom", 2, 8192)
    assert m.resolve_dims("small", {"hidden": 2048}, 1e-5).head_dim == 256  # hidden / heads unless given
    assert m.resolve_dims("small", {"head_dim": 64}, 1e-5).head_dim == 64


@pytest.mark.parametrize("world", [2, 4, 8])
def test_dims_split_over_the_world(world: int) -> None:
    m = load()
    assert m.dims_problem(m.resolve_dims("llama3-70b-dense", {}, 1e-5), world) is None
    assert m.dims_problem(m.resolve_dims("small", {}, 1e-5), world) is None


def test_dims_problems() -> None:
    m = load()
    d = m.resolve_dims("llama3-70b-dense", {}, 1e-5)
    assert "heads = 64" in m.dims_problem(d, 3)
    assert "kv_heads = 8" in m.dims_problem(d, 16)
    assert "not divisible by 3" in m.dims_problem(d._replace(kv_heads=3), 1)  # GQA groups


def test_phases_and_calls_per_graph() -> None:
    m = load()
    d = m.resolve_dims("llama3-70b-dense", {}, 1e-5)
    plan = m.phases(["decode", "prefill"], [1, 8, 32], d, 1)
    assert [(p.phase, p.batch, p.context, p.new, p.tokens) for p in plan] == [
        ("decode", 1, 2048, 1, 1), ("decode", 8, 2048, 1, 8), ("decode", 32, 2048, 1, 32),
        ("prefill", 1, 0, 2048, 2048)]
    assert m.phases(["prefill"], [1], d, 2)[0].tokens == 4096
    assert m.phases(["decode"], [4], d, 1) == [m.Phase("decode", 4, 2048, 1)]
    # GraphRound's calls per graph go by bytes (20 up to 16 MiB, else 5): a decode step's all-reduces
    # at batch 32 take 8 MiB, the prefill's 512 MiB.
    assert m.step_bytes(d, 32) == 8 << 20
    assert m.step_bytes(d, 2048) == 512 << 20


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("tokens", [1, 8, 32, 2048])
def test_ironlink_compositions_at_70b(world: int, tokens: int) -> None:
    m = load()
    from ironlink.fused.all_reduce_rmsnorm import MODES
    from ironlink.fused.matmul_all_reduce import METHODS

    for k in (8192 // world, 28672 // world):  # o_proj, down_proj
        kind, label = m.ironlink_op("norm", tokens, k, 8192, world, 132)
        assert kind == "norm" and label.startswith("torch.mm + ironlink.all_reduce_rmsnorm[")
        assert label[label.index("[") + 1:label.index("]")] in MODES
        kind, label = m.ironlink_op("mm", tokens, k, 8192, world, 132)
        assert kind == "mm" and label.startswith("ironlink.matmul_all_reduce[")
        assert label[label.index("[") + 1:label.index("]")] in METHODS


def test_fallback_where_a_fused_op_refuses() -> None:
    m = load()
    kind, label = m.ironlink_op("norm", 8, 512, 20000, 2, 132)  # hidden beyond all_reduce_rmsnorm's 16384
    assert kind == "all_reduce" and "ironlink.all_reduce" in label and "16384" in label


@pytest.mark.parametrize("world", [2, 4])
def test_heap_holds_the_ops_workspaces(world: int) -> None:
    m = load()
    from ironlink.fused.all_reduce_rmsnorm import heap_bytes as rmsnorm_bytes
    from ironlink.fused.matmul_all_reduce import heap_bytes as mm_bytes

    d = m.resolve_dims("llama3-70b-dense", {}, 1e-5)
    act = 2048 * 8192 * 2
    size = m.heap_size(d, 2048, world, 132)
    need = 2 * act + rmsnorm_bytes(2048, 8192, world, sms=132) + mm_bytes(2048, 8192, 28672 // world, world, sms=132)
    assert need + m.SLACK_BYTES < size < 4 << 30
    assert m.heap_size(m.resolve_dims("small", {}, 1e-5), 128, world, 132) < size


def test_check_rule() -> None:
    m = load()
    assert m.within(0.0, 3e-2) and m.within(3e-2, 3e-2)
    assert not m.within(3.1e-2, 3e-2)
    assert not m.within(math.nan, 3e-2)


def test_moe_stack_configurations_split_and_capacity() -> None:
    # bench/e2e_moe.py (issue 63 item 2): DeepSeek-V3's MoE shape, its split over ranks and the
    # rows MoeExchange keeps for a rank's experts.
    m = load_bench("e2e_moe")
    d = m.resolve("deepseek-v3-moe", {}, 1e-6)
    assert (d.model, d.layers, d.hidden, d.experts, d.topk, d.ffn) == ("deepseek-v3-moe", 4, 7168, 256, 8, 2048)
    assert m.resolve("deepseek-v3-moe", {"experts": 64}, 1e-6).model == "deepseek-v3-moe-64"
    assert m.resolve("small-moe", {"layers": 3}, 1e-6).model == "custom"
    for world in (2, 4, 8):
        assert m.dims_problem(d, world) is None
    assert "not divisible by 3" in m.dims_problem(d, 3)
    assert "exceeds" in m.dims_problem(m.resolve("small-moe", {"topk": 17}, 1e-6), 2)
    # 1.25 x the tokens x topk uniform routing brings (rounded up), never more than every choice of
    # every rank.
    assert m.recv_capacity(4096, 8, 4) == 40960
    assert m.recv_capacity(13, 3, 4) == 49  # 48.75 up
    assert m.recv_capacity(128, 8, 1) == 128 * 8
