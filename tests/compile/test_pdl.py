"""Programmatic dependent launch (ironlink.language.pdl, ironlink.runtime.pdl), no GPU needed: what the installed Triton offers,
when the ops launch with it, and the PDL kernels compiled for sm_90 and sm_100 with nothing that
touches memory before `griddepcontrol.wait` but the context (generic loads: the rank and the
peers' addresses, written once when the heap is made), and every path reaching the wait. (Inlining, local memory and spills of the
all_reduce_rmsnorm PDL variants: tests/compile/test_fusion_compile.py.)"""

from __future__ import annotations

import re
from typing import Any, Optional

import pytest
import triton
from triton.backends import backends
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from _archs import CAPABILITIES  # tests/, beside this file
from _compile import RMSNORM_SIGNATURE, bitcode, fresh_triton_cache  # noqa: F401 - the fixture applies here
from ironlink.ops import collectives as ops
from ironlink.runtime import pdl
from ironlink.runtime import tuning
from ironlink.fused import allreduce_rmsnorm_kernel


def test_triton_launch_takes_launch_pdl() -> None:
    # `kernel[grid](..., launch_pdl=True)` ends in the backend's parse_options: the option must
    # exist there (it sets CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION at launch).
    backend = backends["nvidia"].compiler(GPUTarget("cuda", 90, 32))
    assert backend.parse_options({"launch_pdl": True}).launch_pdl is True
    assert backend.parse_options({}).launch_pdl is False


@pytest.mark.parametrize("requested, major, multi_node, want", [
    (None, 9, False, True), (None, 10, False, True), (None, 8, False, False), (None, 9, True, False),
    (False, 9, False, False), (True, 9, False, True), (True, 10, False, True)])
def test_pdl_where_the_gpu_has_it(requested: Optional[bool], major: int, multi_node: bool, want: bool) -> None:
    assert pdl.choose_pdl(requested, major, "all_reduce", multi_node) is want


@pytest.mark.parametrize("major, multi_node, text", [(8, False, "compute capability 9.0"),
                                                     (9, True, "several nodes")])
def test_pdl_asked_for_where_it_cannot_run_raises(major: int, multi_node: bool, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        pdl.choose_pdl(True, major, "all_reduce_rmsnorm", multi_node)


def test_pdl_default_is_the_tuning_switch_and_an_argument_overrides_it() -> None:
    assert pdl.choose_pdl(None, 9, "all_reduce") is tuning.DECODE_PDL  # one rank a GPU here
    assert pdl.choose_pdl(not tuning.DECODE_PDL, 9, "all_reduce") is (not tuning.DECODE_PDL)


def test_pdl_launch_options_set_the_constexpr_and_the_attribute_together() -> None:
    assert pdl.pdl_launch_options(True) == {"PDL": True, "launch_pdl": True}
    assert pdl.pdl_launch_options(False) == {}  # the kernel as it was before PDL


KERNELS: dict[str, tuple[Any, dict[str, str], dict[str, Any], int]] = {
    # name: (kernel, signature, constexprs without PDL, num_warps), as the host ops launch them
    "all_reduce_rmsnorm rows": (allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
                                {"WHOLE": False, "BLOCK_H": 8192, "FP8": False, "PRELOAD": True, "TRACE": False,
                                 "ROWS": tuning.RMSNORM_ROWS_AT_ONCE}, 16),
    "all_reduce_rmsnorm whole": (allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
                                 {"WHOLE": True, "BLOCK_H": 8192, "FP8": False, "PRELOAD": True, "TRACE": False,
                                  "ROWS": 1}, 16),
    "all_reduce_rmsnorm push": (allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
                                {"WHOLE": False, "BLOCK_H": 8192, "FP8": False, "PRELOAD": True, "TRACE": False,
                                 "ROWS": tuning.RMSNORM_ROWS_AT_ONCE, "PUSH": True, "WORLD": 2}, 16),
    "all_reduce_rmsnorm lamport": (allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
                                   {"WHOLE": False, "BLOCK_H": 8192, "FP8": False, "PRELOAD": True, "TRACE": False,
                                    "ROWS": 1, "LAMPORT": True, "WORLD": 2}, 16),
    "all_reduce_rmsnorm two_shot": (allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
                                    {"WHOLE": False, "BLOCK_H": 2048, "FP8": False, "PRELOAD": True, "TRACE": False,
                                     "ROWS": 1, "LAMPORT": True, "TWO_SHOT": True, "PARTS": 1, "WORLD": 4}, 16),
    "all_reduce_rmsnorm two_shot slices": (allreduce_rmsnorm_kernel.fn, {**RMSNORM_SIGNATURE, "ws": "*i64"},
                                           {"WHOLE": False, "BLOCK_H": 512, "FP8": False, "PRELOAD": True,
                                            "TRACE": False, "ROWS": 1, "LAMPORT": True, "TWO_SHOT": True, "PARTS": 4,
                                            "WORLD": 4}, 4),
    "all_reduce_rmsnorm push_two_shot": (allreduce_rmsnorm_kernel.fn, RMSNORM_SIGNATURE,
                                         {"WHOLE": False, "BLOCK_H": 8192, "FP8": False, "PRELOAD": True,
                                          "TRACE": False, "ROWS": tuning.RMSNORM_ROWS_AT_ONCE, "PUSH_TWO_SHOT": True,
                                          "BLOCK_C": 2048, "WORLD": 4}, 16),
    "all_reduce_rmsnorm split": (allreduce_rmsnorm_kernel.fn,
                                 {**RMSNORM_SIGNATURE, "ws": "*i64"},
                                 {"WHOLE": False, "BLOCK_H": 1024, "FP8": False, "PRELOAD": True, "TRACE": False,
                                  "ROWS": 1, "WORLD": 2, "SPLIT": True, "PARTS": 8}, 8),
    "all_reduce": (ops._all_reduce_kernel.fn, {"ctx": "i64", "buf": "*bf16", "n": "i32", "op": "i32",
                                               "status": "*i32", "PDL": "constexpr"}, {}, 8),
    "all_reduce lamport": (ops._all_reduce_lamport_kernel.fn,
                           {"ctx": "i64", "buf": "*bf16", "n": "i32", "status": "*i32", "inbox": "*bf16",
                            "half": "i32", "epochs": "*i32", "WORLD": "constexpr", "OP": "constexpr",
                            "BLOCK": "constexpr", "PDL": "constexpr"},
                           {"WORLD": 2, "OP": 0, "BLOCK": 1024}, 4),
}
# A PTX instruction that reads or writes memory other than the kernel's parameters and the context.
# The device library reads the context through a generic pointer (`ld.b32 [%rd..]`, no state
# space); Triton's loads and stores of tensors name .global.
_MEMORY = re.compile(r"^\s*(@!?%p\d+\s+)?(?!ld\.[bsuf]\d+\s)(ld|st|atom|red|cp|mbarrier|multimem|prefetch)\b"
                     r"(?!\.param)")


def test_memory_pattern_exempts_only_generic_loads() -> None:
    for line in ("ld.b32 %r1, [%rd2+4];", "@%p3 ld.b64 %rd1, [%rd2+88];", "ld.param.b64 %rd1, [k_param_0];"):
        assert not _MEMORY.match(line), line
    for line in ("ld.global.b32 { %r1 }, [ %rd2 + 0 ];", "st.b32 [%rd2], %r1;", "@%p1 st.global.v4.b32 [ %rd1 + 0 ], "
                 "{ %r1, %r2, %r3, %r4 };", "atom.acq_rel.sys.cas.b32 %r2, [%rd8+20], 0, -7;",
                 "ld.volatile.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];"):
        assert _MEMORY.match(line), line


def compile_ptx(name: str, cc: int, with_pdl: bool) -> str:
    fn, signature, constexprs, warps = KERNELS[name]
    k = triton.compile(ASTSource(fn, signature, {**constexprs, "PDL": with_pdl}), target=GPUTarget("cuda", cc, 32),
                       options={"extern_libs": (("ironlink", bitcode(cc)),), "num_warps": warps})
    assert k.asm["cubin"], "no cubin"
    return str(k.asm["ptx"])


@pytest.mark.parametrize("cc", CAPABILITIES)
@pytest.mark.parametrize("name", list(KERNELS))
def test_pdl_kernel_waits_before_touching_memory(name: str, cc: int) -> None:
    if cc < pdl.MIN_MAJOR * 10:
        pytest.skip(f"griddepcontrol needs sm_90; on sm_{cc} the ops launch without PDL (pdl.choose_pdl)")
    ptx = compile_ptx(name, cc, with_pdl=True)
    lines = ptx.splitlines()
    waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    assert len(waits) == 1, f"{name}: want one griddepcontrol.wait, found {len(waits)}"
    assert sum("griddepcontrol.launch_dependents" in line for line in lines) == 1
    entry = next(i for i, line in enumerate(lines) if ".entry" in line)
    before = [line.strip() for line in lines[entry:waits[0]] if _MEMORY.match(line)]
    assert not before, f"{name} touches memory before griddepcontrol.wait on sm_{cc}:\n" + "\n".join(before)
    # Every CTA reaches the wait: no return before it, and a branch before it only forward to a
    # label that is also before it (the context's checks, which rejoin).
    prologue = lines[entry:waits[0]]
    labels = {m.group(1): i for i, line in enumerate(prologue) if (m := re.match(r"^(\$\w+):", line.strip()))}
    skips = []
    for i, line in enumerate(prologue):
        m = re.match(r"^\s*(@!?%p\d+\s+)?(bra|ret|exit)(\.uni)?\b\s*(\S*?);?$", line)
        if m and not (m.group(2) == "bra" and labels.get(m.group(4), -1) > i):
            skips.append(line.strip())
    assert not skips, f"{name}: a branch that may skip griddepcontrol.wait:\n" + "\n".join(skips)
    local = [line.strip() for line in lines if re.search(r"\.local\b", line)]
    assert not local, f"{name} uses local memory on sm_{cc}:\n" + "\n".join(local[:10])


def test_pdl_off_compiles_the_kernel_without_griddepcontrol() -> None:
    # pdl=False launches the kernel as it was before PDL, on any arch (sm_80 included).
    assert "griddepcontrol" not in compile_ptx("all_reduce", 80, with_pdl=False)
