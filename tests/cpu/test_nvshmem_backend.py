"""CPU tests of the NVSHMEM backend's Python side (`SymmetricHeap(..., backend="nvshmem")`): the
argument checks, the backend selection in PyTorch's symmetric memory, the address arithmetic
over the rendezvous handle, the creation flow against fakes of torch and the extension, and the
extension's own checks of an external heap. No GPU and no torch needed.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable, Optional

import pytest

from ironlink.language import _abi
from ironlink.runtime.errors import IronlinkError
from ironlink.runtime.heap import SymmetricHeap
from ironlink.runtime.backends import BACKENDS, check_backend, check_node_size
from ironlink.runtime.nvshmem_memory import buffer_offset, check_spans_world, open_heap, peer_bases, prepare_backend

from _native import native  # noqa: F401 - the fixture that builds or imports the extension


def test_backend_names() -> None:
    assert check_backend("p2p") == "p2p" and check_backend("NVSHMEM") == "nvshmem"
    assert BACKENDS == {"p2p": _abi.BACKEND["P2P"], "nvshmem": _abi.BACKEND["NVSHMEM"]}
    with pytest.raises(ValueError, match=r"'p2p', 'nvshmem', got 'nccl'"):
        check_backend("nccl")
    with pytest.raises(TypeError, match="backend must be a str"):
        check_backend(2)
    # Checked before anything needs the extension, torch or a GPU.
    with pytest.raises(ValueError, match="backend must be one of"):
        SymmetricHeap(1 << 20, backend="cuda")


def test_nvshmem_heap_spans_the_whole_job() -> None:
    check_spans_world(4, 4)
    with pytest.raises(ValueError, match="all 8 processes .* this group has 4"):
        check_spans_world(4, 8)


def test_node_size() -> None:
    assert check_node_size(None, "nvshmem", 16, None) == 16  # one node unless told
    assert check_node_size(None, "nvshmem", 16, "8") == 8  # torchrun's LOCAL_WORLD_SIZE
    assert check_node_size(None, "nvshmem", 16, "3") == 16  # does not divide: one node
    assert check_node_size(None, "p2p", 4, "2") == 4  # the p2p heap is one node
    assert check_node_size(2, "nvshmem", 4, "4") == 2  # simulated nodes: explicit wins
    assert check_node_size(4, "p2p", 4, None) == 4
    with pytest.raises(ValueError, match="needs backend='nvshmem'"):
        check_node_size(2, "p2p", 4, None)
    with pytest.raises(ValueError, match=r"node_size must be 1..8 and divide the group's 12 ranks, got 5"):
        check_node_size(5, "nvshmem", 12, None)
    with pytest.raises(ValueError, match="at most 32"):
        check_node_size(1, "nvshmem", 64, None)
    with pytest.raises(TypeError, match="node_size must be an int"):
        check_node_size(2.0, "nvshmem", 4, None)  # type: ignore[arg-type]


class _FakeSymmMem:
    """`torch.distributed._symmetric_memory` as far as backend selection goes."""

    def __init__(self, available: bool, current: Optional[str], locked: bool = False) -> None:
        self.available, self.current, self.locked = available, current, locked
        self.set_calls: list[str] = []

    def is_nvshmem_available(self) -> bool:
        return self.available

    def get_backend(self, device: Any) -> Optional[str]:
        return self.current

    def set_backend(self, name: str) -> None:
        self.set_calls.append(name)
        if self.locked:
            raise RuntimeError("Cannot set backend after allocation")
        self.current = name


def test_backend_selection() -> None:
    s = _FakeSymmMem(available=True, current="CUDA")
    prepare_backend(s, "cuda:0")
    assert s.set_calls == ["NVSHMEM"] and s.current == "NVSHMEM"
    prepare_backend(s, "cuda:0")  # already selected: nothing to change
    assert s.set_calls == ["NVSHMEM"]
    with pytest.raises(IronlinkError, match=r"is_nvshmem_available\(\) is false.*backend='p2p'"):
        prepare_backend(_FakeSymmMem(available=False, current=None), "cuda:0")
    with pytest.raises(IronlinkError, match="does not offer"):
        prepare_backend(types.SimpleNamespace(), "cuda:0")  # a torch without the function
    with pytest.raises(IronlinkError, match=r"already allocates from 'CUDA'.*Cannot set backend"):
        prepare_backend(_FakeSymmMem(available=True, current="CUDA", locked=True), "cuda:0")


def test_address_arithmetic() -> None:
    ptrs = [0x7000_0000, 0x9000_0000, 0]
    assert buffer_offset(ptrs, 1 << 20, 0x9000_0000, 1, 1 << 20) == 0
    assert buffer_offset(ptrs, 1 << 20, 0x9000_1000, 1, 4096) == 0x1000
    with pytest.raises(IronlinkError, match="not inside the rendezvoused buffer"):
        buffer_offset(ptrs, 1 << 20, 0x9000_1000, 1, 1 << 20)
    with pytest.raises(IronlinkError, match="not inside"):
        buffer_offset(ptrs, 1 << 20, 0x8fff_f000, 1, 16)
    # Same offset everywhere: each peer's base moves by it; an unreachable peer stays 0.
    assert peer_bases(ptrs, [0x1000] * 3) == [0x7000_1000, 0x9000_1000, 0]
    with pytest.raises(IronlinkError, match=r"different offsets .*rank 0: 0, rank 1: 4096"):
        peer_bases(ptrs[:2], [0, 0x1000])


class _FakeTorch:
    """The pieces of torch that `allocate` uses."""

    uint8 = "uint8"

    class cuda:
        @staticmethod
        def device(d: Any) -> Any:
            import contextlib

            return contextlib.nullcontext()


class _Buffer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class _FakeNative:
    """The extension's `heap_layout` and `Heap.over_external`, recording what they were given."""

    def __init__(self, fail: bool = False) -> None:
        self.opened: list[tuple[Any, ...]] = []
        self.closed = 0
        native = self

        class Heap:
            @staticmethod
            def over_external(*args: Any) -> Any:
                native.opened.append(args)
                if fail:
                    raise IronlinkError("no driver")
                return native

        self.Heap = Heap

    def heap_layout(self, heap: int, scratch: int) -> tuple[int, int, int]:
        return (heap, 8192, scratch)

    def close(self) -> None:
        self.closed += 1


def _fake_symm_mem(monkeypatch: pytest.MonkeyPatch, ptrs: list[int], offset: int) -> _FakeSymmMem:
    s = _FakeSymmMem(available=True, current="CUDA")
    allocated: list[Any] = []

    def empty(total: int, dtype: Any, device: Any) -> _Buffer:
        allocated.append((total, dtype, device))
        return _Buffer(ptrs[1] + offset)

    def rendezvous(t: Any, group: Any) -> Any:
        return types.SimpleNamespace(buffer_ptrs=ptrs, buffer_size=1 << 30)

    s.empty, s.rendezvous, s.allocated = empty, rendezvous, allocated  # type: ignore[attr-defined]
    torch_mod = types.ModuleType("torch")
    dist = types.ModuleType("torch.distributed")
    torch_mod.distributed = dist  # type: ignore[attr-defined]
    dist._symmetric_memory = s  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch_mod)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setitem(sys.modules, "torch.distributed._symmetric_memory", s)  # type: ignore[arg-type]
    return s


class _Alone:
    """A `Rendezvous` for rank `rank` of `world` whose other ranks give the same values and fail
    the step `fail_elsewhere` (the group object is "pg")."""

    def __init__(self, rank: int, world: int, fail_elsewhere: Optional[str] = None) -> None:
        self.group = self.pg = "pg"
        self.rank, self.world, self.nccl = rank, world, False
        self.fail_elsewhere = fail_elsewhere

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj] * self.world

    def agree(self, step: Callable[[], Any], what: str) -> Any:
        result = step()
        if what == self.fail_elsewhere:
            raise IronlinkError(f"{what} failed on rank 0: boom")
        return result


def test_open_heap_builds_the_context_from_the_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    ptrs = [0x7000_0000, 0x9000_0000, 0xb000_0000]
    s = _fake_symm_mem(monkeypatch, ptrs, offset=0x2000)
    native = _FakeNative()
    device = types.SimpleNamespace(index=5)
    heap, buf = open_heap(native, _FakeTorch, _Alone(1, 3), device, 4096, 65536, 3)  # type: ignore[arg-type]
    assert heap is native and s.set_calls == ["NVSHMEM"]
    assert s.allocated == [(4096 + 8192 + 65536, "uint8", device)]  # type: ignore[attr-defined]
    assert buf.offset == 0x2000
    backend = _abi.BACKEND["NVSHMEM"]
    assert native.opened == [(5, 4096, 65536, 1, 3, backend, [p + 0x2000 for p in ptrs], 0)]  # 0: one node


def test_open_heap_closes_its_heap_when_another_rank_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_symm_mem(monkeypatch, [0x7000_0000, 0x9000_0000], offset=0)
    native = _FakeNative()
    device = types.SimpleNamespace(index=0)
    with pytest.raises(IronlinkError, match="opening the NVSHMEM symmetric heap failed on rank 0"):
        open_heap(native, _FakeTorch, _Alone(1, 2, "opening the NVSHMEM symmetric heap"),  # type: ignore[arg-type]
                  device, 4096, 0, 2)
    assert native.closed == 1


def test_open_heap_stops_before_allocating_without_nvshmem(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _fake_symm_mem(monkeypatch, [0x7000_0000, 0x9000_0000], offset=0)
    s.available = False
    with pytest.raises(IronlinkError, match="is_nvshmem_available"):
        open_heap(_FakeNative(), _FakeTorch, _Alone(0, 2), types.SimpleNamespace(index=0),  # type: ignore[arg-type]
                  4096, 0, 2)
    assert s.allocated == []  # type: ignore[attr-defined]


# -- the extension ----------------------------------------------------------------------------


def test_native_heap_layout(native: Any) -> None:  # noqa: F811 - the fixture
    heap, signal, scratch = native.heap_layout(1000, 5000)
    assert (heap, scratch) == (4096, 8192)
    assert signal == native.SIGNAL_BYTES and signal >= _abi.SIGNAL_LAYOUT["MIN_BYTES"]
    with pytest.raises(IronlinkError, match="at least 1 byte"):
        native.heap_layout(0, 0)


def test_native_external_heap_checks(native: Any) -> None:  # noqa: F811 - the fixture
    nv = _abi.BACKEND["NVSHMEM"]
    # Checked before the driver is touched: the same message with or without a GPU.
    with pytest.raises(IronlinkError, match=r"no load/store address for .* rank\(s\) 1, 3 .*one node"):
        native.Heap.over_external(0, 4096, 0, 0, 4, nv, [1 << 20, 0, 2 << 20, 0])
    with pytest.raises(IronlinkError, match="backend kind NVSHMEM"):
        native.Heap.over_external(0, 4096, 0, 0, 2, _abi.BACKEND["P2P"], [1 << 20, 2 << 20])
    with pytest.raises(IronlinkError, match="one buffer address per rank"):
        native.Heap.over_external(0, 4096, 0, 0, 2, nv, [1 << 20])
    # Several nodes: only this rank's node needs addresses; a hole there is still refused.
    with pytest.raises(IronlinkError, match=r"rank\(s\) 1 "):
        native.Heap.over_external(0, 4096, 0, 0, 4, nv, [1 << 20, 0, 0, 0], 2)
    with pytest.raises(IronlinkError, match="node size 3 must be 1..=8 and divide the world size 4"):
        native.Heap.over_external(0, 4096, 0, 0, 4, nv, [1 << 20, 2 << 20, 0, 0], 3)
    if not native.driver_available():
        with pytest.raises(IronlinkError, match="libcuda"):
            native.Heap.over_external(0, 4096, 0, 0, 2, nv, [1 << 20, 2 << 20])
        with pytest.raises(IronlinkError, match="libcuda"):
            native.Heap.over_external(0, 4096, 0, 0, 4, nv, [1 << 20, 2 << 20, 0, 0], 2)


def test_open_heap_refuses_one_rank_before_touching_nvshmem(monkeypatch: pytest.MonkeyPatch) -> None:
    s = _fake_symm_mem(monkeypatch, [0x7000_0000], offset=0)
    native = _FakeNative()
    with pytest.raises(IronlinkError, match="at least 2 ranks"):
        open_heap(native, _FakeTorch, _Alone(0, 1), types.SimpleNamespace(index=0), 4096, 0, 1)  # type: ignore[arg-type]
    assert s.set_calls == [] and native.opened == []
