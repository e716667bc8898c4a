"""The host side of HEAP_ASYMMETRIC and GRID_MISMATCH (no GPU, no torch): the heap-call log, the
first call that differs between ranks, the report's text, the exchange of the ranks' logs
through a key-value store, and the messages of the recorded statuses."""

from __future__ import annotations

import time
from typing import Optional

import pytest

from ironlink.language import _abi
from ironlink.runtime.errors import device_error
from ironlink.runtime.heap_log import KEEP, HeapLog, asymmetry_report, first_difference, recent
from ironlink.runtime.store_exchange import exchange

from _fake_store import FakeStore  # tests/, the helpers' folder
from _ranks import run_ranks


def log_of(*calls: tuple[str, int, int]) -> HeapLog:
    """A log of (op, offset, bytes) calls, reserved = bytes rounded up to 256."""
    log = HeapLog()
    for op, offset, nbytes in calls:
        log.record(op, offset, nbytes, -(-nbytes // 256) * 256, f"shape ({nbytes // 4},), torch.float32")
    return log


SAME = [("alloc", 0, 4096), ("alloc", 4096, 1024)]


def test_log_numbers_events_from_the_first_and_keeps_the_last() -> None:
    log = HeapLog(keep=3)
    for i in range(5):
        log.record("alloc", 256 * i, 100, 256)
    assert log.count == 5
    assert [e.seq for e in log.events()] == [2, 3, 4]
    assert recent(log, 2) == "#3 alloc of 100 bytes at offset 768; #4 alloc of 100 bytes at offset 1024"
    assert recent(HeapLog()) == "none"


def test_equal_logs_have_no_difference() -> None:
    a, b = log_of(*SAME), log_of(*SAME)
    assert first_difference([a.events(), b.events()]) is None


def test_another_size_is_the_first_difference() -> None:
    a = log_of(*SAME, ("alloc", 5120, 4096))
    b = log_of(*SAME, ("alloc", 5120, 8192))
    seq, at = first_difference([a.events(), b.events()])
    assert seq == 2
    assert at[0] is not None and at[0].nbytes == 4096 and at[1] is not None and at[1].nbytes == 8192


def test_same_rounded_size_is_no_difference() -> None:
    # 1000 and 1024 bytes reserve the same 1024: the digests agree, and so does the log.
    a = log_of(("alloc", 0, 1000))
    b = log_of(("alloc", 0, 1024))
    assert first_difference([a.events(), b.events()]) is None


def test_an_extra_call_is_found_where_the_logs_part() -> None:
    a = log_of(*SAME)
    b = log_of(*SAME, ("free", 4096, 1024))
    seq, at = first_difference([a.events(), b.events(), a.events()])
    assert seq == 2 and at[0] is None and at[2] is None
    assert at[1] is not None and at[1].op == "free"


def test_only_numbers_every_window_holds_are_compared() -> None:
    # Rank 0's window starts later; an early difference it no longer holds is not reported,
    # the later one is.
    a = HeapLog(keep=2)
    b = HeapLog(keep=8)
    for log, first in ((a, 512), (b, 768)):
        log.record("alloc", 0, first, first)
        for i in range(1, 4):
            log.record("alloc", 4096 * i, 256, 256)
    assert first_difference([a.events(), b.events()]) is None
    a.record("alloc", 65536, 256, 256)
    b.record("alloc", 65536, 512, 512)
    assert first_difference([a.events(), b.events()])[0] == 4
    # A rank whose log is unknown is left out; one known log alone says nothing.
    assert first_difference([a.events(), None, b.events()])[0] == 4
    assert first_difference([a.events(), None]) is None


def test_report_names_the_first_call_that_differs() -> None:
    a = log_of(*SAME, ("alloc", 5120, 4096))
    b = log_of(*SAME, ("alloc", 5120, 8192))
    text = asymmetry_report(0, 0x1234, a, [(0x1234, a.events()), (0xABCD, b.events())])
    assert text == (
        "The first heap call that differs between the ranks is call #2 (counted from the heap's creation): "
        "rank 0: alloc of 4096 bytes at offset 5120, shape (1024,), torch.float32; "
        "rank 1: alloc of 8192 bytes at offset 5120, shape (2048,), torch.float32 "
        "(heap digests: rank 0 0x0000000000001234, rank 1 0x000000000000abcd)"
    )


def test_report_without_the_peers_lists_this_ranks_calls() -> None:
    a = log_of(*SAME)
    text = asymmetry_report(1, 0xFF, a, None)
    assert text == (
        "Heap digest 0x00000000000000ff on rank 1; this rank's recent heap calls: "
        "#0 alloc of 4096 bytes at offset 0, shape (1024,), torch.float32; "
        "#1 alloc of 1024 bytes at offset 4096, shape (256,), torch.float32"
    )
    missing = asymmetry_report(0, 0xFF, a, [(0xFF, a.events()), None])
    assert missing.startswith("Rank(s) 1 did not report their heap calls (heap digests: rank 0 0x00000000000000ff, rank 1 unknown)")
    older = asymmetry_report(0, 0xFF, a, [(0xFF, a.events()), (0xFE, a.events())])
    assert older.startswith(f"The ranks' last {KEEP} heap calls agree: the difference is older")


def test_exchange_gathers_every_ranks_log() -> None:
    store = FakeStore()
    logs = [log_of(*SAME), log_of(*SAME, ("alloc", 5120, 256)), log_of(*SAME)]
    got: list[Optional[list]] = [None] * 3

    def rank(r: int) -> None:
        got[r] = exchange(store, "heap/1", r, 3, (r, logs[r].events()), timeout_s=10)

    run_ranks(rank, 3)
    for r in range(3):
        assert got[r] == [(q, logs[q].events()) for q in range(3)]


def test_exchange_does_not_wait_long_for_a_rank_that_never_reports() -> None:
    store = FakeStore()
    store.set("heap/1/2", __import__("pickle").dumps((2, [])))  # rank 2 reported, rank 1 never
    t0 = time.time()
    got = exchange(store, "heap/1", 0, 3, (0, []), timeout_s=0.2)
    assert time.time() - t0 < 2
    assert got == [(0, []), None, (2, [])]


@pytest.mark.parametrize(
    "name, words",
    [
        ("HEAP_ASYMMETRIC", "the ranks' symmetric heaps differ (a rank allocated or freed a tensor that the others did not"),
        ("GRID_MISMATCH", "ranks launched this call with grids of different sizes; nothing was moved"),
    ],
)
def test_recorded_misuse_is_named(name: str, words: str) -> None:
    code = _abi.STATUS[name]
    e = device_error(code, list(_abi.FUNCTIONS).index("symm_all_reduce"), rank=1)
    assert str(e).startswith(f"device function symm_all_reduce on rank 1 recorded {name} ({code}): {words}")
    assert e.status == code and e.function == "symm_all_reduce"


def test_new_statuses_follow_the_old_ones() -> None:
    assert _abi.STATUS["HEAP_ASYMMETRIC"] == -12 and _abi.STATUS["GRID_MISMATCH"] == -13
