"""all_reduce_rmsnorm's argument checks and plans (its modes, slots and limits; ironlink.fused.all_reduce_rmsnorm.plan),
without torch or a GPU."""

from __future__ import annotations

import pytest
import triton

from ironlink.runtime import tuning

from _fused_plans import DEV, arn, rms, rms_specs, spec  # tests/cpu/, this folder


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
