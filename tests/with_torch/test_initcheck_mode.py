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


@pytest.mark.parametrize("rank, node_size, peers", [(1, 4, [0, 2, 3]), (5, 4, [4, 6, 7]), (0, 1, [])])
def test_every_fresh_peer_region_of_the_node_is_written_once_between_two_barriers(
        rank: int, node_size: int, peers: list[int]) -> None:
    regions = {p: torch.zeros(64, dtype=torch.uint8) for p in range(8)}  # a new heap: all zeros
    asked: list[tuple[int, int, int]] = []

    def view(p: int, offset: int, nbytes: int) -> torch.Tensor:
        asked.append((p, offset, nbytes))
        return regions[p][offset:offset + nbytes]

    seen: list[list[int]] = []  # each region's version (its in-place writes) at each barrier
    initcheck.mark_peers_initialized(lambda: seen.append([r._version for r in regions.values()]), view, rank,
                                     node_size, 64)
    assert asked == [(p, 0, 64) for p in peers], "the whole region of every other rank of the node"
    assert len(seen) == 2, "a barrier before the fills and one after"
    assert [after - first for first, after in zip(*seen)] == [int(p in peers) for p in range(8)]
    assert all(not r.any() for r in regions.values()), "its bytes unchanged"
