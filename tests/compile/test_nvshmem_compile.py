"""The NVSHMEM bitcode links against NVSHMEM's own and compiles to cubin for sm_90, no GPU needed.

A kernel calling every `symm_nvshmem_*` wrapper (and a P2P function, which the NVSHMEM bitcode
exports too) is compiled with ``extern_libs`` exactly as ``@ironlink.jit(nvshmem=True)`` builds
them, against the PINNED NVSHMEM 3.4.5 device bitcode (the release PyTorch 2.11 ships; LLVM 18):
linked (ptxas resolves every NVSHMEM function), ironlink's calls inlined, no local memory.

The bitcode comes from the ``nvidia-nvshmem-cu13==3.4.5`` wheel on PyPI (tests/_nvshmem_wheel.py), downloaded once with pip
into ``build/nvshmem-3.4.5/`` (or taken from ``$IRONLINK_NVSHMEM_PINNED_WHEEL``, a wheel file).
The tests skip, saying so, only when that download fails (no network).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import ironlink
import ironlink.language as il
from ironlink.language import _abi, _lib, _nvshmem
from ironlink.runtime import tuning
from ironlink.fused.all_gather_matmul import COPY_COLS as GATHER_COPY_COLS
from ironlink.fused.all_gather_matmul_kernels import allgather_matmul_hierarchical_kernel
from ironlink.fused.all_reduce_rmsnorm_kernels import allreduce_rmsnorm_hierarchical_kernel
from ironlink.fused.matmul_all_reduce_kernels import matmul_allreduce_hierarchical_kernel
from ironlink.fused.matmul_reduce_scatter import COPY_COLS as SCATTER_COPY_COLS
from ironlink.fused.matmul_reduce_scatter_kernels import matmul_reducescatter_hierarchical_kernel
from ironlink.constants import CMP_GE, SIGNAL_OP_ADD

from _archs import sampled
from _compile import fresh_triton_cache  # noqa: F401 - tests/, beside this file; the fixture applies here
from _nvshmem_wheel import PINNED, extract, ironlink_declarations, ironlinks_part  # tests/, beside this file


@pytest.fixture(scope="module")
def nvshmem_bc() -> Path:
    return extract("libnvshmem_device.bc")


@pytest.fixture(scope="module")
def nvshmem_needed_bc() -> Path:
    """What of NVSHMEM's bitcode ironlink's wrappers link (`needed_part`): the same definitions,
    without parsing the whole library in every compile. The collectives' and fused ops' cases
    link it, and the signatures are read from it (its definitions are the file's, whole; a
    function the file lacks stays a declaration there); the cases of linking itself (the
    wrappers' test kernel, the order) link the file."""
    return ironlinks_part()


@triton.jit
def nvshmem_kernel(ctx, dst, src, sig, nbytes, pe, out):
    r = il.symm_nvshmem_put_signal(dst, src, nbytes, sig, 1, SIGNAL_OP_ADD, pe)
    r += il.symm_nvshmem_quiet(0)
    r += il.symm_nvshmem_signal_wait(sig, CMP_GE, 1)
    near = il.symm_nvshmem_ptr(dst, pe) != 0
    r += il.symm_nvshmem_n_pes(0) * 100 + il.symm_nvshmem_my_pe(0) + near.to(tl.int32)
    r += il.symm_rank(ctx)  # a P2P export: the NVSHMEM bitcode carries those too
    tl.store(out, r)


SIGNATURE = {"ctx": "i64", "dst": "*u8", "src": "*u8", "sig": "*u64", "nbytes": "i64", "pe": "i32", "out": "*i32"}


def assert_linked(ptx: str, inlined: tuple[str, ...], local_memory: bool = False) -> None:
    """`ptx` calls none of `inlined` (inlined), declares no undefined function (every NVSHMEM call
    resolved), holds NVSHMEM's device state (what nvshmemx_cumodule_init fills in at load: the
    put path was linked, not optimized away) and, unless `local_memory`, uses no local memory."""
    for name in inlined:
        assert not re.search(rf"\bcall(\.uni)?\b[^;]*\b{name}\b", ptx), f"{name} was not inlined"
    unresolved = re.findall(r"^\s*\.extern\s+\.func[^\n]*", ptx, re.MULTILINE)
    assert not unresolved, f"functions left undefined: {unresolved}"
    if not local_memory:
        local = [line.strip() for line in ptx.splitlines() if re.search(r"\.local\b", line)]
        assert not local, "local memory:\n" + "\n".join(local[:10])
    assert re.search(r"\bnvshmemi_device_state_d\b", ptx)


def test_links_inlines_and_uses_no_local_memory(nvshmem_bc: Path) -> None:
    kernel = ironlink.jit(nvshmem_kernel, arch="sm_90", nvshmem=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(_nvshmem.ENV_NVSHMEM_BITCODE, str(nvshmem_bc))
        libs = kernel.extern_libs()
    assert list(libs) == ["ironlink", "libnvshmem_device"]  # ironlink first: it calls NVSHMEM
    assert Path(libs["ironlink"]).name == "ironlink_nvshmem_sm90.bc"
    k = triton.compile(ASTSource(nvshmem_kernel, SIGNATURE, {}), target=GPUTarget("cuda", 90, 32),
                       options={"extern_libs": tuple(libs.items())})
    assert k.asm["cubin"]
    assert_linked(k.asm["ptx"], (*_abi.NVSHMEM_FUNCTIONS, "symm_rank"))


@triton.jit
def call_kernel(out, args, FN: tl.constexpr):
    tl.store(out, FN(*args))


HIERARCHICAL = sorted(name for name in _abi.FUNCTIONS if name.endswith("_hierarchical"))


@pytest.mark.parametrize("name", sampled(HIERARCHICAL, ["symm_all_reduce_hierarchical", "symm_tile_all_reduce_hierarchical"]))
def test_hierarchical_collectives_link_the_network(name: str, nvshmem_needed_bc: Path) -> None:
    # In the NVSHMEM bitcode the cross-node exchange is compiled in (the P2P one leaves it out):
    # it must link against NVSHMEM's put-with-signal and quiet, inline, and use no local memory.
    kernel = ironlink.jit(call_kernel, arch="sm_90", nvshmem=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(_nvshmem.ENV_NVSHMEM_BITCODE, str(nvshmem_needed_bc))
        libs = kernel.extern_libs()
    args, ret, _ = _abi.FUNCTIONS[name]
    arg_types = tuple("*fp32" if t == "i64" and a.endswith("ptr") else t for a, t in args)
    signature = {"out": "*" + ret, "args": arg_types, "FN": "constexpr"}
    k = triton.compile(ASTSource(call_kernel, signature, {"FN": getattr(il, name)}),
                       target=GPUTarget("cuda", 90, 32), options={"extern_libs": tuple(libs.items())})
    assert k.asm["cubin"]
    assert_linked(k.asm["ptx"], (name,))


# The fused ops' kernels for heaps of several nodes (a grid barrier and a hierarchical collective
# next to a producer): linked the same way, inlined, no local memory.
_RMSNORM = {"ctx": "i64", "x": "*bf16", "residual": "*bf16", "residual_out": "*bf16", "weight": "*bf16", "out": "*bf16",
            "scale": "*fp32", "T": "i32", "H": "i32", "eps": "fp32", "status": "*i32", "WHOLE": "constexpr",
            "BLOCK_H": "constexpr", "FP8": "constexpr"}
_GEMM = {"BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
_MATMUL = {"ctx": "i64", "a": "*bf16", "b": "*bf16", "out": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "stride_am": "i32", "stride_ak": "i32", "stride_bk": "i32", "stride_bn": "i32", "status": "*i32",
           **_GEMM, "GROUP_M": "constexpr"}
_GATHER_MATMUL = {"ctx": "i64", "a_shard": "*bf16", "a_full": "*bf16", "b": "*bf16", "out": "*bf16", "ROWS": "i32",
                  "N": "i32", "K": "i32", "stride_sm": "i32", "stride_sk": "i32", "stride_bk": "i32", "stride_bn": "i32",
                  "status": "*i32", **_GEMM, "GROUP_M": "constexpr", "COPY_COLS": "constexpr", "WORLD": "constexpr"}
_MATMUL_SCATTER = {"ctx": "i64", "a": "*bf16", "b": "*bf16", "out": "*bf16", "ws": "*bf16", "M": "i32", "N": "i32",
                   "K": "i32", "stride_am": "i32", "stride_ak": "i32", "stride_bk": "i32", "stride_bn": "i32",
                   "stride_om": "i32", "stride_on": "i32", "status": "*i32", **_GEMM, "GROUP_M": "constexpr",
                   "WORLD": "constexpr", "COPY_COLS": "constexpr"}


def _tiles(m: int) -> dict[str, object]:
    c = tuning.matmul_config(m, 8192, 2048, 4)
    return {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "num_warps": c.warps,
            "num_stages": c.stages}


# name -> (kernel, signature, constants and launch options, the ironlink functions it must link)
FUSED: dict[str, tuple[object, dict[str, str], dict[str, object], tuple[str, ...]]] = {
    "allreduce_rmsnorm_whole": (allreduce_rmsnorm_hierarchical_kernel, _RMSNORM,
                                {"WHOLE": True, "BLOCK_H": 8192, "FP8": False, "num_warps": 16},
                                ("symm_all_reduce_hierarchical", "symm_grid_barrier")),
    "allreduce_rmsnorm_rows": (allreduce_rmsnorm_hierarchical_kernel, _RMSNORM,
                               {"WHOLE": False, "BLOCK_H": 8192, "FP8": False, "num_warps": 16},
                               ("symm_tile_all_reduce_hierarchical",))}
for _m in (16, 4096):
    _group = {"GROUP_M": tuning.matmul_config(_m, 8192, 2048, 4).group_m}
    FUSED[f"matmul_allreduce_m{_m}"] = (matmul_allreduce_hierarchical_kernel, _MATMUL, {**_tiles(_m), **_group},
                                        ("symm_all_reduce_hierarchical", "symm_grid_barrier"))
    FUSED[f"allgather_matmul_m{_m}"] = (
        allgather_matmul_hierarchical_kernel, _GATHER_MATMUL,
        {**_tiles(_m), **_group, "COPY_COLS": GATHER_COPY_COLS, "WORLD": 4},
        ("symm_all_gather_hierarchical", "symm_grid_barrier", "symm_rank"))
    FUSED[f"matmul_reducescatter_m{_m}"] = (
        matmul_reducescatter_hierarchical_kernel, _MATMUL_SCATTER,
        {**_tiles(_m), **_group, "WORLD": 4, "COPY_COLS": SCATTER_COPY_COLS},
        ("symm_reduce_scatter_hierarchical", "symm_grid_barrier", "symm_rank"))


@pytest.mark.parametrize("name", sampled(list(FUSED), ["allreduce_rmsnorm_rows", "matmul_allreduce_m16",
                                                     "allgather_matmul_m16", "matmul_reducescatter_m16"]))
def test_fused_ops_for_several_nodes_link_and_inline(name: str, nvshmem_needed_bc: Path) -> None:
    kernel, signature, given, functions = FUSED[name]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(_nvshmem.ENV_NVSHMEM_BITCODE, str(nvshmem_needed_bc))
        # As a launch on a context of several nodes links them (`ironlink.language.topology`).
        libs = ironlink.jit(kernel.fn, arch="sm_90", nvshmem=True).extern_libs(several_nodes=True)  # type: ignore[attr-defined]
    assert list(libs) == ["ironlink_several_nodes", "libnvshmem_device"]
    constants = {k: v for k, v in given.items() if not k.startswith("num_")}
    options = {k: v for k, v in given.items() if k.startswith("num_")}
    k = triton.compile(ASTSource(kernel.fn, signature, constants), target=GPUTarget("cuda", 90, 32),  # type: ignore[attr-defined]
                       options={"extern_libs": tuple(libs.items()), **options})
    assert k.asm["cubin"]
    assert_linked(k.asm["ptx"], functions)
    called = set(re.findall(r'symbol = "(\w+)"', k.asm["ttir"]))
    assert {f for f in functions if f.endswith("_hierarchical")} <= called  # the hierarchical algorithms


def test_the_wrong_order_leaves_nvshmem_unresolved(nvshmem_bc: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Why extern_libs puts ironlink first: Triton links each library only for what is already
    # needed, so NVSHMEM first contributes nothing and its functions stay undefined. (A cache of
    # its own: Triton's cache key sorts extern_libs, so both orders would share one entry.)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    libs = (("libnvshmem_device", str(nvshmem_bc)), ("ironlink", _lib.bitcode_path("sm_90", nvshmem=True)))
    with pytest.raises(Exception, match="Unresolved extern function 'nvshmem"):
        triton.compile(ASTSource(nvshmem_kernel, SIGNATURE, {}), target=GPUTarget("cuda", 90, 32),
                       options={"extern_libs": libs})


def test_pinned_bitcode_defines_what_the_wrappers_declare(nvshmem_needed_bc: Path) -> None:
    # The prototypes in device/src/hw/nvshmem.rs against the pinned release's definitions: a type
    # mismatch would link a call through a wrong signature.
    declared = ironlink_declarations()
    assert set(declared) == {"nvshmemx_putmem_signal_nbi_block", "nvshmem_signal_wait_until", "nvshmem_quiet",
                             "nvshmem_ptr", "nvshmem_my_pe", "nvshmem_n_pes"}
    theirs = _lib.bitcode_signatures(nvshmem_needed_bc)
    for name, line in declared.items():
        m = re.match(r"declare\s+(?P<pre>.*?)@\w+\((?P<args>.*)\)", line)
        assert m is not None
        args = tuple(_lib._leading_type(a) for a in _lib._split_top_level(m.group("args")))
        ret = _lib._trailing_type(m.group("pre").strip())
        assert theirs.get(name) == (args, ret), f"{name}: ours {(args, ret)}, NVSHMEM {PINNED}'s {theirs.get(name)}"

