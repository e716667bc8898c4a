"""The simulation harness of moe_interpreted.py and moe_refusals_interpreted.py, beside this file (a
helper, no tests of its own): `world` ranks of MoeExchange in one process, Triton kernels in the
interpreter. The relay path's heap (`FakeHeap`, a heap of several nodes as MoeExchange sees it) with
its two all_to_all_v done in Python between its steps (`exchange`, `layer`); the direct path's
one-node heaps (`SimHeap`: arenas at the same offsets, so a peer's copy of an address is a fixed
byte distance away) with each step run on every rank before the next, the order its barriers give on
GPUs (`direct_layer`)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ironlink.moe import MoeExchange, fp8_dequantize
from ironlink.moe.layout import Layout
from ironlink.moe.relay import RelayPath

import _interpreter_shims  # tests/with_torch/scripts/, beside this file

_interpreter_shims.install()  # the low-latency dispatch's receive waits for its senders' flags


class FakeHeap:
    """A heap of several nodes, as MoeExchange sees it: the relay path (two all_to_all_v, done in
    Python here by `exchange`)."""

    ALIGN = 256  # bytes of heap each allocation takes are counted in units of this
    multi_node = True

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world_size, self.device = rank, world, torch.device("cpu")
        self.allocated = 0

    def empty(self, shape: Any, dtype: Any, at_top: bool = False) -> Any:
        t = torch.full(shape, 7, dtype=dtype)  # not zero: unwritten rows must not look right
        self.allocated += -(-t.numel() * t.element_size() // self.ALIGN) * self.ALIGN
        return t

    def free(self, t: Any) -> None:
        pass

    def check(self) -> None:
        pass


class SimHeap(FakeHeap):
    """A one-node heap of simulated rank `rank`, laid out as the real one: tensors carved from the
    start of its own arena in call order, `at_top` ones from its end down (the real heap's
    workspace stack), so peer q's copy of an address is `simulated_peers[q]` bytes away (what
    MoeExchange's direct path adds instead of calling the device library) only where the ranks
    made the same calls of that kind."""

    multi_node = False

    def __init__(self, rank: int, world: int, arenas: list[Any]) -> None:
        super().__init__(rank, world)
        self.arena = arenas[rank]
        self.bottom = self.top = 0  # bytes taken from the start and from the end
        base = self.arena.data_ptr()
        self.simulated_peers = torch.tensor([a.data_ptr() - base for a in arenas], dtype=torch.int64)

    def empty(self, shape: Any, dtype: Any, at_top: bool = False) -> Any:
        n = math.prod(shape) * dtype.itemsize
        taken = -(-n // self.ALIGN) * self.ALIGN
        assert self.bottom + self.top + taken <= self.arena.numel(), "simulated heap out of memory"
        if at_top:
            self.top += taken
            start = self.arena.numel() - self.top
        else:
            start, self.bottom = self.bottom, self.bottom + taken
        t = self.arena[start:start + n].view(dtype).view(shape)
        t.fill_(7)  # not zero: unwritten rows must not look right
        self.allocated += taken
        return t


def sim_heaps(world: int, nbytes: int) -> list[SimHeap]:
    arenas = [torch.zeros(nbytes + 4096, dtype=torch.uint8) for _ in range(world)]
    # Arena starts 256-byte aligned, as heap bases are.
    arenas = [a[-a.data_ptr() % 256:][:nbytes] for a in arenas]
    return [SimHeap(r, world, arenas) for r in range(world)]


def direct_layer(ms: list[MoeExchange], xs: list[Any], ids: list[Any], ws: list[Any]) -> tuple[list[Any], ...]:
    """`layer` on the direct path, each step on every rank before the next (the order its
    barriers give on GPUs): stage, gather the ids, place (sort + pull), push, sum."""
    staged = [m._stage(x, i, w) for m, x, i, w in zip(ms, xs, ids, ws)]
    for m in ms:
        m.direct.gather(False)
    lays = [m.direct.place(False) for m in ms]
    recvs, counts, ys = [], [], []
    for m, lay in zip(ms, lays):
        recvs.append((m.recv_x.clone(), m.recv_scales.clone()) if m.fp8 else m.recv_x.clone())
        counts.append(lay.counts)
        ys.append(_scaled_rows(m, lay.counts))
    for m, lay, y in zip(ms, lays, ys):
        m.direct.push(y, lay, False)
    outs = [m.direct.sum(t) for m, t in zip(ms, staged)]
    return recvs, counts, outs


def low_latency_layer(ms: list[MoeExchange], xs: list[Any], ids: list[Any], ws: list[Any],
                      deferred: bool = False) -> tuple[list[Any], ...]:
    """`layer` on the low-latency path, each kernel's send phase on every rank before its receive
    phase (the order its signals and waits give on GPUs). `deferred`: through the public
    `dispatch(return_recv_hook=True)` (its send on every rank, then every rank's hook). Also
    returns the handles."""
    ts = [m._inputs(x, i, w)[0] for m, x, i, w in zip(ms, xs, ids, ws)]
    if deferred:
        sent = [m.dispatch(x, i, w, return_recv_hook=True) for m, x, i, w in zip(ms, xs, ids, ws)]
        for *_, hook in sent:
            hook()
        lays = [Layout(counts, offsets, h.slot, h.weight, h.received) for _, counts, offsets, h, _ in sent]
    else:
        for m, x, i, w, t in zip(ms, xs, ids, ws, ts):
            m.low_latency.dispatch(x.contiguous(), i.contiguous(), w.contiguous(), t, False, phase=1)
        lays = [m.low_latency.dispatch(x.contiguous(), i.contiguous(), w.contiguous(), t, False, phase=2)
                for m, x, i, w, t in zip(ms, xs, ids, ws, ts)]
    recvs = [(m.recv_x.clone(), m.recv_scales.clone()) if m.fp8 else m.recv_x.clone() for m in ms]
    ys = [_scaled_rows(m, lay.counts) for m, lay in zip(ms, lays)]
    for m, lay, y, t in zip(ms, lays, ys, ts):
        m.low_latency.combine(y, lay, t, False, phase=1)
    outs = [m.low_latency.combine(y, lay, t, False, phase=2) for m, lay, y, t in zip(ms, lays, ys, ts)]
    return recvs, [lay.counts for lay in lays], outs, lays


def _scaled_rows(m: MoeExchange, counts: Any) -> Any:
    """The experts' outputs the layers combine: m's recv_x rows (dequantized for fp8), each times
    its expert's global id + 1 (its expert from the expert `counts` of the layout, or on the
    low-latency path from the row's block)."""
    if m.path == "low_latency":
        e_of_row = torch.arange(m.capacity) // (m.world * m.max_tokens)
    else:
        e_of_row = torch.searchsorted(torch.cumsum(counts, 0), torch.arange(m.capacity), right=True)
    scale = (m.rank * m.local_experts + e_of_row.clamp(max=m.local_experts - 1) + 1).to(m.dtype)[:, None]
    rows = fp8_dequantize(m.recv_x, m.recv_scales, m.dtype) if m.fp8 else m.recv_x
    return (rows * scale).contiguous()


def exchange(send: list[tuple[Any, Any]], recv: list[tuple[Any, Any, Any]]) -> None:
    """all_to_all_v between simulated ranks: send[q] = (rows, counts), recv[p] = (out, counts,
    offsets); rank q's rows for p follow its rows for ranks < p."""
    world = len(send)
    for p, (out, counts, offsets) in enumerate(recv):
        at = 0
        for q, (rows, sent) in enumerate(send):
            first = int(sent[:p].sum())
            n = int(sent[p])
            out[at:at + n] = rows[first:first + n]
            counts[q], offsets[q] = n, at
            at += n
    assert world == len(recv)


def pack(m: MoeExchange, x: Any, ids: Any, ws: Any) -> tuple[int, Any]:
    """The relay path's dispatch step 1 on m (`RelayPath.pack`): (tokens, send_row)."""
    assert m.relay is not None
    t, x, ids, ws = m._inputs(x, ids, ws)
    return t, m.relay.pack(x, ids, ws, t)


def relays(ms: list[MoeExchange]) -> list[RelayPath]:
    """The relay paths of `ms` (every simulated rank's)."""
    paths = [m.relay for m in ms]
    assert all(p is not None for p in paths), "not the relay path"
    return [p for p in paths if p is not None]


def layer(ms: list[MoeExchange], xs: list[Any], ids: list[Any], ws: list[Any]) -> tuple[list[Any], ...]:
    """dispatch, y = recv_x * (global expert + 1), combine, on every simulated rank (recvs: recv_x,
    or (recv_x, recv_scales) for fp8, whose y uses the dequantized rows): the relay path's steps
    (moe/relay.py), its two exchanges done here."""
    rs = relays(ms)
    packed = [pack(m, x, i, w) for m, x, i, w in zip(ms, xs, ids, ws)]
    exchange([(r.send_buf, r.send_counts) for r in rs], [(r.recv_buf, r.recv_counts, r.recv_offsets) for r in rs])
    outs, recvs, counts = [], [], []
    lays = []
    for m, r, (t, send_row) in zip(ms, rs, packed):
        lay = r.place()._replace(send_row=send_row)
        recvs.append((m.recv_x.clone(), m.recv_scales.clone()) if m.fp8 else m.recv_x.clone())
        counts.append(lay.counts)
        lays.append(lay)
        r.reduce_here(_scaled_rows(m, lay.counts), lay)
    exchange([(r.back_send, r.recv_counts) for r in rs], [(r.back_recv, r.back_counts, r.back_offsets) for r in rs])
    for r, lay, (t, _) in zip(rs, lays, packed):
        outs.append(r.sum_ranks(lay, t))
    return recvs, counts, outs


def _bytes(t: Any) -> Any:
    return t.contiguous().view(torch.uint8)


__all__ = ["FakeHeap", "SimHeap", "_bytes", "direct_layer", "exchange", "layer", "low_latency_layer", "pack", "relays",
           "sim_heaps"]
