"""The fused kernels that tests/compile/test_fusion_compile.py compiles (and
bench/probes/compile_time.py times), no GPU needed: `KERNELS`, name -> (kernel, signature, given
constexprs and launch options); `prepared`, a case specialized as a launch would be, and
`compile_case`, it compiled against the built bitcode. The GPU
tests' kernels (tests/gpu/workers/_fusion_kernels.py: a producer, the grid barrier and a
whole-tensor all-reduce in one kernel; persistent kernels of tiles, each all-reduced,
all-gathered or reduce-scattered as it is written; push-as-produced around a ring) and the fused
ops of `ironlink.fused` in both modes and at small and large tile shapes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ironlink.runtime import tuning
from ironlink.fused import (allgather_matmul_copy_engine_kernel, allgather_matmul_kernel, allreduce_rmsnorm_kernel,
                            matmul_allreduce_kernel, matmul_reducescatter_copy_engine_kernel, matmul_reducescatter_kernel)
from ironlink.fused.matmul_all_reduce_kernels import matmul_allreduce_lamport_kernel
from ironlink.fused.matmul_all_reduce_one_shot_kernels import matmul_allreduce_push_kernel
from ironlink.fused.matmul_all_reduce_two_shot_kernels import matmul_allreduce_owner_kernel
from ironlink.fused.all_gather_matmul import COPY_COLS, COPY_ROWS, TMA_COPY_COLS, TMA_COPY_ROWS

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "gpu" / "workers"))
import _fusion_kernels as fk  # noqa: E402  (tests/gpu/workers is not a package)
from _compile import RMSNORM_SIGNATURE, bitcode  # noqa: E402  (tests/)


def _tiles_all_reduce_signature(x: str) -> dict[str, str]:
    """`tiles_then_all_reduce`'s arguments, its tensor of type `x`."""
    return {"ctx": "i64", "x": x, "rows": "i32", "cols": "i32", "stride": "i32", "rank": "i32", "seed": "i32",
            "dt": "constexpr", "out_dt": "constexpr", "status": "*i32", "TR": "constexpr", "TC": "constexpr"}


KERNELS: dict[str, tuple[Any, dict[str, str], dict[str, Any]]] = {
    "produce_then_all_reduce": (
        fk.produce_then_all_reduce.fn,
        {"ctx": "i64", "x": "*bf16", "n": "i32", "rank": "i32", "seed": "i32", "dt": "constexpr", "out_dt": "constexpr",
         "status": "*i32", "BLOCK": "constexpr"},
        {"dt": 2, "out_dt": triton.language.bfloat16, "BLOCK": 256},
    ),
    "tiles_then_all_reduce": (
        fk.tiles_then_all_reduce.fn,
        _tiles_all_reduce_signature("*bf16"),
        {"dt": 2, "out_dt": triton.language.bfloat16, "TR": 32, "TC": 64},
    ),
    # The GPU suite's LL tile shapes: one hidden-8192 row per tile, and 64 x 128 fp32 tiles.
    "tiles_then_all_reduce_row": (
        fk.tiles_then_all_reduce.fn,
        _tiles_all_reduce_signature("*bf16"),
        {"dt": 2, "out_dt": triton.language.bfloat16, "TR": 1, "TC": 8192},
    ),
    "tiles_then_all_reduce_64x128_fp32": (
        fk.tiles_then_all_reduce.fn,
        _tiles_all_reduce_signature("*fp32"),
        {"dt": 0, "out_dt": triton.language.float32, "TR": 64, "TC": 128},
    ),
    "tiles_then_all_gather": (
        fk.tiles_then_all_gather.fn,
        {"ctx": "i64", "x": "*bf16", "rows": "i32", "cols": "i32", "stride": "i32", "rank": "i32", "world": "i32",
         "seed": "i32", "out_dt": "constexpr", "status": "*i32", "TR": "constexpr", "TC": "constexpr"},
        {"out_dt": triton.language.bfloat16, "TR": 32, "TC": 64},
    ),
    "tiles_then_reduce_scatter": (
        fk.tiles_then_reduce_scatter.fn,
        {"ctx": "i64", "x": "*fp16", "out": "*fp16", "rows": "i32", "cols": "i32", "stride": "i32", "rank": "i32",
         "world": "i32", "seed": "i32", "out_dt": "constexpr", "status": "*i32", "TR": "constexpr", "TC": "constexpr"},
        {"out_dt": triton.language.float16, "TR": 32, "TC": 64},
    ),
    "ring_push": (
        fk.ring_push.fn,
        {"ctx": "i64", "outbox": "*fp32", "inbox": "*fp32", "got": "*fp32", "n_tiles": "i32", "rank": "i32",
         "world": "i32", "seed": "i32", "status": "*i32", "TE": "constexpr"},
        {"TE": 1024},
    ),
    "exchange_with_all": (
        fk.exchange_with_all.fn,
        {"ctx": "i64", "board": "*fp32", "got": "*fp32", "n_tiles": "i32", "rank": "i32", "world": "i32",
         "seed": "i32", "status": "*i32", "TE": "constexpr"},
        {"TE": 1024},
    ),
}
for whole in (0, 1):
    KERNELS[f"allreduce_rmsnorm_{'whole' if whole else 'rows'}"] = (
        allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
        {"WHOLE": whole, "BLOCK_H": 8192, "FP8": False, "PDL": False, "PRELOAD": True, "TRACE": False, "ROWS": 1,
         "num_warps": 16})
    # The FP8 output (float8_e4m3fn, per-token scales): Hopper and later (the host refuses it before).
    KERNELS[f"allreduce_rmsnorm_{'whole' if whole else 'rows'}_fp8"] = (
        allreduce_rmsnorm_kernel.fn, {**RMSNORM_SIGNATURE, "out": "*fp8e4nv"},
        {"WHOLE": whole, "BLOCK_H": 8192, "FP8": True, "PDL": False, "PRELOAD": True, "TRACE": False, "ROWS": 1,
         "MIN_CC": 90, "num_warps": 16})
# Rows mode with several rows a CTA: two normalized at a time (tuning.rmsnorm_rows_at_once).
KERNELS["allreduce_rmsnorm_rows_2"] = (
    allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
    {"WHOLE": 0, "BLOCK_H": 8192, "FP8": False, "PDL": False, "PRELOAD": True, "TRACE": False,
     "ROWS": tuning.RMSNORM_ROWS_AT_ONCE, "num_warps": 16})
KERNELS["allreduce_rmsnorm_rows_2_fp8"] = (
    allreduce_rmsnorm_kernel.fn, {**RMSNORM_SIGNATURE, "out": "*fp8e4nv"},
    {"WHOLE": 0, "BLOCK_H": 8192, "FP8": True, "PDL": False, "PRELOAD": True, "TRACE": False,
     "ROWS": tuning.RMSNORM_ROWS_AT_ONCE, "MIN_CC": 90, "num_warps": 16})
# Mode "push": rows stored into the peers' slots, a tile signal and wait (two ranks, and four: a
# store per peer), with as many rows at once as the plan takes for 2048 tokens.
for world in (2, 4):
    KERNELS[f"allreduce_rmsnorm_push_w{world}"] = (
        allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
        {"WHOLE": 0, "BLOCK_H": 8192, "FP8": False, "PDL": False, "PRELOAD": True, "TRACE": False,
         "ROWS": tuning.rmsnorm_rows_at_once(2048, 132, "push", world), "PUSH": True, "WORLD": world, "num_warps": 16})
KERNELS["allreduce_rmsnorm_push_w2_fp8"] = (
    allreduce_rmsnorm_kernel.fn, {**RMSNORM_SIGNATURE, "out": "*fp8e4nv"},
    {"WHOLE": 0, "BLOCK_H": 8192, "FP8": True, "PDL": False, "PRELOAD": True, "TRACE": False,
     "ROWS": tuning.RMSNORM_ROWS_AT_ONCE, "PUSH": True, "WORLD": 2, "MIN_CC": 90, "num_warps": 16})
# Mode "lamport": push's layout, the rows polled as they land, one at a time (two ranks and four),
# and its FP8 output; fp32 slots (32-bit empties).
for world in (2, 4, 8):
    KERNELS[f"allreduce_rmsnorm_lamport_w{world}"] = (
        allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
        {"WHOLE": 0, "BLOCK_H": 8192, "FP8": False, "PDL": False, "PRELOAD": True, "TRACE": False,
         "ROWS": 1, "LAMPORT": True, "WORLD": world, "num_warps": 16})
KERNELS["allreduce_rmsnorm_lamport_w2_fp8_pdl"] = (
    allreduce_rmsnorm_kernel.fn, {**RMSNORM_SIGNATURE, "out": "*fp8e4nv"},
    {"WHOLE": 0, "BLOCK_H": 8192, "FP8": True, "PDL": True, "PRELOAD": True, "TRACE": False,
     "ROWS": 1, "LAMPORT": True, "WORLD": 2, "MIN_CC": 90, "num_warps": 16})
KERNELS["allreduce_rmsnorm_lamport_w4_fp8_pdl"] = (
    allreduce_rmsnorm_kernel.fn, {**RMSNORM_SIGNATURE, "out": "*fp8e4nv"},
    {"WHOLE": 0, "BLOCK_H": 8192, "FP8": True, "PDL": True, "PRELOAD": True, "TRACE": False,
     "ROWS": 1, "LAMPORT": True, "WORLD": 4, "MIN_CC": 90, "num_warps": 16})
# Mode "two_shot": a reduce-scatter and an all-gather of each row's chunks through lamport slots
# (BLOCK_H: a chunk's block at hidden 8192; 2, 4 and 8 ranks) and its FP8 output.
for world, chunk_block in ((2, 4096), (4, 2048), (8, 1024)):
    KERNELS[f"allreduce_rmsnorm_two_shot_w{world}"] = (
        allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
        {"WHOLE": 0, "BLOCK_H": chunk_block, "FP8": False, "PDL": False, "PRELOAD": True, "TRACE": False,
         "ROWS": 1, "LAMPORT": True, "TWO_SHOT": True, "PARTS": 1, "WORLD": world, "num_warps": 16})
# Over slices (few rows: a CTA a slice of world chunks, the slices' sums of squares shared as
# split's are): 32 rows of hidden 8192 at world 4 in 4 slices, chunks of 512, 4 warps.
for fp8 in (False, True):
    KERNELS[f"allreduce_rmsnorm_two_shot_w4_parts4{'_fp8' if fp8 else ''}"] = (
        allreduce_rmsnorm_kernel.fn, {**RMSNORM_SIGNATURE, "ws": "*i64", **({"out": "*fp8e4nv"} if fp8 else {})},
        {"WHOLE": 0, "BLOCK_H": 512, "FP8": fp8, "PDL": fp8, "PRELOAD": True, "TRACE": False, "ROWS": 1,
         "LAMPORT": True, "TWO_SHOT": True, "PARTS": 4, "WORLD": 4, "num_warps": 4, **({"MIN_CC": 90} if fp8 else {})})
KERNELS["allreduce_rmsnorm_two_shot_w4_fp8_pdl"] = (
    allreduce_rmsnorm_kernel.fn, {**RMSNORM_SIGNATURE, "out": "*fp8e4nv"},
    {"WHOLE": 0, "BLOCK_H": 2048, "FP8": True, "PDL": True, "PRELOAD": True, "TRACE": False,
     "ROWS": 1, "LAMPORT": True, "TWO_SHOT": True, "PARTS": 1, "WORLD": 4, "MIN_CC": 90, "num_warps": 16})
# Mode "push_two_shot": two_shot's chunks over push's signalled slots, a block of rows a CTA in
# steps of as many rows as the plan takes for 2048 tokens (BLOCK_C: a rank's chunk of hidden 8192):
# world 4 (two rows a step, and with the FP8 out's peak) and world 8 (one row a step, seven peers).
for world, chunk_block, fp8s in ((4, 2048, (False, True)), (8, 1024, (False,))):
    for fp8 in fp8s:
        KERNELS[f"allreduce_rmsnorm_push_two_shot_w{world}{'_fp8_pdl' if fp8 else ''}"] = (
            allreduce_rmsnorm_kernel.fn, {**RMSNORM_SIGNATURE, **({"out": "*fp8e4nv"} if fp8 else {})},
            {"WHOLE": 0, "BLOCK_H": 8192, "FP8": fp8, "PDL": fp8, "PRELOAD": True, "TRACE": False,
             "ROWS": tuning.rmsnorm_rows_at_once(2048, 132, "push_two_shot", world), "PUSH_TWO_SHOT": True,
             "BLOCK_C": chunk_block,
             "WORLD": world, "num_warps": 16, **({"MIN_CC": 90} if fp8 else {})})
KERNELS["allreduce_rmsnorm_lamport_w2_fp32"] = (
    allreduce_rmsnorm_kernel.fn, {**RMSNORM_SIGNATURE, **{k: "*fp32" for k in ("x", "residual", "residual_out", "weight",
                                                                          "out", "ws", "inbox")}},
    {"WHOLE": 0, "BLOCK_H": 4096, "FP8": False, "PDL": False, "PRELOAD": True, "TRACE": False,
     "ROWS": 1, "LAMPORT": True, "WORLD": 2, "num_warps": 8})
# ironlink.all_reduce's small messages through lamport slots (language/slots.py), as the op launches it,
# over 2 and 4 ranks, with every reduction.
from ironlink.language import _abi  # noqa: E402
from ironlink.ops.collectives import _all_reduce_lamport_kernel  # noqa: E402
# At 4 and 8 ranks every peer's slot is polled in one loop (language.slots._reduce_in_groups).
for world, op in ((2, "SUM"), (2, "AVG"), (4, "MAX"), (4, "PROD"), (4, "SUM"), (8, "AVG")):
    KERNELS[f"all_reduce_lamport_w{world}_{op.lower()}"] = (
        _all_reduce_lamport_kernel.fn,
        {"ctx": "i64", "buf": "*bf16", "n": "i32", "status": "*i32", "inbox": "*bf16", "half": "i32", "epochs": "*i32",
         "WORLD": "constexpr", "OP": "constexpr", "BLOCK": "constexpr", "PDL": "constexpr"},
        {"WORLD": world, "OP": _abi.REDUCE_OP[op], "BLOCK": tuning.ALL_REDUCE_LAMPORT_CTA_BYTES // 2, "PDL": False,
         "num_warps": tuning.ALL_REDUCE_LAMPORT_WARPS})
# Mode "split": a row's slices on several CTAs, their sums exchanged as tagged words (8 slices of
# 1024 columns, as hidden 8192 at one token).
_SPLIT_SIG = {**RMSNORM_SIGNATURE, "ws": "*i64"}
KERNELS["allreduce_rmsnorm_split"] = (
    allreduce_rmsnorm_kernel.fn, _SPLIT_SIG,
    {"WHOLE": 0, "BLOCK_H": 1024, "FP8": False, "PDL": False, "PRELOAD": True, "TRACE": False, "ROWS": 1,
     "PUSH": False, "WORLD": 2, "SPLIT": True, "PARTS": 8, "num_warps": 8})
KERNELS["allreduce_rmsnorm_split_traced"] = (  # bench/probes/rmsnorm_timeline.py's launch
    allreduce_rmsnorm_kernel.fn, _SPLIT_SIG,
    {"WHOLE": 0, "BLOCK_H": 1024, "FP8": False, "PDL": True, "PRELOAD": True, "TRACE": True, "ROWS": 1,
     "PUSH": False, "WORLD": 2, "SPLIT": True, "PARTS": 8, "MIN_CC": 90, "num_warps": 8})
KERNELS["allreduce_rmsnorm_split_lamport_pdl"] = (  # the slices through lamport slots (tuning.RMSNORM_SPLIT_LAMPORT)
    allreduce_rmsnorm_kernel.fn, _SPLIT_SIG,
    {"WHOLE": 0, "BLOCK_H": 1024, "FP8": False, "PDL": True, "PRELOAD": True, "TRACE": False, "ROWS": 1,
     "PUSH": False, "WORLD": 2, "SPLIT": True, "PARTS": 8, "LAMPORT": True, "MIN_CC": 90, "num_warps": 8})
# Over 4 ranks (the peers' slices polled together) and 8 (peer by peer: language.slots.POLL_TOGETHER_MAX_ELEMENTS
# is about the block, and a slice of 1024 columns of 8 ranks fits).
for world in (4, 8):
    KERNELS[f"allreduce_rmsnorm_split_lamport_w{world}_pdl"] = (
        allreduce_rmsnorm_kernel.fn, _SPLIT_SIG,
        {"WHOLE": 0, "BLOCK_H": 1024, "FP8": False, "PDL": True, "PRELOAD": True, "TRACE": False, "ROWS": 1,
         "PUSH": False, "WORLD": world, "SPLIT": True, "PARTS": 8, "LAMPORT": True, "MIN_CC": 90, "num_warps": 8})
KERNELS["allreduce_rmsnorm_split_fp8_pdl"] = (
    allreduce_rmsnorm_kernel.fn, {**_SPLIT_SIG, "out": "*fp8e4nv"},
    {"WHOLE": 0, "BLOCK_H": 1024, "FP8": True, "PDL": True, "PRELOAD": True, "TRACE": False, "ROWS": 1,
     "PUSH": False, "WORLD": 2, "SPLIT": True, "PARTS": 8, "MIN_CC": 90, "num_warps": 4})
# With programmatic dependent launch (ironlink.language.pdl): griddepcontrol is sm_90+, the host launches
# it there only (tests/compile/test_pdl.py: nothing touches memory before the wait).
for whole in (0, 1):
    KERNELS[f"allreduce_rmsnorm_{'whole' if whole else 'rows'}_pdl"] = (
        allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
        {"WHOLE": whole, "BLOCK_H": 8192, "FP8": False, "PDL": True, "PRELOAD": True, "TRACE": False, "ROWS": 1,
         "MIN_CC": 90, "num_warps": 16})
_MATMUL_SIG = {"ctx": "i64", "a": "*bf16", "b": "*bf16", "out": "*bf16", "M": "i32", "N": "i32", "K": "i32",
               "stride_am": "i32", "stride_ak": "i32", "stride_bk": "i32", "stride_bn": "i32", "status": "*i32",
               "trace": "*i64", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
               "GROUP_M": "constexpr", "COMMUNICATE": "constexpr", "TRACE": "constexpr"}
_PUSH_SIG = {**{k: v for k, v in _MATMUL_SIG.items() if k in ("ctx", "a", "b", "out")}, "ws": "*bf16",
             "peer_slots": "*bf16", "epochs": "*i32", "half": "i32",
             **{k: v for k, v in _MATMUL_SIG.items() if k not in ("ctx", "a", "b", "out")},
             "TMA": "constexpr", "B_ROW_MAJOR": "constexpr", "WORLD": "constexpr",
             "PUSH_ROWS": "constexpr", "REDUCE_ROWS": "constexpr", "STAGGER": "constexpr", "TMA_PUSH": "constexpr",
             "TAIL_INTERLEAVED": "constexpr"}
_OWNER_SIG = {**{k: v for k, v in _PUSH_SIG.items() if k in ("ctx", "a", "b", "out", "ws", "peer_slots")},
              "peer_out": "*bf16", "epochs": "*i32", "half": "i32",
              **{k: v for k, v in _MATMUL_SIG.items() if k in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk",
                                                            "stride_bn")},
              "signal_k": "i32",
              **{k: v for k, v in _MATMUL_SIG.items() if k in ("status", "trace", "BLOCK_M", "BLOCK_N", "BLOCK_K",
                                                            "GROUP_M", "COMMUNICATE", "TRACE")},
              "TMA": "constexpr", "B_ROW_MAJOR": "constexpr", "WORLD": "constexpr", "TMA_PUSH": "constexpr",
              "FLAT": "constexpr"}
_LAMPORT_SIG = {**{k: v for k, v in _MATMUL_SIG.items() if k in ("ctx", "a", "b", "out")}, "inbox": "*bf16",
                "epochs": "*i32", "half": "i32", **{k: v for k, v in _MATMUL_SIG.items()
                                     if k in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn",
                                              "status", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "COMMUNICATE")},
                "TMA": "constexpr", "B_ROW_MAJOR": "constexpr", "WORLD": "constexpr", "PDL": "constexpr"}
for m in (16, 4096):
    c = tuning.matmul_config(m, 8192, 2048, 4)
    tile = {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "GROUP_M": c.group_m, "COMMUNICATE": True,
            "TRACE": False, "num_warps": c.warps, "num_stages": c.stages}
    KERNELS[f"matmul_allreduce_tile_m{m}"] = (matmul_allreduce_kernel.fn, _MATMUL_SIG, tile)
    # The push method, one-shot (world 2) and two-shot by slices (world 4), through pointers.
    for tail in (False, True):  # tuning.MATMUL_TAIL_INTERLEAVED
        KERNELS[f"matmul_allreduce_push_m{m}_one_shot{'_tail_interleaved' if tail else ''}"] = (
            matmul_allreduce_push_kernel.fn, _PUSH_SIG,
            {**tile, "TMA": False, "B_ROW_MAJOR": False, "WORLD": 2, "PUSH_ROWS": 32, "REDUCE_ROWS": 64,
             "STAGGER": 8, "TMA_PUSH": False, "TAIL_INTERLEAVED": tail})
    for flat in (False, True):  # flattened on Hopper only (tuning.matmul_flat)
        KERNELS[f"matmul_allreduce_push_m{m}_two_shot{'_flat' if flat else ''}"] = (
            matmul_allreduce_owner_kernel.fn, _OWNER_SIG,
            {**tile, "TMA": False, "B_ROW_MAJOR": False, "WORLD": 4, "TMA_PUSH": False, "FLAT": flat,
             "SIGNAL_EVERY": 1, **({"MAX_CC": 90} if flat else {})})
    # Through TMA descriptors (Hopper and later, world 2): b row-major, and column-major (read transposed).
    for b_row_major in (True, False):
        b_block = [c.block_k, c.block_n] if b_row_major else [c.block_n, c.block_k]
        push_rows = max(1, min(c.block_m, 8192 // c.block_n))
        operands = {"a": f"tensordesc<bf16[{c.block_m}, {c.block_k}]>", "b": f"tensordesc<bf16{b_block}>"}
        for tail in (False, True):
            KERNELS[f"matmul_allreduce_push_m{m}_one_shot{'_tail_interleaved' if tail else ''}_tma_b_"
                    f"{'rows' if b_row_major else 'cols'}"] = (
                matmul_allreduce_push_kernel.fn,
                {**_PUSH_SIG, **operands, "peer_slots": f"tensordesc<bf16[1, {push_rows}, {c.block_n}]>"},
                {**tile, "TMA": True, "B_ROW_MAJOR": b_row_major, "WORLD": 2, "MIN_CC": 90,
                 "PUSH_ROWS": push_rows, "REDUCE_ROWS": 64, "STAGGER": 8, "TMA_PUSH": True, "TAIL_INTERLEAVED": tail})
        # Flattened (the default: halves pushed; signals per tile or batched) and nested.
        for flat, every in ((True, 1), (True, 4), (False, 1)):
            peer = f"tensordesc<bf16[1, {c.block_m}, {c.block_n // 2 if flat else c.block_n}]>"
            KERNELS[f"matmul_allreduce_push_m{m}_two_shot_{'flat' if flat else 'nested'}_tma_b_"
                    f"{'rows' if b_row_major else 'cols'}{f'_signal_every{every}' if every > 1 else ''}"] = (
                matmul_allreduce_owner_kernel.fn, {**_OWNER_SIG, **operands, "peer_slots": peer, "peer_out": peer},
                {**tile, "TMA": True, "B_ROW_MAJOR": b_row_major, "WORLD": 2, "MIN_CC": 90, "TMA_PUSH": True,
                 "FLAT": flat, "SIGNAL_EVERY": every, **({"MAX_CC": 90} if flat else {})})

# matmul_all_reduce's lamport method, at the small outputs it runs (tuning.matmul_method; at 4096's
# 128 x 256 tiles its epilogue, the partial and the polled peer's beside the accumulator, spills):
# through pointers at world 2 (as sm_80 launches it: no PDL) and world 4 with PDL; through TMA
# descriptors (Hopper and later, b column-major) at world 2 with PDL.
for m in (16, 128):
    c = tuning.matmul_config(m, 8192, 2048, 4)
    lamport = {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "GROUP_M": c.group_m,
               "COMMUNICATE": True, "num_warps": c.warps, "num_stages": c.stages, "TMA": False, "B_ROW_MAJOR": False}
    KERNELS[f"matmul_allreduce_lamport_m{m}_w2"] = (matmul_allreduce_lamport_kernel.fn, _LAMPORT_SIG,
                                                    {**lamport, "WORLD": 2, "PDL": False})
    if m == 16:  # tuning.matmul_method takes lamport at world 2 only; at 64 x 128 tiles three peers' polls spill
        KERNELS[f"matmul_allreduce_lamport_m{m}_w4_pdl"] = (matmul_allreduce_lamport_kernel.fn, _LAMPORT_SIG,
                                                            {**lamport, "WORLD": 4, "PDL": True, "MIN_CC": 90})
    KERNELS[f"matmul_allreduce_lamport_m{m}_tma_pdl"] = (
        matmul_allreduce_lamport_kernel.fn,
        {**_LAMPORT_SIG, "a": f"tensordesc<bf16[{c.block_m}, {c.block_k}]>",
         "b": f"tensordesc<bf16[{c.block_n}, {c.block_k}]>"},
        {**lamport, "TMA": True, "WORLD": 2, "PDL": True, "MIN_CC": 90})

_STRIDES = {"stride_bk": "i32", "stride_bn": "i32", "status": "*i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
            "BLOCK_K": "constexpr"}
for m in (128, 16384):
    c = tuning.matmul_config(m, 8192, 2048, 4)
    rs_sig = {"ctx": "i64", "a": "*bf16", "b": "*bf16", "out": "*bf16", "ws": "*bf16", "peer_slots": "*bf16",
              "epochs": "*i32", "half": "i32", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32",
              "stride_ak": "i32",
              **_STRIDES, "GROUP_M": "constexpr", "WORLD": "constexpr", "TMA": "constexpr",
              "B_ROW_MAJOR": "constexpr", "TMA_PUSH": "constexpr", "SIGNAL_EVERY": "constexpr",
              "COMMUNICATE": "constexpr"}
    rs = {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "GROUP_M": c.group_m, "WORLD": 4,
          "TMA": False, "B_ROW_MAJOR": False, "TMA_PUSH": False, "SIGNAL_EVERY": 1, "COMMUNICATE": True,
          "num_warps": c.warps, "num_stages": c.stages}
    KERNELS[f"matmul_reducescatter_m{m}"] = (matmul_reducescatter_kernel.fn, rs_sig, rs)
    # Through TMA descriptors (Hopper and later), b column-major (read transposed), at world 2,
    # pushed by TMA in halves; signals per tile and in batches (tuning.MATMUL_SIGNAL_EVERY).
    for every in (1, 4):
        KERNELS[f"matmul_reducescatter_m{m}_tma{f'_signal_every{every}' if every > 1 else ''}"] = (
            matmul_reducescatter_kernel.fn,
            {**rs_sig, "a": f"tensordesc<bf16[{c.block_m}, {c.block_k}]>",
             "b": f"tensordesc<bf16[{c.block_n}, {c.block_k}]>",
             "peer_slots": f"tensordesc<bf16[1, {c.block_m}, {c.block_n // 2}]>"},
            {**rs, "WORLD": 2, "TMA": True, "TMA_PUSH": True, "SIGNAL_EVERY": every, "MIN_CC": 90})
    # The partials stored locally and moved by the copy engine (tuning.MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS).
    rs_ce_sig = {"ctx": "i64", "flags": "*i64", "a": "*bf16", "b": "*bf16", "out": "*bf16", "sends": "*bf16",
                 "slots": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_ak": "i32",
                 **_STRIDES, "GROUP_M": "constexpr", "WORLD": "constexpr", "TMA": "constexpr",
                 "B_ROW_MAJOR": "constexpr"}
    rs_ce = {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "GROUP_M": c.group_m, "WORLD": 4,
             "TMA": False, "B_ROW_MAJOR": False, "num_warps": c.warps, "num_stages": c.stages}
    KERNELS[f"matmul_reducescatter_copy_engine_m{m}"] = (matmul_reducescatter_copy_engine_kernel.fn, rs_ce_sig, rs_ce)
    KERNELS[f"matmul_reducescatter_copy_engine_m{m}_tma"] = (
        matmul_reducescatter_copy_engine_kernel.fn,
        {**rs_ce_sig, "a": f"tensordesc<bf16[{c.block_m}, {c.block_k}]>",
         "b": f"tensordesc<bf16[{c.block_n}, {c.block_k}]>"},
        {**rs_ce, "WORLD": 2, "TMA": True, "MIN_CC": 90})
    c = tuning.matmul_config(m, 2048, 8192, 4)
    ag_sig = {"ctx": "i64", "a_shard": "*bf16", "a_full": "*bf16", "a_own": "*bf16", "a_all": "*bf16",
              "peer_full": "*bf16", "b": "*bf16", "out": "*bf16", "ROWS": "i32", "N": "i32", "K": "i32",
              "stride_sm": "i32", "stride_sk": "i32", **_STRIDES, "GROUP_M": "constexpr", "COPY_ROWS": "constexpr",
              "COPY_COLS": "constexpr", "WORLD": "constexpr", "TMA": "constexpr", "B_ROW_MAJOR": "constexpr",
              "FLAT": "constexpr", "TMA_PUSH": "constexpr", "SEGMENTS": "constexpr", "COMMUNICATE": "constexpr"}
    ag = {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "GROUP_M": c.group_m, "COPY_ROWS": COPY_ROWS,
          "COPY_COLS": COPY_COLS, "WORLD": 4, "TMA": False, "B_ROW_MAJOR": False, "FLAT": False, "TMA_PUSH": False,
          "SEGMENTS": 1, "COMMUNICATE": True, "num_warps": c.warps, "num_stages": c.stages}
    KERNELS[f"allgather_matmul_m{m}"] = (allgather_matmul_kernel.fn, ag_sig, ag)
    a_block = f"tensordesc<bf16[{c.block_m}, {c.block_k}]>"
    tma_sig = {**ag_sig, "a_own": a_block, "a_all": a_block, "b": f"tensordesc<bf16[{c.block_n}, {c.block_k}]>"}
    # World 2 through TMA: the shard pushed by TMA (the default) or from registers; the other
    # ranks' tiles flattened (Hopper, tuning.matmul_flat) or nested.
    for flat in (True, False):
        KERNELS[f"allgather_matmul_m{m}_tma{'_flat' if flat else ''}"] = (
            allgather_matmul_kernel.fn,
            {**tma_sig, "peer_full": f"tensordesc<bf16[1, {TMA_COPY_ROWS}, {TMA_COPY_COLS}]>"},
            {**ag, "WORLD": 2, "TMA": True, "FLAT": flat, "TMA_PUSH": True, "COPY_ROWS": TMA_COPY_ROWS,
             "COPY_COLS": TMA_COPY_COLS, "SEGMENTS": tuning.ALL_GATHER_MATMUL_PUSH_SEGMENTS, "MIN_CC": 90,
             **({"MAX_CC": 90} if flat else {})})
    KERNELS[f"allgather_matmul_m{m}_tma_register_push"] = (
        allgather_matmul_kernel.fn, tma_sig,
        {**ag, "WORLD": 2, "TMA": True, "SEGMENTS": tuning.ALL_GATHER_MATMUL_PUSH_SEGMENTS, "MIN_CC": 90})
    # The copy engine moves the shard (the default on one node): the kernel only waits and computes.
    ce_sig = {"ctx": "i64", "flags": "*i64", "a_own": "*bf16", "a_all": "*bf16", "b": "*bf16", "out": "*bf16",
              "ROWS": "i32", "N": "i32", "K": "i32", "stride_sm": "i32", "stride_sk": "i32", **_STRIDES,
              "GROUP_M": "constexpr", "WORLD": "constexpr", "TMA": "constexpr", "B_ROW_MAJOR": "constexpr",
              "FLAT": "constexpr"}
    ce = {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "GROUP_M": c.group_m, "WORLD": 4,
          "TMA": False, "B_ROW_MAJOR": False, "FLAT": False, "num_warps": c.warps, "num_stages": c.stages}
    KERNELS[f"allgather_matmul_copy_engine_m{m}"] = (allgather_matmul_copy_engine_kernel.fn, ce_sig, ce)
    KERNELS[f"allgather_matmul_copy_engine_m{m}_tma_flat"] = (
        allgather_matmul_copy_engine_kernel.fn,
        {**ce_sig, "a_own": a_block, "a_all": a_block, "b": f"tensordesc<bf16[{c.block_n}, {c.block_k}]>"},
        {**ce, "WORLD": 2, "TMA": True, "FLAT": True, "MIN_CC": 90, "MAX_CC": 90})


_UNIT_STRIDES = ("stride_ak", "stride_sk", "stride_bn")
# Sizes Triton specializes as multiples of 16 where they are (every launch these cases stand for).
_ALIGNED_SIZES = ("M", "N", "K", "ROWS", "H", "W", "half", "stride_am", "stride_bk", "stride_sm")


def prepared(name: str) -> tuple[Any, dict[str, str], dict[str, Any], dict[Any, Any], dict[str, int]]:
    """KERNELS[name] as (kernel, signature, constexprs, attrs, launch options), specialized as a
    launch on contiguous, aligned operands would be (unit inner strides, 16-divisible pointers and
    sizes): the pipelined GEMM's shared memory shows only then."""
    fn, signature, given = KERNELS[name]
    launch = {k: given[k] for k in ("num_warps", "num_stages") if k in given}
    constexprs = {k: v for k, v in given.items() if k not in launch and k not in ("MIN_CC", "MAX_CC")}
    signature = {k: "constexpr" if k in _UNIT_STRIDES else v for k, v in signature.items()}
    constexprs.update({k: 1 for k in _UNIT_STRIDES if k in signature})
    names = list(signature)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if signature[n].startswith("*") or (n in _ALIGNED_SIZES and signature[n] != "constexpr")}
    return fn, signature, constexprs, attrs, launch


def compile_case(name: str, cc: int) -> Any:
    """KERNELS[name] compiled for sm_`cc` against the device library's bitcode (`prepared`)."""
    fn, signature, constexprs, attrs, launch = prepared(name)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", cc, 32),
                          options={"extern_libs": (("ironlink", bitcode(cc)),), **launch})
