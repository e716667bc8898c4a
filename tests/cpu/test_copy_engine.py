"""fused.copy_engine's launch order without a GPU (streams, events and stream flags faked): the
kernel is launched before its side stream waits for the kernel's go (a wait enqueued first can
deadlock with the kernel's module load), the go is consumed before any transfer, and the
current stream joins the side stream; the side stream is never the current one."""

from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from ironlink.fused import copy_engine


def test_the_kernel_goes_before_the_wait_for_its_go(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_event(self, e: Any) -> None:
            calls.append(f"{self.name} waits for {e.name}")

        def wait_stream(self, s: Any) -> None:
            calls.append(f"{self.name} joins {s.name}")

    class Event:
        def __init__(self) -> None:
            self.name = "the inputs"

        def record(self, s: Any) -> None:
            calls.append(f"{s.name} records the inputs")

    main, side = Stream("main"), Stream("side")

    @contextlib.contextmanager
    def on(s: Any) -> Iterator[None]:
        calls.append(f"on {s.name}")
        yield
        calls.append(f"off {s.name}")

    cuda = SimpleNamespace(current_stream=lambda: main, Event=Event, stream=on)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(copy_engine.streams, "_made_streams", lambda device, count: (side, Stream("spare")))
    monkeypatch.setattr(copy_engine.streams, "wait_flag",
                        lambda s, word, value: calls.append(f"{s.name} waits for word {word} == {value}"))
    monkeypatch.setattr(copy_engine.streams, "write_flag",
                        lambda s, word, value: calls.append(f"{s.name} writes {value} into word {word}"))
    heap = SimpleNamespace(device=SimpleNamespace(index=0))
    go = copy_engine.FLAG_GO.value
    copy_engine.launch(heap, list(range(8)), lambda: calls.append("kernel"), lambda s: calls.append(f"{s.name} copies"))
    assert calls == ["main records the inputs", "kernel", "side waits for the inputs", "on side",
                     f"side waits for word {go} == 1", f"side writes 0 into word {go}", "side copies", "off side",
                     "main joins side"]


def test_the_side_stream_is_never_the_current_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # A caller's current stream may be the first one runtime.streams made (it was, when they came from
    # PyTorch's pool, which hands its streams out again). The copies then take the next (else a
    # copy-engine kernel waits for transfers queued behind itself: every wait timed out on 2 H200s).
    first, second, other = object(), object(), object()
    monkeypatch.setattr(copy_engine.streams, "_made_streams", lambda device, count: (first, second)[:count])
    assert copy_engine.streams.side_streams(0, 1, other) == (first,)
    assert copy_engine.streams.side_streams(0, 1, first) == (second,)
    assert copy_engine.streams.side_streams(0, 1, second) == (first,)


def test_flag_words_are_zero_for_every_shape_that_shares_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # A flags workspace is made for the first call's words, a power of two of at least 4 KiB
    # (SymmetricHeap.workspace); a later call of another shape with more words uses the same one.
    # Its words must all start zero, not hold what freed heap memory held: a stale word would let a
    # kernel read a chunk before it arrived, or keep a stream waiting for a count forever.
    import numpy as np

    class Heap:
        world_size = 2

        def __init__(self) -> None:
            self.kept: dict[str, Any] = {}

        def has_workspace(self, name: str, nbytes: int) -> bool:
            return name in self.kept and self.kept[name].size >= nbytes

        def workspace(self, name: str, nbytes: int, zeroed_prefix: int = 0, init: Any = None) -> Any:
            if not self.has_workspace(name, nbytes):
                self.kept[name] = np.full(1 << max(12, (nbytes - 1).bit_length()), 0xAB, dtype=np.uint8)
                self.kept[name][:zeroed_prefix] = 0
                if init is not None:
                    init(self.kept[name])
            return self.kept[name]

    barriers: list[str] = []
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(int64=np.int64))
    monkeypatch.setattr(copy_engine.barrier, "device_barrier", lambda heap, check: barriers.append("barrier"))
    heap = Heap()
    few = copy_engine.flags_workspace(heap, "op/flags", 4, False)
    assert len(few) == copy_engine.flag_data(2) + 4 and not few.any() and barriers == ["barrier"]
    many = copy_engine.flags_workspace(heap, "op/flags", 64, False)
    assert len(many) == copy_engine.flag_data(2) + 64 and not many.any() and barriers == ["barrier"]
    # prepare: the op's chunked config and its flag words, `words_per_chunk` a chunk and rank.
    planned = copy_engine.tuning.MatmulConfig(128, 256, 64, 8, 8, 3)
    config, flags = copy_engine.prepare(heap, "matmul_reduce_scatter", 1024, planned, 2, 2, False)
    assert config == planned._replace(group_m=4)  # 8 tile rows: 2 chunks of 4
    assert len(flags) == copy_engine.flag_data(2) + 2 * 2 * 2 and "matmul_reduce_scatter/flags" in heap.kept


def test_reduce_scatter_takes_the_copy_engine_only_from_its_least_block_rows() -> None:
    # Below the least rows the copy engine was slower (M = 1024 at world 2: 160.3 us against the
    # CTAs' pushes' 123.6 on 2 H200s); 0 forces the copy engine and None turns it off.
    from ironlink.runtime import tuning

    least = tuning.MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS
    assert least is not None and least > 512
    assert tuning.ScatterExchange().copy_engine_min_rows == least  # the default: the measured choice
    assert not tuning.ScatterExchange().takes_copy_engine(least - 1)
    assert tuning.ScatterExchange().takes_copy_engine(least)
    assert tuning.ScatterExchange(copy_engine_min_rows=0).takes_copy_engine(1)
    assert not tuning.ScatterExchange(copy_engine_min_rows=None).takes_copy_engine(1 << 20)


def test_the_copies_streams_are_made_for_them_not_taken_from_pytorchs_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    # A pool stream is handed out to every caller: a user's work on it would hold the copies back
    # (and hang a copy-engine kernel until its timeout if that work waited for the op).
    made: list[int] = []

    class Native:
        def stream_create(self, device: int) -> int:
            made.append(device)
            return 0x1000 + len(made)

    def no_pool_stream(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a stream of PyTorch's pool")

    cuda = SimpleNamespace(Stream=no_pool_stream,
                           ExternalStream=lambda handle, device: SimpleNamespace(handle=handle, device=device))
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    monkeypatch.setattr("ironlink.runtime.streams.load_native", lambda: Native())
    streams = copy_engine.streams._made_streams.__wrapped__(3, 2)
    assert [(s.handle, s.device) for s in streams] == [(0x1001, 3), (0x1002, 3)] and made == [3, 3]
