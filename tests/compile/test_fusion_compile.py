"""The fused kernels (`_fused_compile_cases.KERNELS`: the GPU tests' fusion kernels and every
`ironlink.fused` variant) compile for sm_80/90/100 with the bitcode linked and inlined, without
local memory, within their spill allowance on sm_90, no GPU needed; an FP8 output keeps its bf16
twin's layout."""

from __future__ import annotations

import re
import pytest

from _archs import CAPABILITIES  # tests/
from _fused_compile_cases import KERNELS, compile_case  # tests/compile/, this folder
from _sass import spills_checked, stack_bytes  # tests/


# Bytes of stack (ptxas spills: invisible in the PTX, whose .local the test refuses) each kernel
# is allowed on sm_90 with the pinned Triton (`_sass.spills_checked`), as measured when this check
# came (2026-11-25); every other kernel 0.
# Lower them, never raise them. The spilling ones are the pointer-GEMM paths (sm_80, layouts
# TMA cannot read, more than one peer to push to) and, by a few words, the two-shot epilogue
# (a peer's partial summed beside the accumulator).
SM90_SPILL_BYTES = {"matmul_allreduce_tile_m16": 112, "matmul_allreduce_push_m4096_one_shot": 88,
                    "matmul_allreduce_push_m4096_one_shot_tail_interleaved": 88,
                    "matmul_allreduce_push_m4096_two_shot": 952,
                    "matmul_allreduce_push_m4096_two_shot_flat": 104, "matmul_allreduce_push_m16_two_shot_nested_tma_b_rows": 16,
                    "matmul_allreduce_push_m4096_two_shot_nested_tma_b_rows": 48,
                    "matmul_allreduce_push_m4096_two_shot_nested_tma_b_cols": 40, "allgather_matmul_m16384": 8,
                    # the copy-engine kernel through pointers (its world-4 chunk waits beside the accumulator)
                    "allgather_matmul_copy_engine_m16384": 112,
                    # matmul_reduce_scatter's copy-engine kernel (off by default): its chunk counters
                    # beside the accumulator; through pointers, world 4, the peers' partials summed too
                    "matmul_reducescatter_copy_engine_m16384_tma": 8, "matmul_reducescatter_copy_engine_m16384": 264,
                    "matmul_reducescatter_m16384": 16,
                    # The test kernel around symm_tile_all_reduce (no GEMM): ptxas keeps a stack
                    # word at 80 registers since the LL one-shot moves two units at a time
                    # (`ll_packet::one_shot_reduce`); the library's rows kernels stay at 0.
                    "tiles_then_all_reduce": 8, "tiles_then_all_reduce_64x128_fp32": 16,
                    # Lamport rows of hidden 8192 (16 warps: 128 registers a thread): world 4 polls
                    # its three peers' rows as one [4, 8192] block (language.slots._reduce_in_groups; 112
                    # bytes when they were polled one by one); world 8 as two such blocks (344 bytes
                    # one by one, seven rows unrolled); world 2 spills none. World 4's grew from 16 to
                    # 24 with the store that sets the wait timeout to 0 when a poll records TIMEOUT
                    # (`_flags._record`, a cold branch; a mode the world-4 table does not choose).
                    "allreduce_rmsnorm_lamport_w4": 24, "allreduce_rmsnorm_lamport_w4_fp8_pdl": 48,
                    "allreduce_rmsnorm_lamport_w8": 160,
                    # Split's slices of 1024 columns (W a multiple of 16, as launched at hidden 8192):
                    # 8 ranks' slices polled as one block; the FP8 peak beside the sum of squares.
                    # Two-shot by column chunks spills none (312 bytes at world 8 when ranks owned rows).
                    "allreduce_rmsnorm_split_lamport_w8_pdl": 8, "allreduce_rmsnorm_split_fp8_pdl": 32,
                    # push_two_shot's FP8 out at world 4, two rows a step: the peak beside four
                    # ranks' chunks of two rows (one row a step, as world 8 takes, spills none).
                    "allreduce_rmsnorm_push_two_shot_w4_fp8_pdl": 40,
                    # Through pointers (sm_80, layouts TMA cannot read): a word beside a 64 x 128
                    # accumulator; the TMA kernel Hopper runs spills none.
                    "matmul_allreduce_lamport_m128_w2": 8}


@pytest.mark.parametrize("cc", CAPABILITIES)
@pytest.mark.parametrize("name", list(KERNELS))
def test_fused_kernel_compiles_and_inlines(name: str, cc: int) -> None:
    given = KERNELS[name][2]
    if cc < given.get("MIN_CC", 0):  # TMA descriptors, FP8 outputs: the host takes them on sm_90+ only
        pytest.skip(f"{name} is launched on compute capability {given['MIN_CC']} and later only")
    if cc > given.get("MAX_CC", cc):  # the flattened two-shot loop: Hopper only (tuning.matmul_flat)
        pytest.skip(f"{name} is launched on compute capability {given['MAX_CC']} and earlier only")
    k = compile_case(name, cc)
    ptx = k.asm["ptx"]
    assert k.asm["cubin"]
    smem = {80: 166912, 90: 232448, 100: 232448}[cc]  # bytes a CTA may use (cudaDevAttrMaxSharedMemoryPerBlockOptin)
    assert k.metadata.shared <= smem, f"{name} needs {k.metadata.shared} bytes of shared memory on sm_{cc}"
    for sym in ("symm_grid_barrier", "symm_all_reduce", "symm_tile_all_reduce", "symm_tile_all_gather",
                "symm_tile_reduce_scatter", "symm_tile_put", "symm_tile_signal", "symm_tile_wait", "symm_tile_signal_others",
                "symm_tile_wait_others", "symm_signal_at", "symm_signal_wait_at"):
        assert not re.search(rf"\bcall(\.uni)?\b[^;]*\b{sym}\b", ptx), f"{sym} was not inlined"
    local = [line.strip() for line in ptx.splitlines() if re.search(r"\.local\b", line)]
    assert not local, f"{name} uses local memory on sm_{cc}:\n" + "\n".join(local[:10])
    if cc == 90 and spills_checked():
        spilled, allowed = stack_bytes(k.asm["cubin"]), SM90_SPILL_BYTES.get(name, 0)
        assert spilled <= allowed, f"{name} spills {spilled} bytes on sm_90 (allowed {allowed}: SM90_SPILL_BYTES)"


# all_reduce_rmsnorm's FP8-out kernels and their bf16 twins (same mode, rows at once, PDL aside).
FP8_TWINS = {"allreduce_rmsnorm_rows_fp8": "allreduce_rmsnorm_rows",
             "allreduce_rmsnorm_whole_fp8": "allreduce_rmsnorm_whole",
             "allreduce_rmsnorm_rows_2_fp8": "allreduce_rmsnorm_rows_2",
             "allreduce_rmsnorm_push_w2_fp8": "allreduce_rmsnorm_push_w2",
             "allreduce_rmsnorm_lamport_w2_fp8_pdl": "allreduce_rmsnorm_lamport_w2"}


@pytest.mark.parametrize("fp8", list(FP8_TWINS))
def test_fp8_out_keeps_the_bf16_layout(fp8: str) -> None:
    """An FP8 `out` stored 16 to a thread (16 bytes) made Triton lay the whole row out that way and
    move the bf16 stores of x and residual_out back to 8 a thread through shared memory: 16-byte
    shared stores (st.shared.v4) and two bar.sync per conversion, 4 to 16 of them a kernel (2 H200s:
    FP8 +2.0-2.9 us at 512 tokens). The FP8 store keeps the bf16 layout (8 a thread), so its kernel
    has no more of them than its twin. (Its row reduction of a pair, sum and peak, may take more
    scalar or v2 rounds: Triton 3.9 adds one.)"""
    def row_conversions(name: str) -> int:
        return len(re.findall(r"\bst\.shared\.v4\b", compile_case(name, 90).asm["ptx"]))

    assert row_conversions(fp8) <= row_conversions(FP8_TWINS[fp8]), f"{fp8} converts layouts through shared memory"
