"""The fused GEMM ops' argument checks and launch choices (matmul_all_reduce, matmul_reduce_scatter,
all_gather_matmul, the sequence-parallel methods), the heap bytes of every fused op, and diagnostics
(ironlink.fused.*.plan), without torch or a GPU. all_reduce_rmsnorm's: test_fused_rmsnorm.py."""

from __future__ import annotations

import importlib

import pytest

import ironlink
from ironlink.language import _abi
from ironlink.runtime import tuning
from ironlink.runtime.tuning import decode_table

from ironlink.fused import copy_engine
from ironlink.fused import gemm_operands
from ironlink.fused import cublas_methods
from ironlink.fused.diagnostics import NO_DIAGNOSTICS, Diagnostics

from _fake_torch import install_fake_torch  # tests/, beside this folder

from _fused_plans import DEV, agm, arn, mar, mrs, rms, spec  # tests/cpu/, this folder


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
