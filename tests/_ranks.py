"""Ranks simulated by threads (a helper, no tests of its own): the CPU tests of what ranks do
together (store exchanges, the MoE benchmark's simulated paths) run each rank's part at once."""

from __future__ import annotations

import threading
from typing import Callable


def run_ranks(rank: Callable[[int], None], world: int) -> None:
    """`rank(r)` for every r < `world`, each on a thread of its own, as the ranks' processes would
    run; returns once every one has."""
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
