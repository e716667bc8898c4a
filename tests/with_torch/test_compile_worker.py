"""The GPU compile suite's own operator (tests/gpu/workers/compile_worker.py, `ranks_meet`) on
the CPU, one rank over gloo: Dynamo captures it in one graph with no break, the graph calls it
(the barrier runs, `MET` records it) and its outputs are the inputs' values. Needs torch
(skipped without it, as in CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu" / "workers"))
import compile_worker  # noqa: E402


class Block(torch.nn.Module):
    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        x, counts = torch.ops.ironlink_test.ranks_meet([x, counts])
        return torch.relu(x @ x.T) + counts.sum()


def test_ranks_meet_stays_in_one_graph_and_runs(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch._dynamo.reset()
        counters.clear()
        compile_worker.MET.clear()
        x, counts = torch.randn(4, 4), torch.arange(3)
        got = torch.compile(Block(), fullgraph=True)(x, counts)
        assert "at" in compile_worker.MET  # the compiled graph called it
        assert torch.allclose(got, torch.relu(x @ x.T) + counts.sum())
        assert counters["stats"]["unique_graphs"] == 1 and sum(counters["graph_break"].values()) == 0
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()
