"""check=True's comparison of the ranks' calls (no GPU, no torch): the message for calls that
differ or a rank that never made its call, the exchange through a store with one key set a call
(older ones deleted), and the host-level ops naming what every rank's call must share, before
they launch anything."""

from __future__ import annotations

import time
from typing import Any, Optional

import pytest

from ironlink.language import _abi
from ironlink.runtime.call_check import Call, CallCheck, mismatch
from ironlink.runtime.errors import CALL_COMPARISON_DETAIL, IronlinkError

from _fake_store import FakeStore  # tests/, the helpers' folder
from _ranks import run_ranks


def call(elements: int, op: str = "sum") -> Call:
    return Call("all_reduce", (("elements", elements), ("dtype", "bfloat16"), ("op", op)))


def test_the_same_call_everywhere_passes() -> None:
    assert mismatch([call(4096)] * 4, 2, 30) is None


def test_calls_that_differ_are_named_with_every_ranks_call() -> None:
    got = mismatch([call(1000), call(2000), call(1000)], 0, 30)
    assert got == ("the ranks' calls differ in elements: "
                   "rank 0: ironlink.all_reduce(elements=1000, dtype=bfloat16, op=sum); "
                   "rank 1: ironlink.all_reduce(elements=2000, dtype=bfloat16, op=sum); "
                   "rank 2: ironlink.all_reduce(elements=1000, dtype=bfloat16, op=sum)")
    two = mismatch([call(1000, "max"), call(2000)], 1, 30)
    assert two is not None and two.startswith("the ranks' calls differ in elements, op: ")
    other_op = mismatch([call(8), Call("all_gather", (("elements", 8), ("dtype", "bfloat16")))], 0, 30)
    assert other_op is not None and "differ in op" in other_op and "ironlink.all_gather(elements=8" in other_op


def test_a_rank_that_never_made_the_call_is_named() -> None:
    got = mismatch([call(8), None, call(8)], 2, 0.5)
    assert got == ("rank(s) [1] did not make this call within 0.5 s (skipped it, made other checked ironlink "
                   "calls before it, or are stuck); rank 2's call: ironlink.all_reduce(elements=8, dtype=bfloat16, op=sum)")


def ranks_compare(store: FakeStore, checks: list[CallCheck], calls: list[tuple[str, dict[str, Any]]]) -> list[Optional[str]]:
    """Each rank's `compare` of its call, at once on threads, as the ranks' processes would: the
    error each raised (None: it passed)."""
    got: list[Optional[str]] = [None] * len(calls)

    def rank(r: int) -> None:
        op, fields = calls[r]
        try:
            checks[r].compare(store, "heap-a", r, len(calls), op, fields)
        except IronlinkError as e:
            got[r] = str(e)

    run_ranks(rank, len(calls))
    return got


def test_ranks_compare_their_calls_through_the_store_and_keep_two_calls_of_keys() -> None:
    store, checks = FakeStore(), [CallCheck(10) for _ in range(3)]
    same = ("all_reduce", {"elements": 4096, "dtype": "bfloat16", "op": "sum"})
    for _ in range(4):
        assert ranks_compare(store, checks, [same] * 3) == [None] * 3
    assert sorted(store.data) == [f"ironlink/calls/heap-a/{n}/{r}" for n in (2, 3) for r in range(3)]
    differ = ranks_compare(store, checks, [same, ("all_reduce", {**same[1], "elements": 2048}), same])
    for r, m in enumerate(differ):
        assert m is not None and m.startswith(f"ironlink.all_reduce(check=True) on rank {r}: the ranks' calls "
                                              "differ in elements: rank 0: ironlink.all_reduce(elements=4096, ")
        assert m.endswith("; nothing was launched")


def test_a_rank_that_skips_the_call_fails_the_others_within_the_heaps_timeout() -> None:
    t0 = time.time()
    with pytest.raises(IronlinkError, match=r"ironlink.all_gather\(check=True\) on rank 0: rank\(s\) \[1\] did "
                                            r"not make this call within 0.2 s") as e:
        CallCheck(0.2).compare(FakeStore(), "heap-b", 0, 2, "all_gather", {"elements": 8, "dtype": "float32"})
    assert time.time() - t0 < 2
    assert e.value.status == _abi.STATUS["TIMEOUT"]


def test_a_rank_that_never_made_the_call_is_recorded_in_the_context_and_calls_that_differ_are_not() -> None:
    recorded: list[tuple[int, int]] = []  # what `record` (the heap's context) was given
    with pytest.raises(IronlinkError, match="did not make this call"):
        CallCheck(0.2).compare(FakeStore(), "heap-e", 0, 2, "all_reduce", {"elements": 8}, record=lambda *a: recorded.append(a))
    assert recorded == [(_abi.STATUS["TIMEOUT"], CALL_COMPARISON_DETAIL)]  # heap.check() raises it; device waits give up
    store, checks, records = FakeStore(), [CallCheck(10) for _ in range(2)], [[], []]  # type: ignore[var-annotated]

    def rank(r: int) -> None:
        with pytest.raises(IronlinkError, match="differ in elements"):
            checks[r].compare(store, "heap-f", r, 2, "all_reduce", {"elements": 8 * (r + 1)}, record=lambda *a: records[r].append(a))

    run_ranks(rank, 2)
    assert records == [[], []]  # every rank raised, nothing launched: the heap stays usable


def test_the_heap_records_a_rank_that_never_made_the_call_in_its_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the killed-rank suite found missing (session 52): after check=True named a lost peer,
    heap.check() must raise it too, so the heap's native context gets the TIMEOUT."""
    from types import SimpleNamespace

    from ironlink.runtime import heap as heap_module
    from ironlink.runtime.heap import SymmetricHeap

    monkeypatch.setattr(heap_module, "default_store", FakeStore)
    recorded: list[tuple[int, int]] = []
    h = SymmetricHeap.__new__(SymmetricHeap)  # the state __init__ leaves, without a GPU
    h._uid, h._rank, h._world, h._checked, h._closed = "heap-g", 0, 2, CallCheck(0.2), False
    h._native = SimpleNamespace(record_error=lambda code, detail: recorded.append((code, detail)))
    h._rendezvous = SimpleNamespace(alive=lambda: True)
    with pytest.raises(IronlinkError, match=r"rank\(s\) \[1\] did not make this call"):
        h.compare_call("all_reduce", elements=8, dtype="float32", op="sum")
    assert recorded == [(_abi.STATUS["TIMEOUT"], CALL_COMPARISON_DETAIL)]


def test_without_a_store_nothing_is_compared() -> None:
    CallCheck(1).compare(None, "heap-c", 0, 2, "all_reduce", {"elements": 1})


def test_the_heap_compares_through_the_default_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from ironlink.runtime import heap as heap_module
    from ironlink.runtime.heap import SymmetricHeap

    store = FakeStore()
    monkeypatch.setattr(heap_module, "default_store", lambda: store)
    heaps = []
    for r in range(2):
        h = SymmetricHeap.__new__(SymmetricHeap)  # the state __init__ leaves, without a GPU
        h._uid, h._rank, h._world, h._checked = "heap-d", r, 2, CallCheck(10)
        heaps.append(h)
    errors: list[Optional[str]] = [None, None]

    def rank(r: int, elements: int) -> None:
        try:
            heaps[r].compare_call("all_reduce", elements=elements, dtype="float32", op="sum")
        except IronlinkError as e:
            errors[r] = str(e)

    for sizes in ((64, 64), (64, 128)):
        run_ranks(lambda r: rank(r, sizes[r]), 2)
        if sizes == (64, 64):
            assert errors == [None, None]
    assert errors[0] is not None and errors[1] is not None
    assert errors[1].startswith("ironlink.all_reduce(check=True) on rank 1: the ranks' calls differ in elements: "
                                "rank 0: ironlink.all_reduce(elements=64, dtype=float32, op=sum); rank 1: "
                                "ironlink.all_reduce(elements=128, dtype=float32, op=sum); nothing was launched")
