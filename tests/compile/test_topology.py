"""One name per collective, no GPU needed: `@ironlink.jit` compiles a kernel for the topology of
the context it is launched on, and the language wrappers call the hierarchical symbol only in a
kernel compiled for several nodes (`ironlink.language.topology`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import triton
import triton.language as tl
from triton.runtime.jit import KernelInterface

import ironlink
import ironlink.language as il
import ironlink.typed as ilt
from ironlink.language import _abi, _lib, _nvshmem, topology

from _compile import fresh_triton_cache, ttir_for  # noqa: F401 - the fixture applies here

SEVERAL = topology.SEVERAL_NODES_LIB_NAME


@triton.jit
def typed_all_reduce(ctx, x, n, status):
    tl.store(status, ilt.all_reduce(ctx, x, n))


@triton.jit
def raw_barrier(ctx, status):
    tl.store(status, il.symm_barrier(ctx))


def ttir(fn: Any, signature: dict[str, str], key: str) -> str:
    """`fn` traced with the P2P bitcode linked under `key` (the hierarchical symbols are in it too)."""
    return ttir_for(90, fn, signature, {}, extern_libs=((key, _lib.bitcode_path("sm_90")),))


@pytest.mark.parametrize("key, symbol", [("ironlink", "symm_all_reduce"), (SEVERAL, "symm_all_reduce_hierarchical")])
def test_typed_collectives_follow_the_linked_topology(key: str, symbol: str) -> None:
    ir = ttir(typed_all_reduce, {"ctx": "i64", "x": "*bf16", "n": "i32", "status": "*i32"}, key)
    assert f'symbol = "{symbol}"' in ir
    if key == "ironlink":
        assert "_hierarchical" not in ir


@pytest.mark.parametrize("key, symbol", [("ironlink", "symm_barrier"), (SEVERAL, "symm_barrier_hierarchical")])
def test_raw_wrappers_follow_the_linked_topology(key: str, symbol: str) -> None:
    assert f'symbol = "{symbol}"' in ttir(raw_barrier, {"ctx": "i64", "status": "*i32"}, key)


def test_twins_are_internal() -> None:
    twins = [f for f in _abi.FUNCTIONS if f.endswith("_hierarchical")]
    assert twins and not set(twins) & set(il.__all__)
    assert all(callable(getattr(il, f)) for f in twins)  # still callable by their own names
    assert not [f for f in dir(ilt) if f.endswith("_hierarchical")]
    assert "symm_all_reduce_hierarchical" in (il.symm_all_reduce.__doc__ or "")


class _Recorder(KernelInterface[Any]):
    """Stands in for a JITFunction: records what each launch passed."""

    arg_names = ["x", "ctx", "status"]
    __name__ = "recorded"

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        self.calls.append({"args": args, **kwargs})


@pytest.fixture
def no_nvshmem_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """NVSHMEM's bitcode found at a file of ours; kernels registered for the load hook recorded."""
    registered: list[str] = []
    nv = tmp_path / "libnvshmem_device.bc"
    nv.write_bytes(b"")
    monkeypatch.setenv(_nvshmem.ENV_NVSHMEM_BITCODE, str(nv))
    monkeypatch.setattr(_nvshmem, "register_kernel", registered.append)
    monkeypatch.setattr(_nvshmem, "check_usable", lambda: None)
    return registered


def test_a_launch_on_a_context_of_several_nodes_links_nvshmem_for_it(no_nvshmem_state: list[str]) -> None:
    inner = _Recorder()
    kernel = ironlink.jit(inner, arch="sm_90")
    one, several = 0x1000, 0x2000
    topology.mark_several_nodes(several)
    try:
        kernel[(1,)]("x", one, "status")
        kernel[(1,)]("x", several, "status")
        kernel[(1,)]("x", ctx=several, status="status")
    finally:
        topology.forget(several)
    kernel[(1,)]("x", several, "status")  # forgotten (its heap closed): one node again
    libs = [c["extern_libs"] for c in inner.calls]
    assert list(libs[0]) == ["ironlink"] and Path(libs[0]["ironlink"]).name == "ironlink_sm90.bc"
    for several_libs in libs[1:3]:
        assert list(several_libs) == [SEVERAL, "libnvshmem_device"]
        assert Path(several_libs[SEVERAL]).name == "ironlink_nvshmem_sm90.bc"
    assert list(libs[3]) == ["ironlink"]
    assert no_nvshmem_state == ["recorded"]  # the NVSHMEM load hook knows the kernel from then on


def test_pinned_topology_overrides_the_context(no_nvshmem_state: list[str]) -> None:
    inner = _Recorder()
    several = 0x3000
    topology.mark_several_nodes(several)
    try:
        ironlink.jit(inner, arch="sm_90", several_nodes=False)[(1,)]("x", several, "s")
        # Pinned several nodes on the P2P bitcode: the hierarchical algorithms on one node (tests).
        ironlink.jit(inner, arch="sm_90", several_nodes=True)[(1,)]("x", 0x10, "s")
    finally:
        topology.forget(several)
    assert list(inner.calls[0]["extern_libs"]) == ["ironlink"]
    assert list(inner.calls[1]["extern_libs"]) == [SEVERAL]
    assert Path(inner.calls[1]["extern_libs"][SEVERAL]).name == "ironlink_sm90.bc"
    assert no_nvshmem_state == []


def test_a_users_ironlink_entry_wins_under_either_key() -> None:
    kernel = ironlink.jit(_Recorder(), arch="sm_90")
    assert kernel.extern_libs({"ironlink": "/mine.bc"}, several_nodes=True) == {SEVERAL: "/mine.bc"}
    assert kernel.extern_libs({SEVERAL: "/mine.bc", "x": "/x.bc"}) == {"x": "/x.bc", "ironlink": "/mine.bc"}


def test_only_ints_that_were_marked_are_contexts_of_several_nodes() -> None:
    topology.mark_several_nodes(0x4000)
    try:
        assert topology.spans_several_nodes(0x4000)
        assert not topology.spans_several_nodes(0x4001)
        assert not topology.spans_several_nodes("0x4000") and not topology.spans_several_nodes(None)
    finally:
        topology.forget(0x4000)
    assert not topology.spans_several_nodes(0x4000)
