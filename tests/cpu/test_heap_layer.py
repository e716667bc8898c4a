"""CPU tests of the symmetric-heap layer: no GPU, no torch needed.

They cover the argument checks that run before anything touches a GPU, the pure helpers, and the
compiled extension (`ironlink._native`): its context layout against the ABI projection, its
constants, DLPack capsules over host memory (with numpy), and a clean IronlinkError (not a crash)
when no CUDA driver is present. If the extension is not installed, it is built with cargo into
target/pyext and loaded from a temporary directory appended to the package path, so the source
tree stays clean.
"""

from __future__ import annotations

import gc
import inspect
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

import ironlink
from ironlink.language import _abi
from ironlink.runtime import tuning
from ironlink.runtime.errors import CALL_COMPARISON_DETAIL, IronlinkError, device_error, function_name, status_name
from ironlink.runtime.heap import SymmetricHeap
from ironlink.runtime.heap_args import check_size, check_timeout, normalize_shape, span_bytes
from ironlink.runtime.rendezvous import Rendezvous, gather_failures, same_requests

REPO = Path(__file__).resolve().parents[2]
from _native import native  # noqa: E402,F401 - tests/, beside this file; the fixture applies here

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


# -- pure Python: no extension, no torch --------------------------------------------------


def test_error_type_and_device_messages():
    assert issubclass(IronlinkError, RuntimeError)
    assert status_name(_abi.STATUS["TIMEOUT"]) == "TIMEOUT"
    assert status_name(-1234) == "status -1234"
    assert function_name(list(_abi.FUNCTIONS).index("symm_rank")) == "symm_rank"
    e = device_error(_abi.STATUS["TIMEOUT"], list(_abi.FUNCTIONS).index("symm_peer_ptr"), rank=3)
    assert e.status == _abi.STATUS["TIMEOUT"] and e.function == "symm_peer_ptr"
    assert "symm_peer_ptr on rank 3 recorded TIMEOUT (-7)" in str(e)
    host = device_error(_abi.STATUS["TIMEOUT"], CALL_COMPARISON_DETAIL, rank=0)  # recorded by check=True's comparison
    assert str(host).startswith("the comparison of the ranks' calls (check=True) on rank 0 recorded TIMEOUT (-7): ")
    assert host.function == "the comparison of the ranks' calls (check=True)"


def test_argument_checks_need_no_gpu():
    # These fail before torch, the extension or a GPU is touched.
    with pytest.raises(ValueError, match="nbytes must be >= 1"):
        SymmetricHeap(0)
    with pytest.raises(TypeError, match="nbytes must be an int"):
        SymmetricHeap(1.5)
    with pytest.raises(TypeError, match="nbytes must be an int"):
        SymmetricHeap(True)
    with pytest.raises(ValueError, match="scratch_bytes"):
        SymmetricHeap(1 << 20, scratch_bytes=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        SymmetricHeap(1 << 20, timeout_s=0)
    with pytest.raises(ValueError, match="timeout_s"):
        SymmetricHeap(1 << 20, timeout_s=float("inf"))
    assert check_size("n", 5, 1) == 5
    assert check_timeout(2.5) == 2_500_000_000


def test_shape_and_span_helpers():
    assert normalize_shape(5) == (5,)
    assert normalize_shape([2, 3]) == (2, 3)
    with pytest.raises(ValueError):
        normalize_shape((2, -1))
    assert span_bytes((4, 3), (3, 1), 4) == 48
    assert span_bytes((4, 3), (1, 4), 2) == 24  # transposed
    assert span_bytes((2, 3), (6, 1), 4) == (6 + 2 + 1) * 4  # row slice of a wider buffer
    assert span_bytes((0, 3), (3, 1), 4) == 0


def test_collective_agreement_helpers():
    assert same_requests([(10, 0), (10, 0)]) is None
    msg = same_requests([(1 << 20, 0), (2 << 20, 0), (1 << 20, 0)])
    assert "ranks 0, 2: nbytes=1048576" in msg and "rank 1: nbytes=2097152" in msg
    assert gather_failures([("ok", 1), ("ok", 2)]) is None
    assert gather_failures([("ok", 1), ("error", "boom")]) == "rank 1: boom"
    assert gather_failures([("error", "x"), ("error", "x")]) == "all ranks: x"
    assert gather_failures([("error", "x"), ("ok", 0), ("error", "x"), ("error", "y")]) == "ranks 0, 2: x; rank 3: y"


@pytest.mark.skipif(HAVE_TORCH, reason="checks the message shown when torch is missing")
def test_heap_without_torch_is_a_clear_error(native):
    with pytest.raises(IronlinkError, match="PyTorch"):
        SymmetricHeap(1 << 20)


# -- the compiled extension -------------------------------------------------------------


def test_native_context_layout_matches_abi(native):
    layout = {name: (off, size) for name, off, size in native.context_layout()}
    assert layout == _abi.CONTEXT_FIELDS
    assert native.CONTEXT_SIZE == _abi.CONTEXT_SIZE
    assert native.ABI_VERSION == _abi.ABI_VERSION == ironlink.ABI_VERSION


def test_native_constants(native):
    min_bytes = _abi.SIGNAL_LAYOUT["MIN_BYTES"]
    assert native.MIN_SIGNAL_BYTES == min_bytes
    assert native.SIGNAL_BYTES >= min_bytes and native.SIGNAL_BYTES % native.REGION_ALIGN == 0
    assert native.ALLOC_ALIGN == 256
    assert ironlink.runtime.heap.DEFAULT_SCRATCH_BYTES == _abi.THRESHOLDS["DEFAULT_SCRATCH_BYTES"]


def test_default_timeout_is_the_device_default() -> None:
    default = inspect.signature(SymmetricHeap).parameters["timeout_s"].default
    assert check_timeout(default) == _abi.DEFAULT_TIMEOUT_NS


def test_no_driver_is_a_clean_error(native):
    if native.driver_available():
        pytest.skip("a CUDA driver is present; this checks the no-driver path")
    with pytest.raises(IronlinkError, match="libcuda"):
        native.LocalHeap.create(0, 1 << 20, 0, 0, 1)
    with pytest.raises(IronlinkError, match="libcuda"):
        native.device_count()
    with pytest.raises(IronlinkError, match="libcuda"):
        native.stream_create(0)


def test_native_argument_errors(native):
    with pytest.raises(IronlinkError, match="rank 2 is outside 0..2"):
        native.LocalHeap.create(0, 1 << 20, 0, 2, 2)
    with pytest.raises(IronlinkError, match="world size 9"):
        native.LocalHeap.create(0, 1 << 20, 0, 0, 9)
    with pytest.raises(IronlinkError, match="at least 1 byte"):
        native.LocalHeap.create(0, 0, 0, 0, 1)


def test_external_context_signal_pad_too_small(native):
    with pytest.raises(IronlinkError, match=rf"set_signal_pad_size\({_abi.SIGNAL_LAYOUT['MIN_BYTES']}\)"):
        native.ExternalContext(0, 0, 2, [0x1000, 0x2000], 1 << 20, [0x3000, 0x4000], 2048)
    with pytest.raises(IronlinkError, match="one buffer and one signal pad pointer per rank"):
        native.ExternalContext(0, 0, 2, [0x1000], 1 << 20, [0x3000, 0x4000], 1 << 20)


class _Owner:
    """Host memory whose lifetime we observe through a weak reference."""

    def __init__(self, n):
        import numpy as np

        self.buf = np.arange(n, dtype=np.uint8)


class _Exporter:
    """Hands our capsule to numpy through the DLPack protocol."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        cap, self.capsule = self.capsule, None
        return cap

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def test_dlpack_capsule_shares_memory_and_keeps_owner_alive(native):
    np = pytest.importorskip("numpy")
    owner = _Owner(64)
    alive = weakref.ref(owner)
    cap = native.dlpack_capsule(owner.buf.ctypes.data + 8, 16, 1, 0, owner)
    arr = np.from_dlpack(_Exporter(cap))
    del owner, cap
    gc.collect()
    assert alive() is not None, "the array must keep the owner alive"
    assert arr.dtype == np.uint8 and arr.shape == (16,)
    assert list(arr[:3]) == [8, 9, 10]
    alive().buf[8] = 200  # (numpy marks legacy-DLPack arrays read-only: write the owner's side)
    assert arr[0] == 200, "the array must share the owner's memory"
    del arr
    gc.collect()
    assert alive() is None, "dropping the last array must release the owner"


def test_unconsumed_capsule_releases_owner(native):
    pytest.importorskip("numpy")
    owner = _Owner(8)
    alive = weakref.ref(owner)
    cap = native.dlpack_capsule(owner.buf.ctypes.data, 8, 1, 0, owner)
    del owner
    gc.collect()
    assert alive() is not None
    del cap
    gc.collect()
    assert alive() is None


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the GPU tests cover the torch paths)")
def test_torch_interop_constant():
    from ironlink.runtime import torch_interop

    assert torch_interop.MIN_SIGNAL_PAD_BYTES == _abi.SIGNAL_LAYOUT["MIN_BYTES"]
    assert torch_interop.FULL_SIGNAL_PAD_BYTES == _abi.SIGNAL_LAYOUT["FULL_BYTES"]


def test_all_reduce_algorithm_choice(native):
    # The device's own rule, through the extension: by the limits, where the packets fit.
    one, ll = _abi.THRESHOLDS["DEFAULT_AR_ONE_SHOT_MAX_BYTES"], _abi.THRESHOLDS["DEFAULT_AR_LL_MAX_BYTES"]
    scratch = _abi.THRESHOLDS["DEFAULT_SCRATCH_BYTES"]
    assert one < ll
    assert native.all_reduce_algorithm(8, scratch, one, ll, 64, 1 << 10) == "one_shot_ll"
    assert native.all_reduce_algorithm(8, scratch, one, ll, 64, one) == "one_shot_ll"
    assert native.all_reduce_algorithm(8, scratch, one, ll, 64, one + 2) == "two_shot_ll"
    assert native.all_reduce_algorithm(8, scratch, one, ll, 64, ll) == "two_shot_ll"
    assert native.all_reduce_algorithm(8, scratch, one, ll, 64, ll + 2) == "two_shot"
    # Packets that do not fit the scratch fall through to the next algorithm.
    assert native.all_reduce_algorithm(8, 0, one, ll, 64, 1 << 10) == "two_shot"
    assert native.all_reduce_algorithm(8, scratch, 1 << 62, 1 << 62, 1, 1 << 30) == "two_shot"
    with pytest.raises(IronlinkError, match="world size 9"):
        native.all_reduce_algorithm(9, scratch, one, ll, 64, 1 << 10)


def test_tile_all_reduce_choice_matches_the_device(native):
    # tuning.tile_all_reduce_takes_ll (the fused ops' launch planning) against the device's rule.
    full, small = native.FULL_SIGNAL_BYTES, native.MIN_SIGNAL_BYTES
    assert full == _abi.SIGNAL_LAYOUT["FULL_BYTES"] and native.SIGNAL_BYTES >= full
    limit = _abi.THRESHOLDS["TILE_LL_MAX_BYTES"]
    for world in range(1, 9):
        for tile in (0, 1, _abi.MAX_LL_TILES - 1, _abi.MAX_LL_TILES, _abi.MAX_TILES - 1):
            for rows, row_bytes in ((1, 2), (1, limit), (1, limit + 2), (3, 74), (4, 1366), (2, 2336),
                                    (1, 2336), (1, 2338), (1, 5456), (1, 5458), (1, 8192), (1, 8194), (8, 4096)):
                got = tuning.tile_all_reduce_takes_ll(tile, rows, row_bytes, world)
                want = native.tile_all_reduce_algorithm(world, full, tile, rows, row_bytes)
                assert got == (want == "one_shot_ll"), (world, tile, rows, row_bytes, want)
                # A signal region without the LL area (torch's pads of MIN_BYTES): two-shot.
                assert native.tile_all_reduce_algorithm(world, small, tile, rows, row_bytes) == "two_shot"
    assert tuning.tile_all_reduce_takes_ll(0, 1, 16384, 2)  # one hidden-8192 bf16 row at world 2


def test_algorithm_limits_are_checked():
    from ironlink.runtime.heap_args import check_algorithm_limits

    assert check_algorithm_limits(0, 1 << 20, 5) == (0, 1 << 20, 5)
    with pytest.raises(TypeError, match="ar_one_shot_max_bytes"):
        check_algorithm_limits(1.5, 0, 0)
    with pytest.raises(ValueError, match="ar_ll_max_bytes"):
        check_algorithm_limits(0, -1, 0)
    with pytest.raises(TypeError, match="gather_ll_max_bytes"):
        check_algorithm_limits(0, 0, None)


def test_gather_algorithm_choice(native):
    scratch = _abi.THRESHOLDS["DEFAULT_SCRATCH_BYTES"]
    assert _abi.THRESHOLDS["DEFAULT_GATHER_LL_MAX_BYTES"] == 0  # off until measured (the heap applies tuning)
    assert native.gather_algorithm(8, scratch, 1 << 20, 32, 64 << 10, 8 << 10) == "ll"
    assert native.gather_algorithm(8, scratch, 1 << 20, 32, 2 << 20, 256 << 10) == "bulk"  # over the limit
    assert native.gather_algorithm(8, 0, 1 << 20, 32, 64 << 10, 8 << 10) == "bulk"  # no scratch
    assert native.gather_algorithm(8, scratch, 0, 32, 1024, 128) == "bulk"


# -- a heap outliving its close() or its process group ----------------------------------------


class _FakeDist:
    """torch.distributed's view of live groups, as `group_alive` reads it (the CPU venv has no torch)."""

    def __init__(self) -> None:
        self.initialized = True
        world = type("World", (), {})()
        world.pg_map = {}  # type: ignore[attr-defined]
        self.distributed_c10d = type("C10d", (), {"_world": world})()

    def is_initialized(self) -> bool:
        return self.initialized

    def new_group(self) -> object:
        pg = object()
        self.distributed_c10d._world.pg_map[pg] = "gloo"
        return pg

    def destroy(self, pg: object) -> None:
        del self.distributed_c10d._world.pg_map[pg]


def test_group_alive_follows_the_groups_torch_holds() -> None:
    from ironlink.runtime.rendezvous import group_alive

    dist = _FakeDist()
    world, sub = dist.new_group(), dist.new_group()
    assert group_alive(dist, world) and group_alive(dist, sub)
    dist.destroy(sub)
    assert not group_alive(dist, sub) and group_alive(dist, world)
    dist.initialized = False
    assert not group_alive(dist, world)
    dist.initialized = True
    dist.destroy(world)
    dist.new_group()  # a new default group does not bring the old one back
    assert not group_alive(dist, world)


def test_heap_refuses_use_after_close_or_after_its_group_is_destroyed(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    dist = _FakeDist()
    fake_torch = types.ModuleType("torch")
    fake_torch.distributed = dist  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    heap = SymmetricHeap.__new__(SymmetricHeap)  # the state __init__ leaves, without a GPU
    native = object()
    heap._closed, heap._native = False, native
    heap._rendezvous = Rendezvous(None, dist.new_group(), 0, 2, nccl=False)
    heap._rank, heap._world, heap._device = 0, 2, "cuda:0"
    assert heap._open("ironlink.all_reduce") is native
    heap.usable("ironlink.all_reduce")
    dist.destroy(heap._rendezvous.pg)
    with pytest.raises(IronlinkError, match=r"^ironlink.all_gather: the symmetric heap's process group was destroyed"):
        heap.usable("ironlink.all_gather")
    with pytest.raises(IronlinkError, match=r"^the symmetric heap's process group was destroyed"):
        heap.ctx  # noqa: B018 - what a user kernel's launch reads
    heap._closed = True
    with pytest.raises(IronlinkError, match=r"^ironlink.all_reduce: the symmetric heap is closed"):
        heap.usable("ironlink.all_reduce")
    assert "closed" in repr(heap)


def test_workspace_zeroes_new_counters_and_refuses_to_make_them_during_capture(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    class Bytes:
        """A uint8 tensor stand-in: records which prefix was zero-filled."""

        def __init__(self, n: int) -> None:
            self.n, self.zeroed = n, 0

        def numel(self) -> int:
            return self.n

        def __getitem__(self, s: slice) -> "Bytes":
            prefix = Bytes(s.stop)
            prefix.zero_ = lambda: setattr(self, "zeroed", s.stop)  # type: ignore[method-assign]
            return prefix

    fake_torch = types.ModuleType("torch")
    fake_torch.uint8 = "uint8"  # type: ignore[attr-defined]
    capturing = [False]
    cuda = types.SimpleNamespace(is_current_stream_capturing=lambda: capturing[0])
    fake_torch.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    heap = SymmetricHeap.__new__(SymmetricHeap)  # the state __init__ leaves, without a GPU
    heap._workspaces = {}
    made: list[int] = []
    native = types.SimpleNamespace(alloc_top=lambda n: made.append(n) or 1 << 20)
    monkeypatch.setattr(heap, "_open", lambda what="": native, raising=False)
    monkeypatch.setattr(heap, "_tensor_at", lambda offset, n, dims, dtype: Bytes(n), raising=False)
    epochs = heap.workspace("op/epochs", 1024, zeroed_prefix=1024)
    assert made == [4096] and epochs.zeroed == 1024  # a power of two, at least 4 KiB; counters zeroed
    assert heap.workspace("op/epochs", 1024, zeroed_prefix=1024) is epochs and made == [4096]  # kept as it is
    capturing[0] = True
    assert heap.workspace("op/epochs", 4096, zeroed_prefix=1024) is epochs  # big enough: usable while capturing
    with pytest.raises(IronlinkError, match=r"^ironlink.op/epochs needs a workspace of 8192 bytes, which cannot be "
                                            r"made during CUDA graph capture"):
        heap.workspace("op/epochs", 8192, zeroed_prefix=1024)
    assert heap.workspace("op/data", 8192) is not None  # nothing to zero: allowed while capturing


def test_workspace_out_of_memory_names_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workspaces come from the end of the user region (`alloc_top`, the same offsets on every
    rank whatever tensors each allocated); when they do not fit, the error names the op and
    its bytes before the allocator's reason."""
    import types

    fake_torch = types.ModuleType("torch")
    fake_torch.uint8 = "uint8"  # type: ignore[attr-defined]
    fake_torch.cuda = types.SimpleNamespace(is_current_stream_capturing=lambda: False)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    heap = SymmetricHeap.__new__(SymmetricHeap)
    heap._workspaces = {}

    def full(n: int) -> int:
        raise IronlinkError("symmetric heap out of memory for an op's workspace: ...")

    monkeypatch.setattr(heap, "_open", lambda what="": types.SimpleNamespace(alloc_top=full), raising=False)
    with pytest.raises(IronlinkError, match=r"^ironlink.matmul_all_reduce/lamport needs a workspace of 8388608 "
                                            r"bytes: symmetric heap out of memory for an op's workspace"):
        heap.workspace("matmul_all_reduce/lamport", 8 << 20)
    assert heap._workspaces == {"matmul_all_reduce/lamport": []}



def test_an_op_allocating_an_argument_names_itself_when_the_heap_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    from ironlink.runtime.staging import empty_for

    heap = SymmetricHeap.__new__(SymmetricHeap)

    def full(shape: Any, dtype: Any = None) -> Any:
        raise IronlinkError("symmetric heap out of memory: requested 8388608 bytes, but only 4096 of ...")

    monkeypatch.setattr(heap, "empty", full, raising=False)
    with pytest.raises(IronlinkError, match=r"^ironlink.matmul_all_reduce: out was not given, and allocating it from "
                                            r"the heap failed \(pass out= to use memory of your own\): symmetric heap "
                                            r"out of memory: requested 8388608 bytes"):
        empty_for(heap, "matmul_all_reduce", "out", (1024, 4096), "bfloat16")
    monkeypatch.setattr(heap, "empty", lambda shape, dtype=None: ("made", shape, dtype), raising=False)
    assert empty_for(heap, "all_to_all_v", "recv_counts", (4,), "int64") == ("made", (4,), "int64")
