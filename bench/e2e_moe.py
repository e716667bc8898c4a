"""End to end, expert parallel: a stack of MoE layers shaped like DeepSeek-V3's, each contender's
whole step timed on the same GPUs with the same weights (issue 63 item 2; the dense stack is
bench/e2e.py):

    torchrun --nproc_per_node=4 bench/e2e_moe.py --out bench/results/e2e-moe-4xh200.json  (bench/run.sh e2e_moe)
    torchrun --nproc_per_node=2 bench/e2e_moe.py --check     (correctness alone, the small configuration)

The stack and its contenders' steps: bench/models/moe.py (the same model at any world size).
The routing of each layer is drawn once per phase (random scores, top-k, softmaxed weights, as
bench/moe.py) instead of computed from h: a router's top-k flips on the last-bit differences
between contenders, which would leave nothing to compare. The router's GEMM ([tokens, 7168] x
[7168, experts]) is left out of every contender alike.
Phases: `--tokens` 128 and 4096 tokens per rank. Contenders:
- torch_a2a: the tokens sorted by expert, the counts exchanged with all_to_all_single and read
  back to the host, the rows and their expert ids by all_to_all_single, sorted by local expert,
  the grouped GEMMs, the rows back the same way, the weighted sum: timed eagerly (the host reads
  the counts every layer, so no CUDA graph holds it);
- ironlink: MoeExchange(path="direct") dispatch, the grouped GEMMs over its expert_offsets and
  expert_counts (read on the GPU), combine; the whole step in a CUDA graph. The direct path's
  rows are packed by expert, what torch._grouped_mm takes; the low-latency path's are laid out in
  blocks of world x max_tokens rows an expert, which would need a grouped GEMM that skips the gaps;
- experts_only (not a contender: the floor): the same step with no exchange, the local experts on
  the groups of rows the routing brings (`models.moe.ExpertsOnlyStep`), in a CUDA graph. What a
  contender takes above it is its exchange: a step can be at most (torch_a2a - floor) / (ironlink
  - floor) faster through the exchange alone, and where the floor is most of the step, far less;
- exchange_only (not a contender either): ironlink's step with an identity for its experts
  (`models.moe.ExchangeOnlyStep`): its dispatch and combine in the step, in a CUDA graph;
- received_experts: ironlink's step with no exchange, each layer's experts on the rows its
  dispatch received, as laid out (`models.moe.ReceivedExpertsStep`): against experts_only, what
  that layout costs the grouped GEMMs.
Check: ironlink's final output within --tol of torch_a2a's (max |x - ref| / max |ref|) on every
rank, else a FAILED line and exit status 1.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Optional

from models.moe import PRESETS, MoeDims, dims_problem, resolve

try:  # the pure helpers below need neither torch nor a GPU (tests/cpu/test_e2e.py)
    import torch
    import torch.distributed as dist

    import ironlink
    from ironlink_bench import GraphRound, randn_bf16, time_eager, write_results
    from ironlink.tune.timing import captured
    from models.moe import (ExchangeOnlyStep, ExpertsOnlyStep, IronlinkStep, MoeLayer, ReceivedExpertsStep, TorchStep,
                            route_phase)
    IMPORT_ERROR: Optional[ImportError] = None
except ImportError as e:
    torch, IMPORT_ERROR = None, e

TOKENS = (128, 4096)
# The step's parts timed beside the contenders (not contenders: their outputs are not the model's):
# models.moe's ExpertsOnlyStep, ExchangeOnlyStep and ReceivedExpertsStep.
PARTS = ("experts_only", "exchange_only", "received_experts")
# recv_capacity: this many times the rows uniform routing brings a rank on average (the capacity
# factor of GShard and Switch). The grouped GEMMs run over all of recv_x: at world 2, 4096 tokens,
# twice the rows cost 1.4 ms a step (bench/probes/moe_step_floor.py); random routing brings a rank
# within a few percent of the mean at these sizes, and more raises CAPACITY_EXCEEDED.
CAPACITY_SLACK = 1.25
SLACK_BYTES = 256 << 20


def recv_capacity(tokens: int, topk: int, world: int) -> int:
    """The rows MoeExchange keeps for a rank's experts: CAPACITY_SLACK times the tokens x topk
    uniform routing brings on average, at most every choice of every rank."""
    return min(world * tokens * topk, math.ceil(CAPACITY_SLACK * tokens * topk))


def heap_size(d: MoeDims, tokens: int, world: int) -> int:
    """The symmetric heap for phases of up to `tokens` tokens a rank: the exchange's buffers and
    SLACK_BYTES."""
    moe = ironlink.MoeExchange.heap_bytes(world, tokens, d.hidden, d.topk, path="direct",
                                          recv_capacity=recv_capacity(tokens, d.topk, world))
    return moe + SLACK_BYTES


class MoeE2E:
    def __init__(self, args: argparse.Namespace, d: MoeDims, tokens: list[int]) -> None:
        self.args, self.d = args, d
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.heap = ironlink.SymmetricHeap(heap_size(d, max(tokens), self.world), timeout_s=args.timeout_s)
        self.layers = [MoeLayer(d, self.rank, self.world, args.seed + 100_003 * (i + 1)) for i in range(d.layers)]
        self.rows: list[dict[str, Any]] = []
        self.failures: list[str] = []

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    def run(self, tokens: int) -> None:
        d, seed = self.d, self.args.seed + tokens
        self.x0 = randn_bf16((tokens, d.hidden), seed + 13 * self.rank + 1)
        self.res = torch.empty_like(self.x0)
        route_phase(self.layers, d, tokens, seed, self.rank, self.world)
        self.exchange = ironlink.MoeExchange(self.heap, tokens, d.hidden, d.topk, d.experts, path="direct",
                                             recv_capacity=recv_capacity(tokens, d.topk, self.world))
        ref, mine = TorchStep(self), IronlinkStep(self)
        times: dict[str, float] = {}
        if self.args.check:
            ref()
            captured(mine, 1)
        else:
            times["torch_a2a"] = time_eager(ref) / 1000
            timer = GraphRound()
            timer.add(mine, tokens * d.hidden * 2 * d.layers, tag="ironlink")
            for tag, part in zip(PARTS, (ExpertsOnlyStep, ExchangeOnlyStep, ReceivedExpertsStep)):
                timer.add(part(self), tokens * d.hidden * 2 * d.layers, tag=tag)
            times.update({name: us / 1000 for name, us in timer.run_tagged()})
        self.exchange.check()  # a routing past recv_capacity raises CAPACITY_EXCEEDED here, named
        err = self.verify(tokens, ref.final, mine.final)
        for name in ("torch_a2a", "ironlink"):
            self.record(tokens, name, times.get(name), times.get("torch_a2a"), err if name == "ironlink" else 0.0)
        for name in PARTS:
            if name in times:  # not under --check: a part is a time, there is nothing to check
                self.record(tokens, name, times[name], times.get("torch_a2a"), 0.0)
        self.exchange.close()

    def verify(self, tokens: int, ref: Any, got: Any) -> float:
        scale = ref.float().abs().max().clamp_min(1e-30)
        err = ((got.float() - ref.float()).abs().max() / scale).reshape(1)
        every = [torch.empty_like(err) for _ in range(self.world)]
        dist.all_gather(every, err)
        worst = max(e.item() for e in every)
        if not worst <= self.args.tol:  # NaN fails
            msg = (f"FAILED: e2e {self.d.model} {tokens} tokens: ironlink differs from torch_a2a by {worst:.3g} "
                   f"(max |x - ref| / max |ref|) > {self.args.tol}")
            self.failures.append(msg)
            self.say(msg)
        return worst

    def record(self, tokens: int, name: str, ms: Optional[float], ref_ms: Optional[float], err: float) -> None:
        row = {"model": self.d.model, "phase": "moe", "batch": tokens, "tokens": tokens, "contender": name,
               "ms": None if ms is None else round(ms, 4),
               "tokens_per_s": None if not ms else round(tokens / ms * 1000, 1),
               "vs_torch_a2a": None if not ms or not ref_ms else round(ref_ms / ms, 3), "rel_err": err,
               "layers": self.d.layers, "world": self.world}
        self.rows.append(row)
        timing = f"{ms:10.3f} ms {row['tokens_per_s']:>11} tok/s x{row['vs_torch_a2a']}" if ms else "(check only)"
        self.say(f"moe tokens {tokens:>5} {name:>10} {timing}  err {err:.2e}")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", default=None, help="JSON file to write (rank 0)")
    ap.add_argument("--config", choices=sorted(PRESETS), default=None,
                    help="the dimensions' defaults (default deepseek-v3-moe; small-moe with --check)")
    for name in ("layers", "hidden", "experts", "topk", "ffn"):
        ap.add_argument(f"--{name}", type=int, default=None, help="overrides the --config value")
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="tokens per rank, one phase each")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=3e-2, help="max |x - ref| / max |ref| allowed")
    ap.add_argument("--check", action="store_true", help="the correctness check alone (no timing)")
    ap.add_argument("--timeout-s", type=float, default=30.0, help="the heap's wait timeout")
    return ap.parse_args()


def main() -> int:
    args = parse()
    if torch is None:
        print(f"e2e_moe.py needs torch, a GPU and ironlink's host side: {IMPORT_ERROR}", file=sys.stderr)
        return 2
    config = args.config or ("small-moe" if args.check else "deepseek-v3-moe")
    d = resolve(config, {n: getattr(args, n) for n in ("layers", "hidden", "experts", "topk", "ffn")}, args.eps)
    ironlink.init_distributed()
    torch.set_grad_enabled(False)
    problem = dims_problem(d, dist.get_world_size())
    if problem:
        raise SystemExit(f"e2e_moe: {problem} (world {dist.get_world_size()})")
    if not hasattr(torch, "_grouped_mm"):
        raise SystemExit(f"e2e_moe: this torch ({torch.__version__}) has no torch._grouped_mm")
    tokens = [int(t) for t in args.tokens.split(",") if t]
    b = MoeE2E(args, d, tokens)
    b.say(f"e2e_moe {d} world {b.world}, heap {b.heap.nbytes >> 20} MiB")
    for t in tokens:
        b.run(t)
    write_results(args.out, b.world, b.rows, dims=d._asdict(), check=args.check, tol=args.tol, failures=b.failures)
    b.heap.close()
    dist.destroy_process_group()
    return 1 if b.failures else 0


if __name__ == "__main__":
    sys.exit(main())
