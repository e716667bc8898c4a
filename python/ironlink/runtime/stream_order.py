"""Orders one heap's calls across CUDA streams, so that two streams can never run them at once.

Every ironlink call of a heap uses the same per-CTA call counters, flags and scratch on the
device; two calls of one heap running at the same time on two streams would interleave their
flags and could give wrong results. So a heap remembers the stream of its last call, and a call
on another stream first makes its stream wait for that one (`wait_stream`: an event, no host
sync). Calls on one stream cost one comparison.

Skipped while the current stream is being captured into a CUDA graph: a graph's kernels run at
replay, ordered by the stream it is replayed on, so a wait on the last live call's stream would not
order them, and capture rejects waits on work outside the graph. Nor does the capture stream
become the last stream (nothing of the graph runs on it). Replay a graph on the stream the
heap's other calls use (or order it yourself).

Streams are compared with `!=` and ordered with `wait_stream`, which torch.cuda.Stream has; the
logic takes any such object, so it is testable without a GPU.
"""

from __future__ import annotations

from typing import Any, Optional


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


__all__ = ["StreamOrder"]
