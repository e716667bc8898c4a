"""The fused ops' argument checks and launch choices (ironlink.fused.*.plan), without torch or a GPU."""

from __future__ import annotations

import importlib

import pytest
import triton

import ironlink
from ironlink.language import _abi
from ironlink.runtime import tuning
from ironlink.runtime.tuning import decode_table

from ironlink.fused import copy_engine
from ironlink.fused import gemm_operands
from ironlink.fused import cublas_methods
from ironlink.fused.diagnostics import NO_DIAGNOSTICS, Diagnostics
from ironlink.runtime.tensor_spec import TensorSpec

from _fake_torch import install_fake_torch  # tests/, beside this folder

# The fused host modules named after their ops (the package's attributes of those names are the ops).
arn = importlib.import_module("ironlink.fused.all_reduce_rmsnorm")
agm = importlib.import_module("ironlink.fused.all_gather_matmul")
mar = importlib.import_module("ironlink.fused.matmul_all_reduce")
mrs = importlib.import_module("ironlink.fused.matmul_reduce_scatter")

DEV = "cuda:0"


def spec(name: str, shape: tuple[int, ...], dtype: str = "bfloat16", ptr: int = 0, contiguous: bool = True) -> TensorSpec:
    size = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "float8_e4m3fn": 1}[dtype]
    return TensorSpec(name, shape, dtype, size, contiguous, DEV, ptr)


def rms_specs(tokens: int, hidden: int = 8192) -> tuple[TensorSpec, TensorSpec, TensorSpec, TensorSpec]:
    """all_reduce_rmsnorm's x, residual, weight and out for `tokens` rows of `hidden` (bf16, apart)."""
    return (spec("x", (tokens, hidden), ptr=1 << 20), spec("residual", (tokens, hidden), ptr=2 << 30),
            spec("weight", (hidden,), ptr=3 << 30), spec("out", (tokens, hidden), ptr=4 << 30))


def rms(tokens: int = 8, hidden: int = 8192, **kw: object) -> arn.Plan:
    args: dict[str, object] = dict(zip(("x", "residual", "weight", "out"), rms_specs(tokens, hidden)))
    args.update(kw)
    return arn.plan(args["x"], args["residual"], args["weight"], args["out"], DEV, 4, 132)  # type: ignore[arg-type]


def test_rmsnorm_fp8_out_needs_per_token_scales() -> None:
    x = spec("x", (8, 8192), ptr=1 << 20)
    res, w = spec("residual", (8, 8192), ptr=2 << 30), spec("weight", (8192,), ptr=3 << 30)
    out8 = spec("out", (8, 8192), "float8_e4m3fn", ptr=4 << 30)
    p = arn.plan(x, res, w, out8, DEV, 2, 132, scale=spec("scale", (8,), "float32", ptr=5 << 30))
    assert p.fp8 and not rms(8).fp8
    with pytest.raises(ValueError, match="an FP8 out needs scale= an fp32 \\[8\\] tensor"):
        arn.plan(x, res, w, out8, DEV, 2, 132)
    with pytest.raises(ValueError, match="FP8 out needs scale"):
        arn.plan(x, res, w, out8, DEV, 2, 132, scale=spec("scale", (8,), "bfloat16", ptr=5 << 30))


def test_rmsnorm_residual_out_is_checked() -> None:
    x = spec("x", (8, 8192), ptr=1 << 20)
    res, w, out = spec("residual", (8, 8192), ptr=2 << 30), spec("weight", (8192,), ptr=3 << 30), \
        spec("out", (8, 8192), ptr=4 << 30)
    assert not arn.plan(x, res, w, out, DEV, 2, 132, residual_out=spec("residual_out", (8, 8192), ptr=6 << 30)).fp8
    with pytest.raises(ValueError, match="residual_out must be like x"):
        arn.plan(x, res, w, out, DEV, 2, 132, residual_out=spec("residual_out", (8, 4096), ptr=6 << 30))
    with pytest.raises(ValueError, match="residual_out must not be x"):
        arn.plan(x, res, w, out, DEV, 2, 132, residual_out=spec("residual_out", (8, 8192), ptr=1 << 20))


def test_rmsnorm_modes_follow_the_tuning_threshold() -> None:
    one, some, many = rms(1), rms(1024), rms(2048)
    assert (one.mode, some.mode, many.mode) == ("split", "rows", "whole")
    assert some.ctas == 132 and some.block_h == 8192 and one.block_h == 1024  # split: a slice of 1024 a CTA
    two_shot = rms(300, 5000)  # 3 MB at world 4: the table's two_shot, a block of a rank's chunk of the row
    assert two_shot.mode == "two_shot" and two_shot.block_h == 2048 and two_shot.slice_cols == 1264
    assert rms(2048, 5000).block_h == 8192  # a whole row's: the next power of two


@pytest.mark.parametrize("tokens, hidden, world, mode, ctas", [
    # World 2's committed decode table (runtime/tuning/tables/decode-w2.json, the tuner's run on 2 H200s):
    # each row cut into slices of a CTA each ("split") up to 256 KiB, "lamport" up to 2 MiB,
    # "two_shot" up to 4 MiB, lamport again up to 8 MiB (the two within 0.4 us of each other
    # there), "push" up to 32 MiB, then "rows" (no workspace).
    (1, 8192, 2, "split", 8), (4, 8192, 2, "split", 32), (8, 8192, 2, "split", 64), (16, 8192, 2, "split", 128),
    (17, 8192, 2, "lamport", 17), (128, 8192, 2, "lamport", 128), (129, 8192, 2, "two_shot", 129),
    (256, 8192, 2, "two_shot", 132), (257, 8192, 2, "lamport", 132), (512, 8192, 2, "lamport", 132),
    (513, 8192, 2, "push", 132), (2048, 8192, 2, "push", 132), (2049, 8192, 2, "rows", 132),
    (8192, 8192, 2, "rows", 132),
    # Split where a row of hidden 16384 still cuts into resident slices, else the next entry's mode.
    (1, 16384, 2, "split", 8), (8, 16384, 2, "split", 64), (9, 16384, 2, "lamport", 9),
    (64, 16384, 2, "lamport", 64), (65, 16384, 2, "two_shot", 130),
    # World 4's (4 H200s): split up to 128 KiB, two_shot up to 8 MiB (few rows cut into slices of
    # a CTA each: 4 a row up to 33 rows), rows up to 16 MiB, whole past that. A row of 2048 bf16
    # cuts into two slices.
    (1, 8192, 4, "split", 8), (8, 8192, 4, "split", 64), (9, 8192, 4, "two_shot", 36),
    (16, 8192, 4, "two_shot", 64), (17, 8192, 4, "two_shot", 68),
    (32, 8192, 4, "two_shot", 128), (512, 8192, 4, "two_shot", 132), (513, 8192, 4, "rows", 132),
    (1024, 8192, 4, "rows", 132), (1025, 8192, 4, "whole", None), (4096, 8192, 4, "whole", None),
    (1, 2048, 4, "split", 2),
])
def test_rmsnorm_rows_over_the_ll_tile_all_reduce(tokens: int, hidden: int, world: int, mode: str,
                                                  ctas: int | None) -> None:
    shape = (tokens, hidden)
    p = arn.plan(spec("x", shape, ptr=1 << 20), spec("residual", shape, ptr=2 << 30),
                 spec("weight", (hidden,), ptr=3 << 30), spec("out", shape, ptr=4 << 30), DEV, world, 132)
    assert p.mode == mode
    if ctas is not None:
        assert p.ctas == ctas
    if mode in ("rows", "push"):  # several rows a CTA: RMSNORM_ROWS_AT_ONCE at a time, else one
        many = tuning.rmsnorm_rows_per_cta(tokens, p.ctas) >= tuning.RMSNORM_ROWS_AT_ONCE
        assert p.rows_at_once == (tuning.RMSNORM_ROWS_AT_ONCE if many else 1)
        assert p.rows_at_once == (1 if tokens <= 132 else tuning.RMSNORM_ROWS_AT_ONCE)
    if mode == "rows" and tokens <= 132:
        per = tuning.rmsnorm_rows_per_cta(tokens, p.ctas)
        takes = tuning.tile_all_reduce_takes_ll(p.ctas - 1, per, hidden * 2, world)
        assert takes == (hidden * 2 * per <= 16384 and (world == 2 or hidden <= 2048)), (per, takes)


@pytest.mark.parametrize("tokens, hidden, parts, cols, warps", [
    (1, 8192, 8, 1024, 8), (16, 8192, 8, 1024, 8), (17, 8192, 4, 2048, 16), (33, 8192, 4, 2048, 16),
    (34, 8192, 2, 4096, 16),
    (1, 2048, 2, 1024, 8), (1, 4000, 2, 2000, 16), (1, 3000, 2, 1504, 16),  # slices of whole 16-byte units
])
def test_rmsnorm_split_cuts_rows_into_resident_slices(tokens: int, hidden: int, parts: int, cols: int,
                                                      warps: int) -> None:
    shape = (tokens, hidden)
    p = arn.plan(spec("x", shape, ptr=1 << 20), spec("residual", shape, ptr=2 << 30),
                 spec("weight", (hidden,), ptr=3 << 30), spec("out", shape, ptr=4 << 30), DEV, 2, 132, mode="split")
    assert (p.parts, p.slice_cols, p.ctas, p.warps) == (parts, cols, tokens * parts, warps)
    assert p.block_h == triton.next_power_of_2(cols) and (parts - 1) * cols < hidden


@pytest.mark.parametrize("tokens, hidden, multi_node, text", [
    (67, 8192, False, "mode 'split' needs"), (1, 1024, False, "mode 'split' needs"),
    (1, 8192, True, "one node only"),
])
def test_rmsnorm_split_refuses_what_it_cannot_cut(tokens: int, hidden: int, multi_node: bool, text: str) -> None:
    shape = (tokens, hidden)
    with pytest.raises(ValueError, match=text):
        arn.plan(spec("x", shape, ptr=1 << 20), spec("residual", shape, ptr=2 << 30),
                 spec("weight", (hidden,), ptr=3 << 30), spec("out", shape, ptr=4 << 30), DEV, 2, 132, mode="split",
                 multi_node=multi_node)


@pytest.mark.parametrize("kw, err, text", [
    ({"residual": spec("residual", (8, 4096))}, ValueError, "residual has shape"),
    ({"out": spec("out", (8, 8192), "float16")}, TypeError, "out is float16"),
    ({"weight": spec("weight", (4096,))}, ValueError, "weight must have shape"),
    ({"x": spec("x", (8, 8192), "int32")}, TypeError, "x has dtype int32"),
    ({"x": spec("x", (8, 8192), contiguous=False)}, ValueError, "x must be contiguous"),
    ({"x": spec("x", (8192,))}, ValueError, "x must be 2-D"),
    ({"residual": spec("residual", (8, 8192), ptr=1 << 20)}, ValueError, "residual must not be x"),
])
def test_rmsnorm_rejects_bad_tensors(kw: dict, err: type, text: str) -> None:
    with pytest.raises(err, match=text):
        rms(**kw)


def test_rmsnorm_fp8_out_runs_the_tables_mode() -> None:
    def plan8(tokens: int, world: int) -> arn.Plan:
        x, r, w = (spec("x", (tokens, 8192), ptr=1 << 20), spec("residual", (tokens, 8192), ptr=2 << 30),
                   spec("weight", (8192,), ptr=3 << 30))
        o, scale = spec("out", (tokens, 8192), "float8_e4m3fn", 4 << 30), spec("scale", (tokens,), "float32", 5 << 30)
        return arn.plan(x, r, w, o, DEV, world, 132, scale=scale)
    # World 4's table: two_shot from 9 to 512 tokens (slices up to 66 rows, a CTA a row from 67),
    # for an FP8 out as for bf16 (before session 44 an FP8 out took rows where two_shot had no slices).
    for tokens in (32, 66, 67, 128, 512):
        assert plan8(tokens, 4).mode == rms(tokens).mode == "two_shot", tokens
        assert plan8(tokens, 4).fp8
    # World 2's: lamport up to 128 tokens, two_shot from 129 to 256, an FP8 out as a bf16 one.
    assert (plan8(128, 2).mode, plan8(129, 2).mode) == ("lamport", "two_shot")


def test_rmsnorm_on_several_nodes_runs_whole_unless_asked() -> None:
    x, r, w, o = rms_specs(512)
    p = arn.plan(x, r, w, o, DEV, 4, 132, multi_node=True)
    assert p.mode == "whole" and p.ctas == min(132, tuning.choose("all_reduce", x.nbytes, 4)[0])
    assert arn.plan(x, r, w, o, DEV, 4, 132).mode == "two_shot"  # what one node would run
    rows = arn.plan(x, r, w, o, DEV, 4, 132, mode="rows", multi_node=True)
    assert rows.mode == "rows" and rows.ctas == 132  # a tile per CTA: at most MAX_CTAS of them


def test_rmsnorm_push_mode_plans_its_slots_and_stays_on_one_node() -> None:
    x, r, w, o = rms_specs(300)
    p = arn.plan(x, r, w, o, DEV, 4, 132, mode="push")
    # A block of rows a CTA, as rows mode; a slot per peer, in two halves (alternate launches).
    assert p.mode == "push" and p.ctas == 132 and p.workspace_bytes == 2 * 3 * x.nbytes
    # One row at a time over 4 ranks (two spill on sm_90), two over 2 ranks (3 rows a CTA here).
    assert p.rows_at_once == 1 and arn.plan(x, r, w, o, DEV, 2, 132, mode="push").rows_at_once == 2
    assert arn.plan(x, r, w, o, DEV, 4, 132, mode="rows").workspace_bytes == 0
    with pytest.raises(ValueError, match="one node only"):
        arn.plan(x, r, w, o, DEV, 4, 132, mode="push", multi_node=True)


def test_rmsnorm_lamport_mode_plans_push_slots_one_row_at_a_time() -> None:
    x, r, w, o = rms_specs(300)
    p = arn.plan(x, r, w, o, DEV, 2, 132, mode="lamport")
    assert p.mode == "lamport" and p.ctas == 132 and p.workspace_bytes == 2 * x.nbytes and p.rows_at_once == 1
    with pytest.raises(ValueError, match="one node only"):
        arn.plan(x, r, w, o, DEV, 2, 132, mode="lamport", multi_node=True)


@pytest.mark.parametrize("tokens, world, hidden", [(300, 4, 8192), (300, 2, 8192), (1, 4, 8192), (5, 8, 8192),
                                                  (2048, 4, 8192), (3, 4, 40), (2, 8, 24)])
def test_rmsnorm_two_shot_plans_owned_chunks_and_gathered_rows(tokens: int, world: int, hidden: int) -> None:
    h = hidden
    x, r, w, o = rms_specs(tokens, h)
    p = arn.plan(x, r, w, o, DEV, world, 132, mode="two_shot")
    # Few rows: each cut into slices of a CTA each, as many as fit the SMs (at most 8) with chunks
    # of at least 1 KiB; else a CTA a row, rows strided over the CTAs (no residency needed).
    parts = tuning.rmsnorm_two_shot_parts(tokens, h * 2, world, 132)
    assert parts == {(300, 8192): 1, (1, 8192): 4, (5, 8192): 2, (2048, 8192): 1, (3, 40): 1, (2, 24): 1}[(tokens, h)]
    assert p.parts == parts and p.ctas == (tokens * parts if parts > 1 else min(tokens, 132))
    assert p.mode == "two_shot" and p.rows_at_once == 1 and p.lamport
    # Each rank owns a chunk of every slice: 16-column units, world chunks cover the slice, the
    # last ones may be narrower or empty (hidden 24 at 8 ranks: 16, 8, then six empty).
    chunk = arn.two_shot_chunk(h, world, parts)
    assert chunk % 16 == 0 and parts * world * chunk >= h > parts * world * (chunk - 16)
    assert p.slice_cols == chunk and p.block_h == triton.next_power_of_2(chunk)
    assert p.warps == tuning.rmsnorm_warps(world * p.block_h)  # step 3 holds a slice as [world, chunk]
    # Each half (alternate launches): for each peer a slot of this rank's chunk of every slice,
    # then one slot of every row whole for the gathered sums.
    assert arn.two_shot_slots(tokens, h, world, parts) == ((world - 1) * parts * chunk + h) * tokens
    assert p.workspace_bytes == 2 * arn.two_shot_slots(tokens, h, world, parts) * x.itemsize
    # Less than lamport's (world - 1) copies of x a half from 4 ranks on.
    if world >= 4 and h % (16 * world) == 0:
        assert p.workspace_bytes < arn.plan(x, r, w, o, DEV, world, 132, mode="lamport").workspace_bytes
    assert "two_shot" in arn.ONE_NODE_MODES
    with pytest.raises(ValueError, match="power-of-two world"):
        arn.plan(x, r, w, o, DEV, 3, 132, mode="two_shot")
    with pytest.raises(ValueError, match="one node only"):
        arn.plan(x, r, w, o, DEV, world, 132, mode="two_shot", multi_node=True)


@pytest.mark.parametrize("tokens, world, hidden", [(2048, 4, 8192), (2048, 2, 8192), (2048, 8, 8192), (512, 3, 8192),
                                                  (1, 4, 8192), (267, 4, 1000), (5, 4, 16)])
def test_rmsnorm_push_two_shot_plans_rows_a_cta_and_two_shot_chunks(tokens: int, world: int, hidden: int) -> None:
    h = hidden
    x, r, w, o = rms_specs(tokens, h)
    p = arn.plan(x, r, w, o, DEV, world, 132, mode="push_two_shot")
    # A block of rows a CTA, as push; the row whole in registers for the norm.
    assert p.mode == "push_two_shot" and p.ctas == min(tokens, 132) and p.block_h == triton.next_power_of_2(h)
    assert not p.lamport and p.parts == 1
    # Two rows a step where a CTA has two, up to 4 ranks (world 8's spill with two: rmsnorm_rows_at_once).
    assert p.rows_at_once == (2 if -(-tokens // p.ctas) >= 2 and world <= 4 else 1)
    # two_shot's chunks and layout (one slice a row): any world, not only powers of two.
    assert p.slice_cols == arn.two_shot_chunk(h, world)
    assert p.workspace_bytes == 2 * arn.two_shot_slots(tokens, h, world) * x.itemsize
    # The bytes a rank sends: 2 (world - 1) / world of x, push's world - 1 copies.
    if world >= 3 and h % (16 * world) == 0:
        assert p.workspace_bytes < arn.plan(x, r, w, o, DEV, world, 132, mode="push").workspace_bytes
    req = arn.workspace_requests(p, 2)
    assert req["all_reduce_rmsnorm"] == p.workspace_bytes and "all_reduce_rmsnorm/epochs" in req
    assert "push_two_shot" in arn.ONE_NODE_MODES
    with pytest.raises(ValueError, match="one node only"):
        arn.plan(x, r, w, o, DEV, world, 132, mode="push_two_shot", multi_node=True)


def test_every_rmsnorm_mode_names_its_failing_call() -> None:
    # all_reduce_rmsnorm looks the mode up before every launch: a mode missing here fails every call.
    assert set(arn.MODE_CALLS) == set(arn.MODES)
    assert all(c.format(suffix="") for c in arn.MODE_CALLS.values())


def test_rmsnorm_hidden_limit() -> None:
    with pytest.raises(ValueError, match="hidden size must be in"):
        rms(2, arn.MAX_HIDDEN + 1)


def mm(m: int, n: int, k: int, a_dtype: str = "bfloat16", out_shape: tuple[int, int] | None = None) -> mar.Plan:
    return mar.plan(spec("a", (m, k), a_dtype), spec("b", (k, n), contiguous=False),
                    spec("out", out_shape or (m, n)), DEV, 4, 132)


def test_matmul_plan_keeps_tiles_within_max_tiles() -> None:
    for m in (1, 16, 100, 1024, 4096, 16384):
        p = mm(m, 8192, 2048)
        tiles = -(-m // p.config.block_m) * -(-8192 // p.config.block_n)
        assert tiles <= _abi.MAX_TILES and p.ctas == min(tiles, 132)
    assert tuning.matmul_config(16, 8192, 2048, 4).block_m == 16


@pytest.mark.parametrize("args, err, text", [
    ((16, 64, 32, "float32"), TypeError, "must have one dtype"),
    ((16, 64, 32, "bfloat16", (16, 65)), ValueError, "out must have shape"),
])
def test_matmul_rejects_bad_operands(args: tuple, err: type, text: str) -> None:
    with pytest.raises(err, match=text):
        mm(*args)


def test_matmul_push_plan_sizes_its_workspace_by_world() -> None:
    a, b, out = spec("a", (1024, 2048)), spec("b", (2048, 8192)), spec("out", (1024, 8192))
    # A slot per peer, twice (launch parity), whichever kernel: 256 tiles of 128 x 256.
    three = mar.plan(a, b, out, DEV, 2, 100)  # three waves on 100 CTAs: two-shot by slices
    assert (three.method, three.one_shot, three.workspace_bytes) == ("push", False, 2 * 1024 * 8192 * 2)
    two = mar.plan(a, b, out, DEV, 2, 132)  # two waves on 132 CTAs: still one-shot
    assert (two.method, two.one_shot, two.workspace_bytes) == ("push", True, 2 * 1024 * 8192 * 2)
    one_wave = mar.plan(a, b, out, DEV, 2, 256)  # every tile at once: one-shot
    assert (one_wave.one_shot, one_wave.workspace_bytes) == (True, 2 * 1024 * 8192 * 2)
    four = mar.plan(a, b, out, DEV, 4, 256)  # one-shot is world 2's
    assert (four.one_shot, four.workspace_bytes) == (False, 2 * 3 * 1024 * 8192 * 2)
    tile = mar.plan(a, b, out, DEV, 4, 132, method="tile")
    assert (tile.method, tile.workspace_bytes) == ("tile", 0)
    with pytest.raises(ValueError, match="method must be one of"):
        mar.plan(a, b, out, DEV, 4, 132, method="ring")


def test_matmul_takes_lamport_at_world_2_while_every_tile_is_in_the_first_wave() -> None:
    """The rule, where the world's table has no matmul_all_reduce entries."""
    b = spec("b", (2048, 8192))
    rule_only = decode_table.table_for(2)._replace(matmul_all_reduce=())
    with decode_table.substituted(2, rule_only):
        for m, sms, world, want in ((16, 132, 2, "lamport"),     # 128 tiles of 16 x 64
                                    (128, 132, 2, "lamport"),    # 128 of 64 x 128
                                    (128, 100, 2, "push"),       # two waves on 100 CTAs
                                    (1024, 132, 2, "push"),      # 256 of 128 x 256: two waves
                                    (16, 132, 4, "push")):       # lamport is measured at world 2 only
            p = mar.plan(spec("a", (m, 2048)), b, spec("out", (m, 8192)), DEV, world, sms)
            assert p.method == want, (m, sms, world, p)
            assert p.workspace_bytes == 2 * (world - 1) * m * 8192 * 2  # its slots: push's size


def test_matmul_follows_the_measured_entries_of_world_2s_committed_table() -> None:
    """runtime/tuning/tables/decode-w2.json (2 H200s): lamport up to 4 MiB of out, also where
    the tiles take two waves (M = 256: 256 tiles on 132 CTAs, lamport 58.3 us, push 59.0), push
    up to 32 MiB, the rule past that."""
    b = spec("b", (2048, 8192))
    for m, want in ((16, "lamport"), (256, "lamport"), (257, "push"), (2048, "push"), (2049, "push")):
        assert mar.plan(spec("a", (m, 2048)), b, spec("out", (m, 8192)), DEV, 2, 132).method == want, m


@pytest.mark.parametrize("a_strides, b_strides, cc, want", [
    ((2048, 1), (8192, 1), 9, (True, True)),      # both row-major: TMA, b read as is
    ((2048, 1), (1, 2048), 9, (True, False)),     # b column-major: TMA over b's transpose
    ((2048, 1), (8192, 1), 8, (False, True)),     # no TMA before Hopper
    ((1, 1024), (8192, 1), 9, (False, True)),     # a column-major: the pointer path
    ((300, 1), (8192, 1), 9, (False, True)),      # a's rows 600 bytes apart: not 16-byte aligned
    ((2048, 1), (4, 2), 9, (False, False)),       # b strided both ways
])
def test_matmul_operands_take_tma_only_where_the_layout_allows(a_strides: tuple[int, int],
                                                               b_strides: tuple[int, int], cc: int,
                                                               want: tuple[bool, bool]) -> None:
    assert tuple(gemm_operands.operand_layout(a_strides, b_strides, 2, cc)) == want


def test_matmul_rejects_mismatched_k() -> None:
    with pytest.raises(ValueError, match="their K differ"):
        mar.plan(spec("a", (16, 32)), spec("b", (33, 64)), spec("out", (16, 64)), DEV, 4, 132)


def test_matmul_rejects_fp32() -> None:
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        mar.plan(spec("a", (16, 32), "float32"), spec("b", (32, 64), "float32"), spec("out", (16, 64), "float32"),
                 DEV, 4, 132)


def rs(m: int, n: int, k: int, out_shape: tuple[int, int] | None = None, world: int = 4) -> mrs.Plan:
    return mrs.plan(spec("a", (m, k)), spec("b", (k, n), contiguous=False), spec("out", out_shape or (m // world, n)),
                    DEV, world, 132)


def test_matmul_reduce_scatter_plan_sizes_the_workspace_by_parity_and_peer() -> None:
    p = rs(4096, 8192, 2048)
    c = p.config
    assert p.tiles == -(-1024 // c.block_m) * -(-8192 // c.block_n)
    assert p.workspace_bytes == 2 * 3 * 1024 * 8192 * 2  # two halves x three peers' partials of [M / 4, N]
    assert p.ctas == min(4 * p.tiles, 132)


@pytest.mark.parametrize("args, text", [
    ((4098, 64, 32), "split evenly over 4 ranks"),
    ((16, 64, 32, (16, 64)), "out must have shape"),
])
def test_matmul_reduce_scatter_rejects_bad_shapes(args: tuple, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        rs(*args)


def ag(rows: int, n: int, k: int, full: tuple[int, int] | None = None, world: int = 4) -> agm.Plan:
    return agm.plan(spec("a_shard", (rows, k), contiguous=False), spec("b", (k, n)),
                    spec("a_full", full or (world * rows, k), ptr=1 << 20), spec("out", (world * rows, n)),
                    DEV, world, 132)


def test_all_gather_matmul_plan_checks_the_gathered_shape() -> None:
    p = ag(1024, 2048, 8192)
    assert (p.rows, p.n, p.k) == (1024, 2048, 8192) and p.ctas == 132
    with pytest.raises(ValueError, match=r"a_full must have shape \(4096, 8192\)"):
        ag(1024, 2048, 8192, full=(1024, 8192))
    with pytest.raises(ValueError, match="their K differ"):
        agm.plan(spec("a_shard", (8, 32)), spec("b", (33, 64)), spec("a_full", (32, 32)), spec("out", (32, 64)),
                 DEV, 4, 132)


def test_all_gather_matmul_copy_engine_chunks_cover_the_tile_walk() -> None:
    # The kernel waits for chunk tm // GROUP_M of a peer's rows; the host copies and flags
    # copy_engine.chunks(rows, config), GROUP_M * BLOCK_M rows each: every tile row's chunk must
    # be one the host flags, and the chunks must cover the rows.
    for rows in (1, 100, 1024, 1030, 2048, 8192):
        p = ag(rows, 4096, 8192)
        c = copy_engine.chunked(rows, p.config, tuning.GatherExchange().min_chunks)
        bounds, chunk_rows = copy_engine.chunks(rows, c), c.group_m * c.block_m
        chunks = len(bounds)
        tiles_m = -(-rows // c.block_m)
        assert {tm // c.group_m for tm in range(tiles_m)} == set(range(chunks)), rows
        assert (chunks - 1) * chunk_rows < rows <= chunks * chunk_rows, rows
        assert bounds == [(j * chunk_rows, min((j + 1) * chunk_rows, rows)) for j in range(chunks)], rows
    # matmul_reduce_scatter's copy-engine kernel counts chunk tm // GROUP_M of each block; the
    # host waits for each chunk of copy_engine.chunks(rows, config), each of its tiles.
    for world, m in ((2, 2), (2, 4096), (2, 2060), (4, 16384), (8, 8 * 1030)):
        p = rs(m, 2048, 1024, world=world)
        rows = m // world
        c = copy_engine.chunked(rows, p.config, tuning.ScatterExchange().min_chunks)
        tiles_m = -(-rows // c.block_m)
        bounds = copy_engine.chunks(rows, c)
        assert {tm // c.group_m for tm in range(tiles_m)} == set(range(len(bounds))), (world, m)
        assert sum(-(-(hi - lo) // c.block_m) for lo, hi in bounds) * -(-2048 // c.block_n) == p.tiles, (world, m)
    # copy_engine.chunked: at least `min_chunks` chunks a block unless GROUP_M is 1, the largest
    # such GROUP_M (a power of two halving), the rest of the config as planned.
    for least in (1, 2, 4):
        for rows in (1, 128, 1024, 2048, 4096, 8192, 1 << 16):
            planned = ag(rows, 4096, 8192).config
            c = copy_engine.chunked(rows, planned, least)
            assert c._replace(group_m=planned.group_m) == planned, rows
            assert len(copy_engine.chunks(rows, c)) >= least or c.group_m == 1, rows
            assert c.group_m == planned.group_m or len(copy_engine.chunks(
                rows, c._replace(group_m=2 * c.group_m))) < least, rows
        assert copy_engine.chunked(1024, ag(1024, 4096, 8192).config, least).group_m == 8 // least
    assert (tuning.GatherExchange().min_chunks, tuning.ScatterExchange().min_chunks) == (
        tuning.COPY_ENGINE_MIN_CHUNKS["all_gather_matmul"], tuning.COPY_ENGINE_MIN_CHUNKS["matmul_reduce_scatter"])
    # The flag words (GO, FREE per rank, DONE, then the op's) do not overlap.
    for world in (2, 4, 8):
        words = [copy_engine.FLAG_GO.value, *(copy_engine.FLAG_FREE.value + q for q in range(world)),
                 copy_engine.flag_done(world), *(copy_engine.flag_data(world) + i for i in range(world * 3))]
        assert sorted(words) == list(range(len(words))), world


def test_sequence_parallel_methods_follow_the_tuning_table() -> None:
    for world, tables in tuning.SP_METHODS.items():
        for op, table in tables.items():
            limits = [limit for limit, _ in table]
            assert limits == sorted(limits), f"{op}: SP_METHODS limits must increase"
            assert {m for _, m in table} <= set(tuning.SP_METHOD_NAMES)
            for limit, method in table:
                assert tuning.sp_method(op, limit, world) == method
    assert tuning.sp_method("matmul_reduce_scatter", 128, 4) == "collective"
    assert tuning.sp_method("matmul_reduce_scatter", 16384, 4) == "overlap"
    # A world without a table takes the nearest smaller measured one's (tuning.lookup.nearest_world).
    assert tuning.sp_method("matmul_reduce_scatter", 16384, 8) == "overlap"
    assert tuning.sp_method("matmul_reduce_scatter", 16384, 3) == "kernel"
    # World 2 has its own table: the one-kernel reduce-scatter from M = 1024 up; all-gather +
    # matmul overlaps from M = 1024.
    assert tuning.sp_method("matmul_reduce_scatter", 128, 2) == "collective"
    assert tuning.sp_method("matmul_reduce_scatter", 4096, 2) == "kernel"
    assert tuning.sp_method("matmul_reduce_scatter", 16384, 2) == "kernel"
    assert tuning.sp_method("all_gather_matmul", 128, 2) == "collective"
    assert tuning.sp_method("all_gather_matmul", 1024, 2) == "overlap"


def test_sequence_parallel_method_names_are_checked() -> None:
    for name in tuning.SP_METHOD_NAMES:
        assert tuning.check_sp_method(name) == name
    with pytest.raises(ValueError, match="method must be one of"):
        tuning.check_sp_method("fastest")


def test_heaps_of_several_nodes_default_to_collective_and_refuse_overlap() -> None:
    for op in tuning.SP_METHODS[4]:
        assert cublas_methods.method_for(op, 16384, None, False, 4) == tuning.sp_method(op, 16384, 4) == "overlap"
        assert cublas_methods.method_for(op, 16384, None, multi_node=True, world=4) == "collective"
        for method in ("kernel", "collective"):
            assert cublas_methods.method_for(op, 128, method, multi_node=True, world=4) == method
        assert cublas_methods.method_for(op, 128, "overlap", multi_node=False, world=4) == "overlap"
        with pytest.raises(ValueError, match=f"{op}: method 'overlap' copies from peers' memory with the copy "
                                             "engine, which reaches only this node"):
            cublas_methods.method_for(op, 128, "overlap", multi_node=True, world=4)
        with pytest.raises(ValueError, match="method must be one of"):
            cublas_methods.method_for(op, 128, "fastest", multi_node=True, world=4)


def test_the_stream_methods_check_shapes_without_the_tile_limit() -> None:
    # A product too large for the kernel's tile slots is still a valid "overlap" call.
    big = mrs.check_shapes(spec("a", (65536, 2048)), spec("b", (2048, 65536)), spec("out", (16384, 65536)), DEV, 4)
    assert big == (65536, 2048, 65536)
    with pytest.raises(ValueError, match="split evenly"):
        mrs.check_shapes(spec("a", (65537, 64)), spec("b", (64, 64)), spec("out", (16384, 64)), DEV, 4)
    assert agm.check_shapes(spec("a_shard", (3, 64)), spec("b", (64, 5)), spec("a_full", (12, 64)),
                            spec("out", (12, 5)), DEV, 4) == (3, 64, 5)


def test_the_fused_ops_say_the_heap_bytes_their_workspaces_take() -> None:
    # A user sizes the heap before the first call (issue 62): every workspace a call may make, for
    # calls of up to the shape given in any order (a larger request makes a new power of two, the
    # smaller ones stay for the CUDA graphs captured with them: < 2x the largest).
    ws = importlib.import_module("ironlink.runtime.workspaces")
    assert [ws.workspace_size(n) for n in (1, 4096, 4097, 98304)] == [4096, 4096, 8192, 131072]
    assert ws.workspaces_heap_bytes([{"a": 98304, "b": 1024, "c": 0}]) == (2 * 131072 - 4096) + 4096
    assert ws.workspaces_heap_bytes([{"a": 1024}, {"a": 98304, "b": 1024}]) == (2 * 131072 - 4096) + 4096
    # all_reduce_rmsnorm at 1 token, world 4: split over lamport slots, 8 slices: the slots
    # (2 x 3 peers x 16 KiB), the slices' words (8 x 512) and the launch counters (4 x 256).
    plan1 = rms(1)
    assert plan1.mode == "split" and plan1.lamport
    assert arn.workspace_requests(plan1, 2) == {"all_reduce_rmsnorm/epochs": 1024, "all_reduce_rmsnorm/split": 4096,
                                                "all_reduce_rmsnorm/lamport16": 98304}
    assert ironlink.all_reduce_rmsnorm.heap_bytes(1, 8192, 4) == (2 * 131072 - 4096) + 4096 + 4096
    # Up to 2048 tokens the largest of every workspace any token count takes: more than one shape's.
    many = ironlink.all_reduce_rmsnorm.heap_bytes(2048, 8192, 4)
    assert many >= ws.workspaces_heap_bytes([arn.workspace_requests(rms(512), 2)]) > 0
    assert ironlink.all_reduce_rmsnorm.heap_bytes(8, 8192, 4, fp8=True) >= ironlink.all_reduce_rmsnorm.heap_bytes(1, 8192, 4)
    # A mode passed to the calls: its workspaces, not the table's (push_two_shot at world 2: two
    # halves of 1.5 x at 2048 tokens, rounded up to 128 MiB, the smaller ones below it kept).
    pts = ironlink.all_reduce_rmsnorm.heap_bytes(2048, 8192, 2, mode="push_two_shot")
    assert pts == ws.workspaces_heap_bytes([{"all_reduce_rmsnorm": 3 * 2048 * 8192 * 2,
                                             "all_reduce_rmsnorm/epochs": 1024}])
    assert pts > ironlink.all_reduce_rmsnorm.heap_bytes(2048, 8192, 2, mode="push")
    # Shapes a mode cannot run take nothing (split needs two slices a row, two_shot a power-of-two world).
    assert ironlink.all_reduce_rmsnorm.heap_bytes(4, 8192, 3, mode="two_shot") == 0
    assert ironlink.all_reduce_rmsnorm.heap_bytes(1, 8192, 2, mode="rows") == 0
    # matmul_all_reduce: "push" and "lamport" keep 2 x (world - 1) x [M, N] and the counters; "tile" nothing.
    mar = importlib.import_module("ironlink.fused.matmul_all_reduce")
    assert ironlink.matmul_all_reduce.heap_bytes(1024, 8192, 2048, 4, method="tile") == 0
    push = 2 * 3 * 1024 * 8192 * 2
    assert ironlink.matmul_all_reduce.heap_bytes(1024, 8192, 2048, 4, method="push") == \
        (2 * ws.workspace_size(push) - 4096) + 4096
    assert set(mar.workspace_requests(mar.plan(spec("a", (16, 2048)), spec("b", (2048, 8192)),
                                               spec("out", (16, 8192), ptr=1 << 40), DEV, 4, 132, None, "lamport"),
                                      2)) == {"matmul_all_reduce/lamport16", "matmul_all_reduce/epochs"}


def test_the_sequence_parallel_ops_run_the_exchange_asked_for_else_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same defaults where ranks share a GPU (4 ranks on one H200 under MPS): with half shares a
    # whole fusion run passed there with the copy engine on (docs/gpu-testing.md). A given exchange
    # is kept, and heap_bytes follows the exchange the op would run.
    agm = importlib.import_module("ironlink.fused.all_gather_matmul")
    mrs = importlib.import_module("ironlink.fused.matmul_reduce_scatter")
    dist = importlib.import_module("ironlink.runtime.distributed")
    m, n, k, world = 4096, 8192, 8192, 4
    defaults = (tuning.GatherExchange(), tuning.ScatterExchange())
    pushed = (tuning.GatherExchange(copy_engine=False), tuning.ScatterExchange(copy_engine_min_rows=None))
    on_own = ironlink.matmul_reduce_scatter.heap_bytes(m, n, k, world, method="kernel")
    for ranks in (1, 4):
        if ranks == 4:  # 4 ranks on one GPU, as every module that asks sees it
            monkeypatch.setenv("IRONLINK_SHARED_GPU", "1")
            monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
            install_fake_torch(monkeypatch).cuda.device_count = lambda: 1
        assert dist.ranks_per_gpu() == ranks
        assert (agm.gather_exchange(None), mrs.scatter_exchange(None)) == defaults
        assert (agm.gather_exchange(pushed[0]), mrs.scatter_exchange(pushed[1])) == pushed
        assert ironlink.matmul_reduce_scatter.heap_bytes(m, n, k, world, method="kernel") == on_own
    assert on_own != ironlink.matmul_reduce_scatter.heap_bytes(m, n, k, world, method="kernel", exchange=pushed[1])


def test_the_sequence_parallel_ops_say_the_heap_bytes_they_take() -> None:
    # all_gather_matmul and matmul_reduce_scatter (issue 62 item 3): every workspace a call of up to
    # the shape may make by the method the op would choose (or the one given), in any order.
    ws = importlib.import_module("ironlink.runtime.workspaces")
    agm = importlib.import_module("ironlink.fused.all_gather_matmul")
    mrs = importlib.import_module("ironlink.fused.matmul_reduce_scatter")
    m, n, k, world = 4096, 8192, 8192, 4
    a_full = -(-m * k * 2 // 4096) * 4096
    # cuBLAS methods move the shard with the library's all-gather or the copy engine: nothing kept,
    # only the a_full the op allocates when the caller passes none.
    assert ironlink.all_gather_matmul.heap_bytes(m, n, k, world, method="collective", a_full=True) == 0
    assert ironlink.all_gather_matmul.heap_bytes(m, n, k, world, method="collective") == a_full
    # The kernel with the copy engine keeps its flag words: the largest block's count of chunks.
    on = tuning.GatherExchange(copy_engine=True)
    flags = agm.workspace_requests(agm.plan(spec("a_shard", (m // world, k)), spec("b", (k, n)),
                                            spec("a_full", (m, k), ptr=1 << 40), spec("out", (m, n), ptr=2 << 40),
                                            DEV, world, 132), world, "kernel", on)
    words = copy_engine.planned(world, m // world, tuning.matmul_config(m, n, k, world), on.min_chunks, 1)[1]
    assert flags == {"all_gather_matmul/flags": copy_engine.flags_bytes(world, words)} and words > 0
    assert 0 < ironlink.all_gather_matmul.heap_bytes(m, n, k, world, method="kernel", exchange=on, a_full=True) \
        <= 2 * ws.workspace_size(flags["all_gather_matmul/flags"])
    off = tuning.GatherExchange(copy_engine=False)
    assert ironlink.all_gather_matmul.heap_bytes(m, n, k, world, method="kernel", exchange=off, a_full=True) == 0
    # matmul_reduce_scatter: "collective" keeps the partials ([M, N]), "overlap" the partials and
    # the sends; the kernel without the copy engine its slots by launch parity and the counters.
    full = m * n * 2
    assert ironlink.matmul_reduce_scatter.heap_bytes(m, n, k, world, method="collective") == 2 * ws.workspace_size(full) - 4096
    assert ironlink.matmul_reduce_scatter.heap_bytes(m, n, k, world, method="overlap") == 2 * (2 * ws.workspace_size(full) - 4096)
    never = tuning.ScatterExchange(copy_engine_min_rows=None)
    slots = 2 * (world - 1) * (m // world) * n * 2
    assert ironlink.matmul_reduce_scatter.heap_bytes(m, n, k, world, method="kernel", exchange=never) == \
        (2 * ws.workspace_size(slots) - 4096) + 4096
    # With the copy engine from every size on: the sends, the landing slots, the flags.
    always = tuning.ScatterExchange(copy_engine_min_rows=0)
    p = mrs.plan(spec("a", (m, k)), spec("b", (k, n)), spec("out", (m // world, n), ptr=1 << 40), DEV, world, 132)
    assert set(mrs.workspace_requests(p, 2, world, "kernel", always)) == \
        {"matmul_reduce_scatter/sends", "matmul_reduce_scatter/slots", "matmul_reduce_scatter/flags"}
    assert mrs.workspace_requests(p, 2, world, "kernel", always, multi_node=True) == {"matmul_reduce_scatter/partials": full}


def test_diagnostics_of_a_kernel_without_trace_stamps_give_communicate_and_refuse_a_trace() -> None:
    assert NO_DIAGNOSTICS.untraced("all_gather_matmul") is True
    assert Diagnostics(communicate=False).untraced("matmul_reduce_scatter") is False
    with pytest.raises(ValueError, match="matmul_reduce_scatter's kernel takes no trace"):
        Diagnostics(trace=object()).untraced("matmul_reduce_scatter")
