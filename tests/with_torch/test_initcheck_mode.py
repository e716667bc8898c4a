"""The diagnostic mode that shows a peer's heap to compute-sanitizer's initcheck
(`ironlink.runtime.initcheck`): off unless IRONLINK_INITCHECK_PEERS=1; on, every peer region (all
zeros in a new heap) is written once, bytes unchanged, between two barriers. Whether initcheck
then stays silent is a GPU question (bench/probes/initcheck_peer_reads.py under
tests/gpu/sanitize_rank.sh)."""

from __future__ import annotations

import pytest

from ironlink.runtime import initcheck

torch = pytest.importorskip("torch")


def test_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(initcheck.ENV, raising=False)
    assert not initcheck.wanted()
    for value in ("0", "", "yes"):
        monkeypatch.setenv(initcheck.ENV, value)
        assert not initcheck.wanted()
    monkeypatch.setenv(initcheck.ENV, "1")
    assert initcheck.wanted()


def test_every_fresh_peer_region_is_written_once_between_two_barriers() -> None:
    regions = [torch.zeros(n, dtype=torch.uint8) for n in (64, 200, 8)]  # a new heap: all zeros
    seen: list[list[int]] = []  # each region's version (its in-place writes) at each barrier
    initcheck.mark_peers_initialized(lambda: seen.append([r._version for r in regions]), regions)
    assert len(seen) == 2, "a barrier before the fills and one after"
    assert [after - first for first, after in zip(*seen)] == [1, 1, 1], "each region written once, in between"
    assert all(not r.any() for r in regions), "its bytes unchanged"
