"""CPU stand-ins for the tests of ironlink's PyTorch operators (test_torch_ops.py,
test_torch_compile.py): a heap (`FakeHeap`: tensors it made count as in the heap) and the eager
functions the operators call when a graph runs (`StandIns`: two simulated ranks holding the same
data, so a sum over ranks doubles), and an MoeExchange whose relay path is torch on the CPU."""

from __future__ import annotations

from typing import Any, Iterator, Optional

import pytest
import torch

import ironlink
from ironlink.moe.exchange import MoeExchange
from ironlink.moe.layout import Layout
from ironlink.moe.relay import RelayPath
from ironlink.runtime import eager, handles
from ironlink.runtime.errors import IronlinkError

WORLD = 2


class FakeHeap:
    """What the operators read of a SymmetricHeap, on the CPU, for two simulated ranks."""

    def __init__(self) -> None:
        self.rank, self.device, self.closed, self.multi_node = 0, torch.device("cpu"), False, False
        self._handle = handles.register(self)
        self.tensors: list[Any] = []
        self.workspaces: dict[str, Any] = {}

    # Properties, as SymmetricHeap's: Dynamo reads them through their getters.
    @property
    def handle(self) -> int:
        return self._handle

    @property
    def world_size(self) -> int:
        return WORLD

    def empty(self, shape: Any, dtype: Any = None, at_top: bool = False) -> Any:
        t = torch.zeros(shape, dtype=dtype or torch.float32)
        self.tensors.append(t)
        return t

    def workspace(self, name: str, nbytes: int) -> Any:
        if name not in self.workspaces or self.workspaces[name].numel() < nbytes:
            self.workspaces[name] = self.empty((nbytes,), torch.uint8)
        return self.workspaces[name]

    def _local_offset(self, t: Any, what: str) -> tuple[int, int]:
        for h in self.tensors:
            base, size = h.data_ptr(), h.numel() * h.element_size()
            if base <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= base + size:
                return t.data_ptr() - base, size
        raise IronlinkError(f"{what}: not in the fake heap")

    def holds(self, t: Any) -> bool:
        try:
            self._local_offset(t, "")
        except IronlinkError:
            return False
        return True


# --- the CPU stand-ins of the eager functions (two ranks with the same data) ------------------------


def rmsnorm(r: Any, w: Any, eps: float) -> Any:
    rf = r.float()
    return (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(r.dtype)


class StandIns:
    """Replaces the eager functions the operators call; records which tensors were in the heap."""

    def __init__(self) -> None:
        self.not_in_heap: list[str] = []

    def need(self, heap: FakeHeap, name: str, *ts: Any) -> None:
        self.not_in_heap += [name for t in ts if not heap.holds(t)]

    def all_reduce(self, t: Any, op: Any = "sum", heap: Any = None, check: bool = False, pdl: Any = None,
                   config: Any = None) -> Any:
        self.need(heap, "all_reduce", t)
        return t.mul_(WORLD)

    def all_gather(self, out: Any, inp: Any, heap: Any = None, check: bool = False) -> Any:
        self.need(heap, "all_gather", out, inp)
        return out.copy_(inp.repeat(WORLD))

    def reduce_scatter(self, out: Any, inp: Any, op: Any = "sum", heap: Any = None, check: bool = False) -> Any:
        self.need(heap, "reduce_scatter", out, inp)
        return out.copy_(inp[:out.numel()] * WORLD)

    def all_to_all_v(self, inp: Any, send_counts: Any, out: Any, recv_counts: Any, recv_offsets: Any,
                     heap: Any = None, check: bool = False, ctas: Optional[int] = None) -> Any:
        self.need(heap, "all_to_all_v", inp, send_counts, out, recv_counts, recv_offsets)
        out[:inp.shape[0]] = inp
        recv_counts.copy_(send_counts)
        recv_offsets.copy_(torch.cumsum(send_counts, 0) - send_counts)
        return out, recv_counts, recv_offsets

    def all_reduce_rmsnorm(self, x: Any, residual: Any, weight: Any, eps: float = 1e-6, out: Any = None,
                           heap: Any = None, mode: Any = None, check: bool = False, residual_out: Any = None,
                           scale: Any = None, pdl: Any = None, config: Any = None) -> Any:
        self.need(heap, "all_reduce_rmsnorm", x)
        x.mul_(WORLD)
        r = residual if residual_out is None else residual_out
        r.copy_(x + residual)
        y = rmsnorm(r, weight, eps)
        if scale is not None:
            scale.copy_(y.float().abs().amax(-1))
        out.copy_(y)
        return out, r

    def matmul_all_reduce(self, a: Any, b: Any, out: Any = None, heap: Any = None, config: Any = None,
                          method: Any = None, check: bool = False, exchange: Any = None) -> Any:
        self.need(heap, "matmul_all_reduce", out)
        assert config is None or isinstance(config, ironlink.tuning.MatmulConfig)
        return out.copy_((a @ b) * WORLD)

    def all_gather_matmul(self, a_shard: Any, b: Any, heap: Any, a_full: Any = None, out: Any = None,
                          config: Any = None, check: bool = False, method: Any = None, exchange: Any = None) -> Any:
        self.need(heap, "all_gather_matmul", a_full)
        a_full.copy_(a_shard.repeat(WORLD, 1))
        out.copy_(a_full @ b)
        return a_full, out

    def matmul_reduce_scatter(self, a: Any, b: Any, heap: Any, out: Any = None, config: Any = None,
                              check: bool = False, method: Any = None, exchange: Any = None) -> Any:
        assert exchange is None or isinstance(exchange, ironlink.tuning.ScatterExchange)
        return out.copy_(((a @ b) * WORLD)[:out.shape[0]])


class StandInRelay(RelayPath):
    """The relay path of a StandInExchange, its steps torch on the CPU: every token goes to recv_x
    in token order, expert 0 gets them all, combine doubles them."""

    def pack(self, x: Any, idx: Any, weights: Any, t: int) -> Any:
        self._x = x
        return torch.arange(t).view(t, 1).expand(t, self.m.world).clone()

    def exchange(self, *args: Any) -> None:
        pass

    def place(self) -> Layout:
        m, t = self.m, self._x.shape[0]
        m.recv_x[:t] = self._x
        counts = torch.zeros(m.local_experts, dtype=torch.int64)
        counts[0] = t
        rows = m.world * m.max_tokens
        slot = torch.full((rows, m.topk), -1, dtype=torch.int64)
        return Layout(counts, torch.zeros_like(counts), slot, torch.ones(rows, m.topk), torch.tensor([t]))

    def reduce_here(self, y: Any, layout: Layout) -> None:
        self._y = y

    def sum_ranks(self, layout: Layout, t: int) -> Any:
        return self._y[:t] * 2


class StandInExchange(MoeExchange):
    """A MoeExchange of one simulated rank whose relay path (built with path="relay") is
    `StandInRelay`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.impl = StandInRelay(self, self.heap, self.config)


class StandInHeap(FakeHeap):
    """The heap MoeExchange takes (its allocations are plain CPU tensors)."""

    def free(self, t: Any) -> None:
        pass

    def check(self) -> None:
        pass


# The public functions the operators run, entered in runtime.eager by their modules.
EAGER = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all_v", "all_reduce_rmsnorm", "matmul_all_reduce",
         "all_gather_matmul", "matmul_reduce_scatter")


def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIns]:
    """The body of a test file's `stand_ins` fixture: the stand-ins entered where the operators
    look the eager functions up, and Dynamo's caches and counters empty before and after."""
    s = StandIns()
    for name in EAGER:
        monkeypatch.setitem(eager.FUNCTIONS, name, getattr(s, name))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield s
    torch._dynamo.reset()


def graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())
