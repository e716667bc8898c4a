"""Flags between work on streams and kernels: a copy engine's transfer announced to a kernel that
waits for it, a kernel telling a stream when to start one. A flag is a u64 word of the symmetric
heap; kernels set and wait on it with `symm_signal_at` / `symm_signal_wait_at`, streams with the
two functions here (`cuStreamWriteValue64` / `cuStreamWaitValue64`: executed by the stream's
front end, no SM involved, captured into CUDA graphs).

A wait on a stream has no timeout, so a stream waits only on words that a kernel of this process
always sets (after a timeout too); waits on other ranks belong in kernels, which time out."""

from __future__ import annotations

from typing import Any

from .native import load_native


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


__all__ = ["wait_flag", "word_address", "write_flag"]
