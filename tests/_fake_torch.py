"""A stand-in for torch for the CPU tests of the host path (a helper, no tests of its own): the
few tensor, stream and CUDA calls ironlink's host ops make, a heap that answers as a
SymmetricHeap does, and the `fake_torch` fixture that installs them for one test and records
every kernel launch (import the fixture into a test module and its tests may take it)."""

from __future__ import annotations

import contextlib
import importlib
import math
import sys
import types
from typing import Any, Iterator

import pytest

from ironlink.language import _abi
from ironlink.ops import collectives as ops
from ironlink.ops import variable_all_to_all as a2av
from ironlink.runtime import registry, status_buffers
from ironlink.runtime.errors import IronlinkError
from ironlink.runtime.tuning import decode_table

# The fused host modules named after their ops (the package's attributes of those names are the ops).
arn = importlib.import_module("ironlink.fused.all_reduce_rmsnorm")
agm = importlib.import_module("ironlink.fused.all_gather_matmul")
mar = importlib.import_module("ironlink.fused.matmul_all_reduce")
mrs = importlib.import_module("ironlink.fused.matmul_reduce_scatter")

DEV = "cuda:0"



class FakeTensor:
    """The few torch.Tensor methods ironlink.ops calls."""

    def __init__(self, n: int, dtype: str = "bfloat16", ptr: int = 0x10000, contiguous: bool = True,
                 shape: tuple[int, ...] = ()) -> None:
        self.shape, self.dtype, self.ptr, self.contiguous = shape or (n,), f"torch.{dtype}", ptr, contiguous
        self.device, self.values = DEV, [0] * n

    def stride(self, dim: int) -> int:  # row-major
        return 1 if dim == len(self.shape) - 1 else self.shape[-1]

    def element_size(self) -> int:
        return {"uint8": 1, "float32": 4, "int32": 4, "int64": 8, "float64": 8}.get(self.dtype.split(".")[-1], 2)

    def is_contiguous(self) -> bool:
        return self.contiguous

    def data_ptr(self) -> int:
        return self.ptr

    def __getitem__(self, s: slice) -> "FakeTensor":
        t = FakeTensor(0, ptr=self.ptr)  # s starts at 0 wherever ironlink slices
        t.values = self.values[s]
        return t

    def tolist(self) -> list[int]:
        return self.values

    def view(self, how: Any) -> "FakeTensor":  # a workspace's bytes as a dtype or a shape: the same memory
        t = FakeTensor(0, ptr=self.ptr, contiguous=self.contiguous)
        t.dtype, t.shape = self.dtype, self.shape
        if isinstance(how, tuple):
            t.shape = how
        else:
            t.dtype = str(how)
            t.shape = (len(self.values) * self.element_size() // t.element_size(),)
        t.values = self.values[:math.prod(t.shape)]
        return t

    is_cuda = True

    def numel(self) -> int:
        return len(self.values)

    def copy_(self, src: "FakeTensor") -> "FakeTensor":
        COPIES.append((self.ptr, src.ptr))
        return self


STAGED = 0xE000000  # where FakeHeap's staging workspaces start
COPIES: list[tuple[int, int]] = []  # (destination, source) data pointers of FakeTensor.copy_, in order


class FakeStream:
    """Stands in for torch.cuda.Stream: compared by identity, records what it was made to wait for."""

    def __init__(self, name: str) -> None:
        self.name, self.waited = name, []  # type: ignore[var-annotated]

    def wait_stream(self, other: "FakeStream") -> None:
        self.waited.append(other.name)


@pytest.fixture()
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """sys.modules["torch"] replaced for one test (ops imports torch inside its functions). The
    fake heap's world (8) takes the device library's all-reduce at every size here and
    all_reduce_rmsnorm's modes without a workspace (which fake tensors cannot hold): these tests
    check those launches; the lamport paths' are checked on GPUs (tests/gpu/workers/ops_worker.py,
    fusion_worker.py)."""
    k, m, no_limit = 1 << 10, 1 << 20, decode_table.NO_LIMIT
    library = decode_table.DecodeTable((), ((16 * k, "whole"), (32 * m - 1, "rows"), (no_limit, "whole")))
    with decode_table.substituted(FakeHeap.world_size, library):
        yield install_fake_torch(monkeypatch)


def install_fake_torch(monkeypatch: pytest.MonkeyPatch) -> Any:
    torch = types.ModuleType("torch")
    torch.Tensor = FakeTensor  # type: ignore[attr-defined]
    torch.int32 = "int32"  # type: ignore[attr-defined]
    torch.capturing = False  # type: ignore[attr-defined]
    torch.stream = FakeStream("default")  # type: ignore[attr-defined]  # the current stream
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_current_stream_capturing=lambda: torch.capturing, device=lambda d: contextlib.nullcontext(),
        current_stream=lambda device=None: torch.stream,
    )
    torch.zeros = lambda n, dtype, device: FakeTensor(n, "int32", 0xDEAD)  # type: ignore[attr-defined]
    torch.compiler = types.SimpleNamespace(is_compiling=lambda: False)  # type: ignore[attr-defined]  # eager
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(status_buffers, "_STATUS", {})
    monkeypatch.setattr(registry, "_HEAPS", type(registry._HEAPS)())
    launches: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = []

    class Kernel:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **kw: launches.append((self.name, grid, args, kw))

    for c in ("all_reduce", "all_gather", "reduce_scatter"):
        monkeypatch.setattr(ops, f"_{c}_kernel", Kernel(c))
    monkeypatch.setattr(a2av, "_all_to_all_v_kernel", Kernel("all_to_all_v"))
    for module, name in ((arn, "allreduce_rmsnorm"), (mar, "matmul_allreduce"), (agm, "allgather_matmul"),
                         (mrs, "matmul_reducescatter")):
        for variant in (name, f"{name}_hierarchical"):
            monkeypatch.setattr(module, f"{variant}_kernel", Kernel(variant))
    monkeypatch.setattr(mar, "matmul_allreduce_push_kernel", Kernel("matmul_allreduce_push"))
    monkeypatch.setattr(mar, "matmul_allreduce_owner_kernel", Kernel("matmul_allreduce_owner"))
    torch.cuda.get_device_properties = lambda d: types.SimpleNamespace(multi_processor_count=132)
    torch.cuda.get_device_capability = lambda d: (8, 0)  # no TMA: the kernels get the tensors
    torch.launches = launches  # type: ignore[attr-defined]
    return torch


class FakeDevice:
    index = 0

    def __str__(self) -> str:
        return DEV


class FakeHeap:
    closed, world_size, rank, ctx, device = False, 8, 3, 0x1234, FakeDevice()
    node_size = 8

    @property
    def multi_node(self) -> bool:
        return self.node_size < self.world_size

    def __init__(self, *tensors: Any) -> None:
        from ironlink.runtime.streams import StreamOrder

        self.mine = {id(t) for t in tensors}
        self.stream_order = StreamOrder()
        self.unusable = ""  # set: usable() raises it, as a closed SymmetricHeap does
        self.compared: list[tuple[str, dict[str, Any]]] = []  # the check=True calls compare_call saw
        self.differs = ""  # set: compare_call raises it, as where the ranks' calls differ

    def usable(self, what: str) -> None:
        if self.unusable:
            raise IronlinkError(f"{what}: {self.unusable}")

    def compare_call(self, name: str, **fields: Any) -> None:
        self.compared.append((name, fields))
        if self.differs:
            raise IronlinkError(f"ironlink.{name}(check=True) on rank 3: {self.differs}; nothing was launched")

    def explain(self, e: IronlinkError) -> IronlinkError:
        """As SymmetricHeap.explain: HEAP_ASYMMETRIC gets the heap calls that differ appended."""
        if e.status != _abi.STATUS["HEAP_ASYMMETRIC"]:
            return e
        return IronlinkError(f"{e}. The first heap call that differs ...", status=e.status, function=e.function)

    def _local_offset(self, t: Any, what: str) -> tuple[int, int]:
        if id(t) not in self.mine and t.data_ptr() < STAGED:  # its tensors, and views of its workspaces
            raise IronlinkError(f"{what}: not in this heap")
        return 0, 0

    def workspace(self, name: str, nbytes: int, zeroed_prefix: int = 0) -> FakeTensor:
        """At 0xF000000, but the staging workspaces (runtime.staging) at STAGED + 1 MiB x their
        argument position: an op's staged tensors apart."""
        at = STAGED + (int(name.rsplit("/", 1)[1]) << 20) if name.startswith("torch.ops.") else 0xF000000
        return FakeTensor(nbytes, "uint8", ptr=at)
