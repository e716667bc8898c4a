"""The floor of bench/e2e_moe.py's step at each world, on one GPU: a probe, not a benchmark
(issue 63's MoE target). Every contender's step runs each layer's norm, its local experts
(torch._grouped_mm) on the rows routing brings the rank, the weighted sum and the residual; only
the exchange differs. That work needs no peer, so one GPU times it for any world: rank r of
`world` holds experts / world experts and receives the rows e2e_moe's routing sends it, tokens x
topk on average (`models.moe.ExpertsOnlyStep`, e2e_moe's `experts_only` row). A step is then at most
(torch_a2a - floor) / (ironlink - floor) faster through its exchange, and the floor bounds what
any exchange can give:

    torchrun --nproc_per_node=1 bench/probes/moe_step_floor.py --worlds 2,4,8 --tokens 128,4096 \
        --out moe-step-floor.json

Each row: world, tokens a rank, the step's ms (CUDA graph, median) and its parts: `experts_ms`
(the grouped GEMMs alone, every layer, on the groups bench/e2e_moe.py's random routing brings
rank 0: every rank's routing redrawn here, `models.moe.route_phase`), the same in a buffer of
e2e_moe's CAPACITY_SLACK times the rows (the valid ones first, as its ironlink step passes
MoeExchange's receive buffer), `weighted_sums_ms` (the step's weighted sums alone), `experts_even_ms`: the grouped
GEMMs on as many rows spread evenly over the experts (`even_group` each, where the routing's
groups range over `group_min` .. `group_max`), and the bytes of expert weights a step reads
(every local expert's, each layer), with the rate that implies.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch
import torch.distributed as dist

import ironlink

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness and the models
from ironlink_bench import randn_bf16, record_row, time_graph, write_results  # noqa: E402
from e2e_moe import CAPACITY_SLACK  # noqa: E402  (its receive buffer: this many times the rows)
from models.moe import (PRESETS, ExpertsOnlyStep, MoeLayer, experts_ffn, resolve, route_phase,  # noqa: E402
                        stand_in_rows, weighted_rows)


def stack(config: str, world: int, seed: int) -> Any:
    """What ExpertsOnlyStep reads from a runner, without a phase yet: rank 0's layers at `world`."""
    d = resolve(config, {}, 1e-6)
    layers = [MoeLayer(d, 0, world, seed + 100_003 * (i + 1)) for i in range(d.layers)]
    return SimpleNamespace(d=d, world=world, rank=0, layers=layers)


def phase(b: Any, tokens: int, seed: int) -> None:
    """`tokens` tokens a rank, and each layer's routing as bench/e2e_moe.py draws it (its `run`'s
    seed): rank 0's weights and the groups every rank's routing brings it."""
    route_phase(b.layers, b.d, tokens, seed + tokens, 0, b.world)
    b.x0 = randn_bf16((tokens, b.d.hidden), seed + 1)
    b.res = torch.empty_like(b.x0)


def even_ends(b: Any) -> Any:
    """Group ends of tokens x topk rows spread evenly over rank 0's experts."""
    experts, rows = b.d.experts // b.world, b.x0.shape[0] * b.d.topk
    return torch.tensor([rows * (e + 1) // experts for e in range(experts)], dtype=torch.int32, device="cuda")


def experts_alone(b: Any, ends: list[Any], slack: float = 1) -> Callable[[], None]:
    """The grouped GEMMs of every layer (groups ending at `ends[layer]`) and nothing else, in a
    buffer of `slack` times tokens x topk rows, or of the most a layer receives if more (the rest
    past the last group's end), as bench/e2e_moe.py's ironlink step hands MoeExchange's receive
    buffer (recv_capacity) over with its CAPACITY_SLACK."""
    need = max(max(int(e[-1]) for e in ends), math.ceil(slack * b.x0.shape[0] * b.d.topk))
    rows = stand_in_rows(b.x0, b.d.topk, need)[:need]

    def run() -> None:
        for layer, e in zip(b.layers, ends):
            experts_ffn(rows, e, layer, b.d.ffn)

    return run


def weighted_sums(b: Any) -> Callable[[], None]:
    """ExpertsOnlyStep's weighted sums of every layer (one batched GEMM each), nothing else."""
    y = b.x0.repeat_interleave(b.d.topk, dim=0)

    def run() -> None:
        for layer in b.layers:
            weighted_rows(layer.weights, y)

    return run


def time_world(args: argparse.Namespace, world: int, rows: list[dict[str, Any]]) -> None:
    """A row for each of `args.tokens` at `world`."""
    b = stack(args.config, world, args.seed)
    for tokens in map(int, args.tokens.split(",")):
        phase(b, tokens, args.seed)
        nbytes = tokens * b.d.hidden * 2 * b.d.layers
        routed = [layer.recv_ends for layer in b.layers]
        step_ms = time_graph(ExpertsOnlyStep(b), nbytes) / 1000
        experts_ms = time_graph(experts_alone(b, routed), nbytes) / 1000
        padded_ms = time_graph(experts_alone(b, routed, CAPACITY_SLACK), nbytes) / 1000
        twice_ms = time_graph(experts_alone(b, routed, 2), nbytes) / 1000
        even_ms = time_graph(experts_alone(b, [even_ends(b)] * b.d.layers), nbytes) / 1000
        wsum_ms = time_graph(weighted_sums(b), nbytes) / 1000
        groups = torch.cat([torch.diff(e, prepend=e.new_zeros(1)) for e in routed])
        weights = sum(layer.w13.nbytes + layer.w2.nbytes for layer in b.layers)
        record_row(rows, {"model": b.d.model, "world": world, "tokens": tokens, "local_experts": len(routed[0]),
                          "step_ms": round(step_ms, 4), "experts_ms": round(experts_ms, 4),
                          f"experts_in_{CAPACITY_SLACK}x_rows_ms": round(padded_ms, 4),
                          "experts_in_2x_rows_ms": round(twice_ms, 4),
                          "weighted_sums_ms": round(wsum_ms, 4), "experts_even_ms": round(even_ms, 4),
                          "even_group": tokens * b.d.topk // len(routed[0]),
                          "group_min": int(groups.min()), "group_max": int(groups.max()),
                          "weight_bytes": weights, "weights_GBps": round(weights / experts_ms / 1e6, 1)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--config", choices=sorted(PRESETS), default="deepseek-v3-moe")
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--tokens", default="128,4096", help="tokens per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ironlink.init_distributed()  # time_graph takes the max over ranks: one rank here
    rows: list[dict[str, Any]] = []
    for world in map(int, args.worlds.split(",")):
        time_world(args, world, rows)
        torch.cuda.empty_cache()  # this world's layers are gone: room for the next one's
    write_results(args.out, dist.get_world_size(), rows, probe="moe_step_floor", config=args.config)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
