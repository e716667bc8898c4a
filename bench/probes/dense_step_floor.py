"""The floor of bench/e2e.py's dense step at each world, on one GPU: a probe, not a benchmark
(issue 63's dense target). Every contender's step runs the same GEMMs, attention and norms on
its rank's shard of the weights; only the all-reduces differ. That work needs no peer, so one
GPU times it for any world: rank 0 of `world` holds 1 / world of the heads and FFN columns
(`models.dense.ComputeOnlyStep`, e2e.py's `compute_only` row). A contender's time above the
floor is its all-reduces, so the floor bounds what any all-reduce can give a step:

    torchrun --nproc_per_node=1 bench/probes/dense_step_floor.py --worlds 1,2,4,8 \
        --out dense-step-floor.json

Each row: world, phase, batch, the floor's ms a step (CUDA graph, median), the bytes of weights
a step reads (every layer's shard) and the rate that implies.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

import ironlink

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness and the models
from ironlink_bench import randn_bf16, record_row, time_graph, write_results  # noqa: E402
from models.dense import (PRESETS, ComputeOnlyStep, Layer, Phase, dims_problem, phases, resolve_dims,  # noqa: E402
                          sdpa_takes_gqa)


def stack(config: str, world: int, seed: int) -> Any:
    """What ComputeOnlyStep reads from a runner, without a phase yet: rank 0's layers at `world`
    (bench/e2e.py's seeds)."""
    d = resolve_dims(config, {}, 1e-5)
    layers = torch.nn.ModuleList([Layer(d, 0, world, seed + 1000 * (i + 1)) for i in range(d.layers)])
    return SimpleNamespace(d=d, world=world, rank=0, layers=layers, gqa=sdpa_takes_gqa(),
                           final_norm=1 + 0.1 * randn_bf16((d.hidden,), seed + 1))


def enter(b: Any, ph: Phase, seed: int) -> None:
    """The phase's input and residual, and rank 0's KV caches (random: the values do not matter
    to the time)."""
    b.x0 = randn_bf16((ph.tokens, b.d.hidden), seed + 2)
    b.res = torch.empty_like(b.x0)
    shape = (ph.batch, b.d.kv_heads // b.world, ph.context + ph.new, b.d.head_dim)
    for i, layer in enumerate(b.layers):
        layer.k_cache, layer.v_cache = (randn_bf16(shape, seed + 7919 * (i + 1) + j) for j in (0, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--config", choices=sorted(PRESETS), default="llama3-70b-dense")
    ap.add_argument("--worlds", default="1,2,4,8")
    ap.add_argument("--phases", default="decode,prefill")
    ap.add_argument("--batches", default="1,8,32", help="decode batches (sequences, one new token each)")
    ap.add_argument("--prefill-batch", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ironlink.init_distributed()  # time_graph takes the max over ranks: one rank here
    torch.set_grad_enabled(False)
    rows: list[dict[str, Any]] = []
    for world in map(int, args.worlds.split(",")):
        b = stack(args.config, world, args.seed)
        problem = dims_problem(b.d, world)
        if problem:
            raise SystemExit(f"dense_step_floor: {problem} (world {world})")
        weights = sum(p.nbytes for layer in b.layers for p in (layer.wqkv, layer.wo, layer.wgu, layer.wd))
        for ph in phases(args.phases.split(","), [int(x) for x in args.batches.split(",")], b.d, args.prefill_batch):
            enter(b, ph, args.seed)
            ms = time_graph(ComputeOnlyStep(b, ph), ph.tokens * b.d.hidden * 2) / 1000
            record_row(rows, {"model": b.d.model, "world": world, "phase": ph.phase, "batch": ph.batch,
                              "tokens": ph.tokens, "floor_ms": round(ms, 4), "weight_bytes": weights,
                              "weights_GBps": round(weights / ms / 1e6, 1)})
        del b
        torch.cuda.empty_cache()  # this world's layers are gone: room for the next one's
    write_results(args.out, dist.get_world_size(), rows, probe="dense_step_floor", config=args.config)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
