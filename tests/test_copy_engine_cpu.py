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
    monkeypatch.setattr(copy_engine.sp_streams, "_made_streams", lambda device, count: (side, Stream("spare")))
    monkeypatch.setattr(copy_engine.stream_flags, "wait_flag",
                        lambda s, word, value: calls.append(f"{s.name} waits for word {word} == {value}"))
    monkeypatch.setattr(copy_engine.stream_flags, "write_flag",
                        lambda s, word, value: calls.append(f"{s.name} writes {value} into word {word}"))
    heap = SimpleNamespace(device=SimpleNamespace(index=0))
    go = copy_engine.FLAG_GO.value
    copy_engine.launch(heap, list(range(8)), lambda: calls.append("kernel"), lambda s: calls.append(f"{s.name} copies"))
    assert calls == ["main records the inputs", "kernel", "side waits for the inputs", "on side",
                     f"side waits for word {go} == 1", f"side writes 0 into word {go}", "side copies", "off side",
                     "main joins side"]


def test_the_side_stream_is_never_the_current_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # PyTorch's pool hands its streams out again: a caller's current stream may be the first one
    # sp_streams took. The copies then take the next (else a copy-engine kernel waits for
    # transfers queued behind itself: every wait timed out on 2 H200s).
    first, second, other = object(), object(), object()
    monkeypatch.setattr(copy_engine.sp_streams, "_made_streams", lambda device, count: (first, second)[:count])
    assert copy_engine.sp_streams.side_streams(0, 1, other) == (first,)
    assert copy_engine.sp_streams.side_streams(0, 1, first) == (second,)
    assert copy_engine.sp_streams.side_streams(0, 1, second) == (first,)
