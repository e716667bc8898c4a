"""End to end: a tensor-parallel decoder stack shaped like Llama 3 70B, each contender's whole step in
a CUDA graph, same process, same GPUs, same weights (issue 63 item 1):

    torchrun --nproc_per_node=4 bench/e2e.py --out bench/results/e2e-4xh200.json   (bench/run.sh e2e)
    torchrun --nproc_per_node=2 bench/e2e.py --check      (correctness alone, the small configuration)

The stack and its contenders' steps: bench/models/dense.py (the same model at any world size).
Phases: decode at batch 1, 8, 32 (one new token a sequence over 2048 random tokens of context) and
a 2048-token prefill at batch 1 (causal, from an empty cache). Contenders:
- nccl: torch.mm, dist.all_reduce, add, F.rms_norm (the check's reference);
- torch_symm: the same over PyTorch's symm_mem one_shot_all_reduce up to 64 KiB, else
  two_shot_all_reduce_ (level at 64 KiB, two-shot ahead from 256 KiB in the
  allreduce-*xNVIDIA-H200 runs); skipped, saying why, where this torch cannot run it;
- ironlink[norm]: torch.mm into a heap tensor, ironlink.all_reduce_rmsnorm (all-reduce, add, norm);
- ironlink[mm]: ironlink.matmul_all_reduce, then the add and F.rms_norm in torch. An all-reduce
  takes one fused op or the other: each is followed by an add and a norm;
- ironlink: ironlink[norm]'s row (DEFAULT_VARIANT: in docs/fused.md torch's add + norm alone take
  8.5 us at 1 token, more than matmul_all_reduce saves over torch.mm + all-reduce at M = 16,
  3.8 us; at 2048 tokens the two estimate level, as ironlink[mm]'s rows will say);
- ironlink_compile: that composition under torch.compile(fullgraph=True) (ironlink's ops are
  torch.library operators), then captured the same way; skipped, saying why, if it fails;
- compute_only (not a contender: the floor, not checked): the step with no all-reduce
  (`models.dense.ComputeOnlyStep`), timed in the same round.
With --any-tensor ironlink's activations are ordinary tensors, which its ops stage through heap
workspaces (issue 63 item 3: the cost of any tensor in, per step). A fused op that refuses a
shape falls back to torch.mm + ironlink.all_reduce + torch ops; each row's `ops` says what each
projection ran, with the mode or method the op chose.
Timing: ironlink_bench.GraphRound (replays in turns, every rank's started together, median per
step, max over ranks). Check, after the timed replays or alone (--check): on every rank each
contender's final output within --tol (3e-2) of nccl's as max |x - nccl| / max |nccl|; else a
FAILED line and exit status 1. Heap: what the ops' heap_bytes say at the largest phase, the two
activations, torch.compile's staging copies of them and 256 MiB.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import re
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

from ironlink.fused.all_reduce_rmsnorm import heap_bytes as rmsnorm_heap_bytes, plan as rmsnorm_plan
from ironlink.fused.matmul_all_reduce import heap_bytes as mm_heap_bytes, plan as mm_plan
from ironlink.ops.collectives import heap_bytes as all_reduce_heap_bytes
from ironlink.runtime.distributed import ranks_per_gpu
from ironlink.runtime.heap import DEFAULT_TIMEOUT_S
from ironlink.runtime.tensor_spec import TensorSpec
from models.dense import FLOOR, PRESETS, Dims, Phase, dims_problem, phases, resolve_dims

try:  # the pure helpers below need neither torch nor a GPU (tests/cpu/test_e2e.py)
    import torch
    import torch.distributed as dist

    import ironlink
    from ironlink.runtime.distributed import sm_share
    from ironlink.tune.timing import captured
    from ironlink_bench import GraphRound, randn_bf16, write_results
    from models.dense import ComputeOnlyStep, Layer, IronlinkStep, NcclStep, SymmStep, sdpa_takes_gqa
    IMPORT_ERROR: Optional[ImportError] = None
except ImportError as e:
    torch, IMPORT_ERROR = None, e

PROJECTIONS = ("o_proj", "down_proj")  # the row-parallel ones, each followed by an all-reduce
VARIANTS = ("norm", "mm")  # ironlink's compositions (module docs)
DEFAULT_VARIANT = "norm"
COMPILE_WAIT_S = 120.0  # the heap's wait timeout while the ranks compile (they finish seconds apart)
SLACK_BYTES = 256 << 20
DEV = "cuda:0"  # the pure plans' device (any one: they check shapes)
NCCL_OPS = "torch.mm + dist.all_reduce + add + F.rms_norm"


def step_bytes(d: Dims, tokens: int) -> int:
    """Bytes all-reduced in one step (two all-reduces a layer): GraphRound's calls per graph by it."""
    return 2 * d.layers * tokens * d.hidden * 2


def ironlink_op(variant: str, tokens: int, k: int, hidden: int, world: int, sms: int) -> tuple[str, str]:
    """(what the step runs, its label for the row) for one row-parallel projection [tokens, k] x
    [k, hidden] in composition `variant`: "norm", "mm", or "all_reduce" where the fused op
    refuses the shape (its plan, a pure check, raises)."""
    x = TensorSpec("x", (tokens, hidden), "bfloat16", 2, True, DEV, 1 << 30)
    try:
        if variant == "norm":
            w = TensorSpec("weight", (hidden,), "bfloat16", 2, True, DEV, 3 << 30)
            mode = rmsnorm_plan(x, x._replace(name="residual", data_ptr=2 << 30), w,
                                x._replace(name="out", data_ptr=4 << 30), DEV, world, sms).mode
            return "norm", f"torch.mm + ironlink.all_reduce_rmsnorm[{mode}]"
        a = TensorSpec("a", (tokens, k), "bfloat16", 2, True, DEV, 5 << 30)
        method = mm_plan(a, TensorSpec("b", (k, hidden), "bfloat16", 2, True, DEV, 6 << 30),
                         x._replace(name="out"), DEV, world, sms).method
        return "mm", f"ironlink.matmul_all_reduce[{method}] + add + F.rms_norm"
    except (ValueError, TypeError) as e:
        return "all_reduce", f"torch.mm + ironlink.all_reduce + add + F.rms_norm ({variant}: {e})"


def heap_size(d: Dims, tokens: int, world: int, sms: int) -> int:
    """The symmetric heap for phases of up to `tokens` tokens (module docs)."""
    act = tokens * d.hidden * 2
    try:
        norm = rmsnorm_heap_bytes(tokens, d.hidden, world, sms=sms)
    except ValueError:  # a hidden size it refuses: all_reduce instead
        norm = 0
    try:
        mm = max(mm_heap_bytes(tokens, d.hidden, k, world, sms=sms) for k in (d.heads // world * d.head_dim,
                                                                               d.ffn // world))
    except ValueError:  # some row count refused: a bound on its slots, 2 (world - 1) x out, kept by powers of two
        mm = 8 * (world - 1) * act
    return 2 * act + norm + mm + all_reduce_heap_bytes(act, world) + 4 * act + SLACK_BYTES


def within(err: float, tol: float) -> bool:
    return err <= tol  # NaN fails


class Entry(NamedTuple):
    name: str
    fn: Callable[[], Any]  # what the graph captures
    step: Any  # its Step: `final` holds the output
    ops: dict[str, str]


class E2E:
    def __init__(self, args: argparse.Namespace, d: Dims, plan: list[Phase]) -> None:
        self.args, self.d = args, d
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.sms = sm_share(torch.cuda.current_device())
        self.group = dist.group.WORLD.group_name
        self.wanted = re.compile(args.contenders)  # nccl always runs: the check's reference
        self.heap = ironlink.SymmetricHeap(heap_size(d, max(p.tokens for p in plan), self.world, self.sms),
                                           timeout_s=args.timeout_s)
        self.layers = torch.nn.ModuleList([Layer(d, self.rank, self.world, args.seed + 1000 * (i + 1))
                                           for i in range(d.layers)])
        self.final_norm = 1 + 0.1 * randn_bf16((d.hidden,), args.seed + 1)
        self.gqa = sdpa_takes_gqa()
        self.rows: list[dict[str, Any]] = []
        self.failures: list[str] = []

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    def enter(self, ph: Phase) -> None:
        """The phase's input, residual, heap activations and KV caches (random context)."""
        d, seed = self.d, self.args.seed
        self.x0 = randn_bf16((ph.tokens, d.hidden), seed + 2)
        self.res = torch.empty_like(self.x0)
        shape = (ph.tokens, d.hidden)  # with --any-tensor ordinary tensors, which the ops stage
        self.bufs = tuple(torch.empty(shape, dtype=torch.bfloat16, device="cuda") if self.args.any_tensor
                          else self.heap.empty(shape, torch.bfloat16) for _ in PROJECTIONS)
        full = (ph.batch, d.kv_heads, ph.context + ph.new, d.head_dim)
        for i, layer in enumerate(self.layers):
            layer.k_cache, layer.v_cache = (randn_bf16(full, seed + 7919 * (i + 1) + j).chunk(self.world, 1)[self.rank]
                                            .contiguous() for j in (0, 1))

    def leave(self) -> None:
        torch.cuda.synchronize()
        self.heap.check()
        for x in self.bufs if not self.args.any_tensor else ():
            self.heap.free(x)
        for layer in self.layers:
            layer.k_cache = layer.v_cache = None
        torch._dynamo.reset()

    def composition(self, variant: str, tokens: int) -> tuple[tuple[str, ...], dict[str, str]]:
        ks = (self.d.heads // self.world * self.d.head_dim, self.d.ffn // self.world)
        got = [ironlink_op(variant, tokens, k, self.d.hidden, self.world, self.sms) for k in ks]
        return tuple(kind for kind, _ in got), dict(zip(PROJECTIONS, (label for _, label in got)))

    def trial(self, name: str, fn: Callable[[], Any], required: bool) -> bool:
        """Runs `fn` once: whether it ran on every rank, else why not (FAILED where `required` or
        where ironlink raised, an error its kernels recorded included; else skipped). A first call
        compiles kernels (or the whole stack), which the ranks finish seconds apart: the heap's
        waits get --compile-wait-s (COMPILE_WAIT_S) meanwhile."""
        self.heap.set_timeout(max(self.args.timeout_s, self.args.compile_wait_s))
        reason, ironlink_failed = "", False
        trace = os.environ.get("IRONLINK_GPU_VERBOSE") == "1"  # each rank says where it is: a stall is located
        try:
            if trace:  # and, while the call lasts past a minute, every rank's Python stacks each minute
                print(f"[rank {self.rank} {time.strftime('%H:%M:%S')}] {name}: first call", flush=True)
                faulthandler.dump_traceback_later(60, repeat=True)
            fn()
            torch.cuda.synchronize()
            self.heap.check()  # a wait that timed out in the call: named here, not at the phase's end
            if trace:
                print(f"[rank {self.rank} {time.strftime('%H:%M:%S')}] {name}: ran", flush=True)
        except Exception as e:  # not every torch build runs symm_mem (or compiles the stack): say why, go on
            reason = f"{type(e).__name__}: {str(e)[:300]}"
            ironlink_failed = isinstance(e, ironlink.IronlinkError)
            if self.rank != 0:  # rank 0 says the verdict; the reason of a rank that failed alone is here
                print(f"[rank {self.rank}] e2e {name}: {reason}", flush=True)
        faulthandler.cancel_dump_traceback_later()
        # Every rank adds the same contenders and gives the same verdict: ran everywhere, ironlink failed anywhere.
        agreed = torch.tensor([int(not reason), -int(ironlink_failed)], device="cuda")
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        ok, required = bool(agreed[0].item()), required or bool(agreed[1].item())
        self.heap.set_timeout(self.args.timeout_s)
        if not ok:
            msg = f"{'FAILED' if required else 'skipped'}: e2e {name}: {reason or 'failed on another rank'}"
            self.failures += [msg] if required else []
            self.say(msg)
        return ok

    def contenders(self, ph: Phase) -> list[Entry]:
        nccl = NcclStep(self, ph)
        out = [Entry("nccl", nccl, nccl, {p: NCCL_OPS for p in PROJECTIONS})]
        if self.wanted.search("torch_symm"):
            out += self.symm(ph)
        for name, variant in [(f"ironlink[{v}]", v) for v in VARIANTS] + [("ironlink_compile", DEFAULT_VARIANT)]:
            chosen = name == f"ironlink[{DEFAULT_VARIANT}]"  # the `ironlink` row is its: asking for either runs it
            if not (self.wanted.search(name) or chosen and self.wanted.search("ironlink")):
                continue
            kinds, ops = self.composition(variant, ph.tokens)
            step = IronlinkStep(self, ph, kinds)
            fn = (torch.compile(step, fullgraph=True, dynamic=False, options=self.args.compile_options or None)
                  if name == "ironlink_compile" else step)
            if self.trial(name, fn, name != "ironlink_compile"):  # ironlink's own failing: FAILED
                out.append(Entry(name, fn, step, ops))
        return out

    def symm(self, ph: Phase) -> list[Entry]:
        """torch_symm, as fused.py's torch_symm_torch: where this torch runs it; else why not."""
        import torch.distributed._symmetric_memory as symm_mem

        made: list[Any] = []

        def make() -> None:
            bufs = [symm_mem.empty((ph.tokens, self.d.hidden), dtype=torch.bfloat16, device="cuda") for _ in PROJECTIONS]
            for buf in bufs:
                symm_mem.rendezvous(buf, self.group)
            made.append(SymmStep(self, ph, (bufs[0], bufs[1])))
            made[0]()

        if ranks_per_gpu() > 1:  # its rendezvous refuses ranks on one GPU, and a refused one can leave ranks apart
            self.say("skipped: e2e torch_symm: ranks share a GPU, which PyTorch's symm_mem refuses")
            return []
        if not self.trial("torch_symm", make, False):
            return []
        op = "one_shot_all_reduce" if made[0].one_shot else "two_shot_all_reduce_"
        return [Entry("torch_symm", made[0], made[0], {p: f"torch.mm + symm_mem.{op} + add + F.rms_norm"
                                                       for p in PROJECTIONS})]

    def run(self, ph: Phase) -> None:
        self.enter(ph)
        entries = self.contenders(ph)
        times: dict[str, float] = {}
        if self.args.check:
            eager = dist.get_backend() != "nccl"  # ranks sharing a GPU (--shared-gpu): gloo, not capturable
            for e in entries:
                if e.name == "nccl" and eager:
                    e.fn()  # the reference, eagerly
                else:
                    captured(e.fn, 1)  # warm-up calls, a graph of one step, one replay
        else:
            timer = GraphRound()
            for e in entries:
                timer.add(e.fn, step_bytes(self.d, ph.tokens), tag=e.name)
            timer.add(ComputeOnlyStep(self, ph), step_bytes(self.d, ph.tokens), tag=FLOOR)
            times = {name: us / 1000 for name, us in timer.run_tagged()}
        errors = self.verify(ph, entries)
        for e in entries:
            self.record(ph, e.name, times.get(e.name), times.get("nccl"), e.ops, errors[e.name])
        if FLOOR in times:
            self.record(ph, FLOOR, times[FLOOR], times.get("nccl"), {p: "torch.mm + add + F.rms_norm (no all-reduce)"
                                                                      for p in PROJECTIONS}, 0.0)
        chosen = f"ironlink[{DEFAULT_VARIANT}]"
        if chosen in errors:
            self.record(ph, "ironlink", times.get(chosen), times.get("nccl"),
                        next(e.ops for e in entries if e.name == chosen), errors[chosen])
        del entries
        self.leave()

    def verify(self, ph: Phase, entries: list[Entry]) -> dict[str, float]:
        """Each contender's error against nccl's output (module docs), on every rank; the largest."""
        ref = entries[0].step.final.float()
        scale = ref.abs().max().clamp_min(1e-30)
        mine = torch.stack([(e.step.final.float() - ref).abs().max() / scale for e in entries])
        every = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine)
        errs = torch.stack(every).cpu().tolist()  # [rank][contender]
        worst = {}
        for i, e in enumerate(entries):
            col = [row[i] for row in errs]
            worst[e.name] = math.nan if any(map(math.isnan, col)) else max(col)
            bad = [r for r, err in enumerate(col) if not within(err, self.args.tol)]
            if bad:
                msg = (f"FAILED: e2e {self.d.model} {ph.phase} batch {ph.batch}: {e.name} differs from nccl by "
                       f"{worst[e.name]:.3g} (max |x - nccl| / max |nccl|) > {self.args.tol} on ranks {bad}")
                self.failures.append(msg)
                self.say(msg)
        return worst

    def record(self, ph: Phase, name: str, ms: Optional[float], nccl_ms: Optional[float], ops: dict[str, str],
               err: float) -> None:
        row = {"model": self.d.model, "phase": ph.phase, "batch": ph.batch, "tokens": ph.tokens,
               "context": ph.context, "contender": name, "ms": None if ms is None else round(ms, 4),
               "tokens_per_s": None if not ms else round(ph.tokens / ms * 1000, 1),
               "vs_nccl": None if not ms or not nccl_ms else round(nccl_ms / ms, 3), "ops": ops,
               "rel_err": err, "layers": self.d.layers, "world": self.world}
        self.rows.append(row)
        timing = f"{ms:10.3f} ms {row['tokens_per_s']:>11} tok/s x{row['vs_nccl']}" if ms else "(check only)"
        self.say(f"{ph.phase:>7} batch {ph.batch:>3} tokens {ph.tokens:>5} {name:>16} {timing}  err {err:.2e}  "
                 f"{ops['o_proj'] if name != 'nccl' else ''}")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", default=None, help="JSON file to write (rank 0)")
    ap.add_argument("--config", choices=sorted(PRESETS), default=None,
                    help="the dimensions' defaults (default llama3-70b-dense; small with --check)")
    for name in ("layers", "hidden", "heads", "kv-heads", "head-dim", "ffn", "context", "prefill"):
        ap.add_argument(f"--{name}", type=int, default=None, help="overrides the --config value")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--phases", default="decode,prefill")
    ap.add_argument("--batches", default="1,8,32", help="decode batches (sequences, one new token each)")
    ap.add_argument("--prefill-batch", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=3e-2, help="max |x - nccl| / max |nccl| allowed")
    ap.add_argument("--check", action="store_true", help="the correctness check alone (no timing)")
    ap.add_argument("--contenders", default="", help="a regular expression: run only the contenders it finds")
    ap.add_argument("--compile-options", type=json.loads, default=None,
                    help="Inductor options for ironlink_compile, as JSON (torch.compile's options=)")
    ap.add_argument("--sdpa", default="", help="SDPA backends allowed, of " + ",".join(SDPA_BACKENDS)
                    + " (default: torch's choice among all)")
    ap.add_argument("--any-tensor", action="store_true",
                    help="ironlink's activations are ordinary tensors, which its ops stage through heap workspaces")
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="the heap's wait timeout")
    ap.add_argument("--compile-wait-s", type=float, default=COMPILE_WAIT_S,
                    help="the heap's wait timeout during a contender's first call (a warm Triton cache needs less)")
    return ap.parse_args()


SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


def allow_sdpa(wanted: str) -> None:
    """Leaves torch's SDPA only the backends named in `wanted` (all if empty). The compiled step at
    batch 32, which stalled where four ranks share a GPU, runs cuDNN attention: this lets a run
    try the others (docs/record.md, session 48)."""
    names = [n for n in wanted.split(",") if n]
    unknown = set(names) - set(SDPA_BACKENDS)
    if unknown:
        raise SystemExit(f"e2e: --sdpa takes {', '.join(SDPA_BACKENDS)}; not {', '.join(sorted(unknown))}")
    cuda = torch.backends.cuda
    for name, enable in zip(SDPA_BACKENDS, (cuda.enable_flash_sdp, cuda.enable_mem_efficient_sdp,
                                            cuda.enable_cudnn_sdp, cuda.enable_math_sdp)):
        enable(not names or name in names)


def main() -> int:
    args = parse()
    if torch is None:
        print(f"e2e.py needs torch, a GPU and ironlink's host side: {IMPORT_ERROR}", file=sys.stderr)
        return 2
    config = args.config or ("small" if args.check else "llama3-70b-dense")
    names = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "context", "prefill")
    d = resolve_dims(config, {n: getattr(args, n) for n in names}, args.eps)
    ironlink.init_distributed()
    allow_sdpa(args.sdpa)
    torch.set_grad_enabled(False)  # inference: ironlink's operators have no autograd formula
    problem = dims_problem(d, dist.get_world_size())
    if problem:
        raise SystemExit(f"e2e: {problem} (world {dist.get_world_size()})")
    plan = phases(args.phases.split(","), [int(b) for b in args.batches.split(",") if b], d, args.prefill_batch)
    b = E2E(args, d, plan)
    b.say(f"e2e {d} world {b.world}, heap {b.heap.nbytes >> 20} MiB, sdpa enable_gqa: {b.gqa}, "
          f"backends: {args.sdpa or 'all'}")
    for ph in plan:
        b.run(ph)
    write_results(args.out, b.world, b.rows, dims=d._asdict(), check=args.check, tol=args.tol, sms=b.sms,
                  any_tensor=args.any_tensor, failures=b.failures)
    b.heap.close()
    dist.destroy_process_group()
    return 1 if b.failures else 0


if __name__ == "__main__":
    sys.exit(main())
