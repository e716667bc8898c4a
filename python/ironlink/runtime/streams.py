"""CUDA streams as ironlink uses them, in one place: the order of one heap's calls across
streams, flags between streams and kernels, and the side streams of the copy engine.

**Stream order.** Every call of a heap uses the same per-CTA call counters, flags and scratch on
the device; two calls of one heap running at once on two streams would interleave their flags
and could give wrong results. So a heap remembers the stream of its last call (`StreamOrder`),
and a call on another stream first makes its stream wait for that one (`wait_stream`: an event,
no host sync). Calls on one stream cost one comparison. Skipped while the current stream is being
captured into a CUDA graph: a graph's kernels run at replay, ordered by the stream it is replayed
on, so a wait on the last live call's stream would not order them, and capture rejects waits on
work outside the graph. Nor does the capture stream become the last stream (nothing of the graph
runs on it). Replay a graph on the stream the heap's other calls use (or order it yourself).
Streams are compared with `!=` and ordered with `wait_stream`, which torch.cuda.Stream has; the
logic takes any such object, so it is testable without a GPU.

**Stream flags.** A copy engine's transfer announced to a kernel that waits for it, a kernel
telling a stream when to start one. A flag is a u64 word of the symmetric heap; kernels set and
wait on it with `symm_signal_at` / `symm_signal_wait_at`, streams with `write_flag` / `wait_flag`
(`cuStreamWriteValue64` / `cuStreamWaitValue64`: executed by the stream's front end, no SM
involved, captured into CUDA graphs). A wait on a stream has no timeout, so a stream waits only on
words that a kernel of this process always sets (after a timeout too); waits on other ranks
belong in kernels, which time out.

**Side streams.** The copy engine's transfers run on streams ironlink makes once per process
(`side_streams`), never the caller's.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from .native import load_native


class StreamOrder:
    """The stream of a heap's last call, and the wait that orders the next call after it."""

    def __init__(self) -> None:
        self._last: Optional[Any] = None

    @property
    def last(self) -> Optional[Any]:
        return self._last

    def before_call(self, stream: Any, capturing: bool) -> None:
        """Call right before launching on `stream`: waits for the last call's stream if it differs."""
        if capturing:
            return
        last = self._last
        if last is not None and last != stream:
            stream.wait_stream(last)
        self._last = stream


def word_address(word: Any) -> int:
    """The device address of `word`, a one-element 8-byte tensor (a heap tensor's element, or
    a peer's through `heap.peer_tensor`)."""
    if word.numel() != 1 or word.element_size() != 8:
        raise ValueError(f"a stream flag is one 8-byte element, got {word.numel()} of {word.element_size()} bytes")
    return int(word.data_ptr())


def write_flag(stream: Any, word: Any, value: int) -> None:
    """`stream` writes `value` into `word` once its earlier work is done, after a fence that makes
    that work's writes visible first (a kernel that waited for the word sees them)."""
    load_native().stream_write_u64(stream.device.index, stream.cuda_stream, word_address(word), value)


def wait_flag(stream: Any, word: Any, value: int) -> None:
    """`stream`'s later work waits until `word` equals `value`."""
    load_native().stream_wait_u64(stream.device.index, stream.cuda_stream, word_address(word), value)


@functools.lru_cache(maxsize=None)
def _made_streams(device_index: int, count: int) -> tuple[Any, ...]:
    """`count` streams of one GPU made for ironlink's copies once per process (`cuStreamCreate`,
    non-blocking), not taken from PyTorch's pool: `torch.cuda.Stream()` hands its 32 streams a
    priority out round robin to every caller, so a user's work could sit on ours; the copies
    would queue behind it, and if it waits for this op, a copy-engine kernel would wait for
    transfers that never start (until its timeout)."""
    import torch

    return tuple(torch.cuda.ExternalStream(load_native().stream_create(device_index), device=device_index)
                 for _ in range(count))


def side_streams(device_index: int, count: int, main: Any) -> tuple[Any, ...]:
    """`count` streams for the copies on one GPU, none of them `main` (the caller's current
    stream): a copy-engine kernel's transfers queued behind the kernel on its own stream would
    wait for it while it waits for the peers' transfers, queued the same way (when these were
    pool streams, bench/fused.py's GraphRound, which takes a pool stream per contender, came
    round to the side stream: every copy-engine wait timed out). A caller may still run on one of
    ours (tests do, on purpose)."""
    return tuple(s for s in _made_streams(device_index, count + 1) if s != main)[:count]


__all__ = ["StreamOrder", "side_streams", "wait_flag", "word_address", "write_flag"]
