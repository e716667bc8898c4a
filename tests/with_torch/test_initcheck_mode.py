"""The diagnostic mode that shows a peer's heap to compute-sanitizer's initcheck
(`ironlink.runtime.initcheck`): off unless IRONLINK_INITCHECK_PEERS=1; on, every peer region is
copied out and back whole, bytes unchanged, between two barriers and with nothing copied outside
them. Whether initcheck then stays silent is a GPU question (bench/probes/initcheck_peer_reads.py
under tests/gpu/sanitize_rank.sh)."""

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


def test_every_peer_region_is_written_back_whole_between_two_barriers() -> None:
    g = torch.Generator().manual_seed(0)
    regions = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in (64, 200, 8)]
    before = [r.clone() for r in regions]
    seen: list[list[int]] = []  # each region's version (its in-place writes) at each barrier
    initcheck.mark_peers_initialized(lambda: seen.append([r._version for r in regions]), regions)
    assert len(seen) == 2, "a barrier before the copies and one after"
    assert [after - first for first, after in zip(*seen)] == [1, 1, 1], "each region written once, in between"
    for r, b in zip(regions, before):
        assert torch.equal(r, b), "its bytes unchanged"
