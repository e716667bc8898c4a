"""MoE dispatch + combine against the torch.distributed path, same process, same GPUs:

    torchrun --nproc_per_node=4 bench/moe.py --out bench/results/moe-4xh200.json   (tests/gpu/run.sh moe-bench)

Rows: op (dispatch, combine, dispatch_combine); contender: ironlink (ironlink.MoeExchange in a
CUDA graph), ironlink_fp8 (an fp8 dispatch; `--no-fp8` leaves it out), ironlink_relay (`--relay`:
MoeExchange(path="relay"), two all_to_all_v, a same-run baseline), ironlink_ll and ironlink_ll_fp8
(path="low_latency", one kernel each way, up to `--low-latency-max-tokens`), ironlink_ll_hook (its
receive deferred, the hook called at once: the cost of the two launches), and PyTorch's
(bench/moe_torch.py): torch_a2a (all_to_all_single, the counts read on the host: timed eagerly)
and torch_nvshmem (all_to_all_vdev, the counts read on the GPU: eagerly, or in a CUDA graph with
--nvshmem-graph; skipped, saying why, where it cannot run); tokens (per rank), hidden, topk,
experts, routing (uniform; skewed: expert 0 is every token's first choice), us, GBps (payload rows
x hidden x 2 bytes this rank sends, per second), nvlink_GBps (the bytes this rank's rows carry to
other ranks, per second: ironlink moves a row per (token, rank) with its ids and weights, the
torch paths a row per (token, choice)), and for ironlink's rows `sms` (the SMs its exchange
kernels use: `--sms 8 16 24 32 0` sweeps MoeExchange's budget, 0 = all), `sms_budget` (the value
asked for) and `ctas` (its widest exchange kernel's, two per SM on every SM). The contenders in
CUDA graphs of one shape are timed together, their replays in turns (ironlink_bench.GraphRound),
so clock drift falls on each alike; their MoeExchanges stay open until then. Before timing, both
torch contenders are checked against ironlink: the same dispatched rows (as a set), combine within
bf16 tolerance. ironlink's x is a heap tensor, whose rows the direct path pulls in place
(`--x-outside-heap`: a plain tensor, copied into the stage first, as the torch contenders' is);
the JSON's "x" says which. Where the direct path's time goes: bench/probes/moe_phases.py. A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.distributed as dist

import ironlink
import moe_torch  # bench/, beside this file: PyTorch's contenders
from ironlink_bench import GraphRound, time_eager, write_results
from ironlink.moe import MoeConfig, fp8_dequantize
from ironlink.runtime.tuning.moe import DEFAULT_MOE_CONFIG as DEFAULT

TOKENS = [128, 512, 2048, 4096, 8192]
# ironlink_fp8's combine against the bf16 result, relative to its largest value: e4m3 keeps 3
# mantissa bits, so rounding moves each dispatched value by at most 1/16 of itself.
FP8_TOLERANCE = 0.1


def routing(rank: int, tokens: int, hidden: int, topk: int, experts: int, skewed: bool) -> tuple[Any, Any, Any]:
    """The benchmark's inputs on `rank`: (x bf16 [tokens, hidden], top-k of random scores, softmaxed
    weights); skewed: expert 0 is every token's first choice. Also bench/probes/moe_timeline.py's."""
    g = torch.Generator(device="cuda").manual_seed(1000 + rank)
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16)
    scores = torch.rand(tokens, experts, device="cuda", generator=g)
    if skewed:
        scores[:, 0] += 10
    idx = scores.topk(topk, dim=1).indices
    w = torch.softmax(torch.randn(tokens, topk, device="cuda", generator=g), 1)
    return x, idx, w


class Reference(NamedTuple):
    """ironlink's result for one routing, which the torch contenders must reproduce."""

    rows: Any  # sorted fingerprints of the dispatched rows
    out: Any  # combine of the dispatched rows (identity experts)


def row_fingerprints(rows: Any) -> Any:
    """Sorted int64 fingerprint per row [n, H]: equal for the same rows in any order (integer
    sums wrap the same way in any order), different for different rows with near certainty."""
    g = torch.Generator(device=rows.device).manual_seed(7)
    coeff = torch.randint(-(1 << 62), 1 << 62, (rows.shape[1],), device=rows.device, generator=g)
    return (rows.contiguous().view(torch.int16).long() * coeff).sum(1).sort().values


class MoeBench:
    def __init__(self, heap_bytes: int, hidden: int, topk: int, experts: int, fp8: bool = True,
                 sms: tuple[int, ...] = (0,), relay: bool = False, low_latency_max_tokens: int = 0,
                 x_in_heap: bool = True, config: MoeConfig = DEFAULT) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # ironlink's x as a heap tensor (the direct path then pulls its rows in place, as from an
        # all_reduce_rmsnorm out= in the heap), or as the torch contenders' plain tensor (copied
        # into the stage first).
        self.x_in_heap = x_in_heap
        self.fp8, self.sms, self.relay = fp8, sms, relay
        self.low_latency_max_tokens = low_latency_max_tokens
        self.config = config  # every MoeExchange's launch choices (the experiment flags')
        self.heap = ironlink.SymmetricHeap(heap_bytes)
        self.hidden, self.topk, self.experts = hidden, topk, experts
        self.rows: list[dict[str, Any]] = []
        # The current shape's graph contenders (`add`, each tagged with record's arguments but the
        # time) until they are timed together (`flush`), and the MoeExchanges their graphs read,
        # open until then.
        self.round = GraphRound()
        self.exchanges: list[Any] = []
        self.nvshmem: Optional[moe_torch.NvshmemPath] = None
        self.nvshmem_graph = False
        self.nvshmem_note: dict[str, str] = {"skipped": "--no-nvshmem"}  # in the JSON, for the docs table

    def add_nvshmem(self, max_tokens: int, graph: bool) -> None:
        """Sets up the torch_nvshmem contender (after ironlink's heap: its own memory, NVSHMEM's) or
        prints why it is skipped."""

        def gather(reason: Optional[str]) -> list[Optional[str]]:
            out: list[Optional[str]] = [None] * self.world
            dist.all_gather_object(out, reason)
            return out

        self.nvshmem, why = moe_torch.setup(self.world, max_tokens, self.hidden, self.topk, self.experts,
                                              torch.bfloat16, gather)
        self.nvshmem_graph = graph
        self.nvshmem_note = {"skipped": why} if why else {"timed": "in CUDA graphs" if graph else "eagerly"}
        if why and self.rank == 0:
            print(f"torch_nvshmem: skipped ({why})", flush=True)

    def record(self, op: str, who: str, shape: dict[str, Any], us: float, payload: int, nvlink: int = 0) -> None:
        row = {"op": op, "contender": who, **shape, "us": round(us, 3), "GBps": round(payload / us / 1e3, 2),
               "nvlink_GBps": round(nvlink / us / 1e3, 2)}
        self.rows.append(row)
        if self.rank == 0:
            print(f"{op:>17} {who:>14} {shape} {us:10.2f} us {row['GBps']:8.1f} GB/s "
                  f"{row['nvlink_GBps']:8.1f} NVLink GB/s", flush=True)

    def add(self, op: str, who: str, shape: dict[str, Any], fn: Callable[[], Any], nbytes: int, payload: int,
            nvlink: int = 0) -> None:
        """Captures `fn` into the current shape's round (`nbytes`: its graph's size class,
        ironlink_bench.iters_reps); `flush` times it and records its row as `record` would."""
        self.round.add(fn, nbytes, tag=(op, who, shape, payload, nvlink))

    def flush(self) -> None:
        """Times every contender added since the last flush side by side (`GraphRound`: clock drift
        over the run falls on each alike) and records their rows."""
        for (op, who, shape, payload, nvlink), us in self.round.run_tagged():
            self.record(op, who, shape, us, payload, nvlink)

    def exchange(self, max_tokens: int, **kw: Any) -> Any:
        """A MoeExchange for the current shape, open until `run` has timed the shape's round (the
        graphs read its buffers)."""
        moe = ironlink.MoeExchange(self.heap, max_tokens, self.hidden, self.topk, self.experts, config=self.config,
                                   **kw)
        self.exchanges.append(moe)
        return moe

    def remote(self, idx: Any) -> tuple[int, int]:
        """(token-rank pairs, choices) of this rank's routing `idx` that leave this rank."""
        le = self.experts // self.world
        dest = idx // le
        away = dest != self.rank
        pairs = sum(int(((dest == p).any(1)).sum()) for p in range(self.world) if p != self.rank)
        return pairs, int(away.sum())

    def check(self, who: str, rows: Any, out: Any, ref: Reference) -> None:
        """Raises on every rank if `who`'s dispatched rows or combine differ from ironlink's on any
        rank (rows: the same set; combine: within bf16's rounding, ironlink rounds its per-rank
        partial sums)."""
        fp = row_fingerprints(rows)
        err = ((out.double() - ref.out.double()).abs().max() / ref.out.double().abs().max().clamp_min(1e-30)).item()
        bad = ("dispatched rows differ" if not torch.equal(fp, ref.rows) else
               f"combine rel error {err:.2e}" if err > 2e-2 else None)
        problems: list[Optional[str]] = [None] * self.world
        dist.all_gather_object(problems, bad)
        wrong = [f"rank {r}: {p}" for r, p in enumerate(problems) if p]
        if wrong:
            raise RuntimeError(f"{who} does not reproduce ironlink's result: {'; '.join(wrong)}")

    def routing(self, tokens: int, skewed: bool) -> tuple[Any, Any, Any]:
        return routing(self.rank, tokens, self.hidden, self.topk, self.experts, skewed)

    def run(self, tokens: int, skewed: bool, max_tokens: int = 0) -> None:
        """One row set; `max_tokens` (default `tokens`) sizes the MoeExchange, as a server sizes it
        for its largest batch. The contenders in CUDA graphs go into one round (`add`), timed together
        after the eager ones (`flush`); the MoeExchanges they run on stay open until then."""
        shape = {"tokens": tokens, "hidden": self.hidden, "topk": self.topk, "experts": self.experts,
                 "routing": "skewed" if skewed else "uniform"}
        if max_tokens > tokens:
            shape["max_tokens"] = max_tokens
        x_torch, idx, w = self.routing(tokens, skewed)
        x = self.heap.empty(tuple(x_torch.shape), x_torch.dtype).copy_(x_torch) if self.x_in_heap else x_torch
        payload = tokens * self.topk * self.hidden * 2
        pairs, choices = self.remote(idx)
        ref: Optional[Reference] = None
        size = max(tokens, max_tokens)  # the MoeExchange's max_tokens
        low_latency = size <= self.low_latency_max_tokens  # ironlink_ll(_fp8) rows too
        runs = [("ironlink", None, b) for b in self.sms] + ([("ironlink_relay", "relay", 0)] if self.relay else [])
        if low_latency:
            runs.append(("ironlink_ll", "low_latency", 0))
        try:
            for who, path, budget in runs:
                moe = self.exchange(size, sms=budget, path=path)
                at = ironlink_row(shape, moe, budget)
                recv_x, counts, offsets, handle = moe.dispatch(x, idx, w)
                got = self._reproduces(ref, who, moe, recv_x, counts, offsets, moe.combine(recv_x, handle))
                ref = ref or got
                sent, back = pairs * moe.row * 2, pairs * self.hidden * 2  # a stage row: the token, ids, weights

                # Defaults bind this exchange's objects: the round keeps the functions (and so what
                # their graphs read, the handle's tensors too) until `flush`. Defs, not lambdas: mypy
                # cannot type a lambda with defaults (python/mypy#15459).
                def dispatch(moe: Any = moe) -> Any:
                    return moe.dispatch(x, idx, w)

                self.add("dispatch", who, at, dispatch, payload, payload, sent)

                def combine(moe: Any = moe, y: Any = recv_x, h: Any = handle) -> Any:
                    return moe.combine(y, h)

                self.add("combine", who, at, combine, payload, payload, back)

                def layer(moe: Any = moe) -> None:
                    y, _, _, h = moe.dispatch(x, idx, w)
                    moe.combine(y, h)

                self.add("dispatch_combine", who, at, layer, payload, 2 * payload, sent + back)
            assert ref is not None
            if low_latency:
                self._hook(shape, x, idx, w, size, ref, payload, pairs)
            if self.fp8:
                self._fp8(shape, x, idx, w, size, ref, payload, pairs)
                if low_latency:
                    self._fp8(shape, x, idx, w, size, ref, payload, pairs, "low_latency")
            d, c = moe_torch.torch_a2a(x_torch, idx, w, self.world, self.experts, self.topk)
            self.check("torch_a2a", d()[0], c(), ref)
            torch_bytes = choices * self.hidden * 2  # a row per (token, choice)
            self.record("dispatch", "torch_a2a", shape, time_eager(d), payload, torch_bytes)
            self.record("dispatch_combine", "torch_a2a", shape, time_eager(c), 2 * payload, 2 * torch_bytes)
            if self.nvshmem is not None:
                nv = self.nvshmem
                d, c = nv.contender(x_torch, idx, w)
                d()
                self.check("torch_nvshmem", nv.received(), c(), ref)
                if self.nvshmem_graph:
                    self.add("dispatch", "torch_nvshmem", shape, d, payload, payload, torch_bytes)
                    self.add("dispatch_combine", "torch_nvshmem", shape, c, payload, 2 * payload, 2 * torch_bytes)
                else:
                    self.record("dispatch", "torch_nvshmem", shape, time_eager(d), payload, torch_bytes)
                    self.record("dispatch_combine", "torch_nvshmem", shape, time_eager(c), 2 * payload,
                                2 * torch_bytes)
            self.flush()
            for moe in self.exchanges:
                moe.check()
        finally:
            for moe in self.exchanges:
                moe.close()
            self.exchanges.clear()
            if x is not x_torch:
                self.heap.free(x)

    def _reproduces(self, ref: Optional[Reference], who: str, moe: Any, recv_x: Any, counts: Any, offsets: Any,
                    out: Any) -> Reference:
        """This run's dispatched rows (as a set) and combined output, after checking them against
        `ref` (the first ironlink run's; None: this is it) on every rank."""
        rows = torch.cat([recv_x[o:o + c] for o, c in zip(offsets.tolist(), counts.tolist())])
        got = Reference(row_fingerprints(rows), out.clone())
        differs = ref is not None and not (torch.equal(got.rows, ref.rows) and torch.equal(got.out, ref.out))
        flag = torch.tensor([int(differs)], device="cuda")
        dist.all_reduce(flag)  # every rank raises, not only the one that differs
        if flag.item():
            raise RuntimeError(f"{who} on {moe.sms} SMs differs from the first ironlink run on {flag.item()} rank(s)")
        return got

    def _hook(self, shape: dict[str, Any], x: Any, idx: Any, w: Any, max_tokens: int, ref: Reference,
              payload: int, pairs: int) -> None:
        """The ironlink_ll_hook rows: the low-latency path with its receive deferred and the hook
        called at once, checked against ironlink's result first. Added to the shape's round."""
        moe = self.exchange(max_tokens, path="low_latency")

        def dispatch() -> Any:
            recv_x, counts, offsets, handle, hook = moe.dispatch(x, idx, w, return_recv_hook=True)
            hook()
            return recv_x, counts, offsets, handle

        def layer() -> None:
            recv_x, _, _, handle = dispatch()
            moe.combine(recv_x, handle)

        recv_x, counts, offsets, handle = dispatch()
        self._reproduces(ref, "ironlink_ll_hook", moe, recv_x, counts, offsets, moe.combine(recv_x, handle))
        at = ironlink_row(shape, moe, 0)
        sent, back = pairs * moe.row * 2, pairs * self.hidden * 2
        self.add("dispatch", "ironlink_ll_hook", at, dispatch, payload, payload, sent)
        self.add("dispatch_combine", "ironlink_ll_hook", at, layer, payload, 2 * payload, sent + back)

    def _fp8(self, shape: dict[str, Any], x: Any, idx: Any, w: Any, max_tokens: int, ref: Reference,
             payload: int, pairs: int, path: Optional[str] = None) -> None:
        """The ironlink_fp8 rows: dispatch with dispatch_dtype=float8_e4m3fn (half the bytes, plus a
        scale per 128 channels) and dispatch + combine of its dequantized rows (combine moves bf16
        as before). GB/s counts the bf16 payload, the same work as the other rows. Checked first:
        combine within fp8's rounding of ironlink's bf16 result. `path="low_latency"`: the rows
        ironlink_ll_fp8, on that path. Added to the shape's round (`run` times it)."""
        who = "ironlink_ll_fp8" if path == "low_latency" else "ironlink_fp8"
        moe = self.exchange(max_tokens, dispatch_dtype=torch.float8_e4m3fn, path=path)
        (q, scales), _, _, handle = moe.dispatch(x, idx, w)
        y = fp8_dequantize(q, scales, torch.bfloat16)
        out = moe.combine(y, handle)
        err = ((out.double() - ref.out.double()).abs().max() / ref.out.double().abs().max()).item()
        worst = torch.tensor([err], device="cuda")
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        if worst.item() > FP8_TOLERANCE:
            raise RuntimeError(f"{who}: combine rel error {worst.item():.2e} > {FP8_TOLERANCE}")

        def layer() -> None:
            handle = moe.dispatch(x, idx, w)[3]
            moe.combine(y, handle)

        at = ironlink_row(shape, moe, 0)
        sent, back = pairs * moe.row * 2, pairs * self.hidden * 2
        self.add("dispatch", who, at, lambda: moe.dispatch(x, idx, w), payload, payload, sent)
        self.add("dispatch_combine", who, at, layer, payload, 2 * payload, sent + back)


def ironlink_row(shape: dict[str, Any], moe: Any, budget: int) -> dict[str, Any]:
    """An ironlink row's shape fields: the SMs its exchange uses, its widest kernel's CTAs, and
    the SM budget asked for (0: all)."""
    return {**shape, "sms": moe.sms, "ctas": moe.ctas, "sms_budget": budget}


def shape_heap_bytes(world: int, size: int, hidden: int, topk: int, budgets: int, relay: bool, fp8: bool,
                     low_latency: bool, config: MoeConfig = DEFAULT) -> int:
    """The heap bytes of the MoeExchanges `MoeBench.run` opens for a shape (max_tokens `size`), all
    open at once (its graphs are timed in one round): one per SM budget, the relay one, the fp8
    one, and the low-latency ones (bf16, the hook's, fp8); and x."""

    def one(fp8: bool = False, path: Optional[str] = None) -> int:
        return ironlink.MoeExchange.heap_bytes(world, size, hidden, topk, fp8=fp8, path=path, config=config)

    total = budgets * one() + (one(path="relay") if relay else 0) + (one(fp8=True) if fp8 else 0)
    if low_latency:  # ironlink_ll, ironlink_ll_hook, ironlink_ll_fp8
        total += 2 * one(path="low_latency") + (one(fp8=True, path="low_latency") if fp8 else 0)
    return total + size * hidden * 2 + (1 << 20)  # x in the heap (MoeBench.x_in_heap), with slack


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="JSON file to write (rank 0)")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=0,
                    help="size every MoeExchange for this many tokens (default: each row's own count)")
    ap.add_argument("--sort-one-hot", type=int, default=DEFAULT.one_hot,
                    help="experiment: MoeConfig.one_hot (elements of a counting sort's one-hot block)")
    ap.add_argument("--sort-programs", type=int, default=DEFAULT.sort_programs,
                    help="experiment: MoeConfig.sort_programs (programs of the histogram and place kernels)")
    ap.add_argument("--push-block", type=int, default=DEFAULT.push_block,
                    help="experiment: MoeConfig.push_block (elements reduce_push sums per step per SM)")
    ap.add_argument("--push-warps", type=int, default=DEFAULT.push_warps,
                    help="experiment: MoeConfig.push_warps (warps of reduce_push per SM)")
    ap.add_argument("--pull-rows", type=int, default=DEFAULT.pull_rows,
                    help="experiment: MoeConfig.pull_rows (rows pull_rows loads at once per SM: 1, 2, 4)")
    ap.add_argument("--ctas-per-sm", type=int, default=DEFAULT.ctas_per_sm,
                    help="experiment: MoeConfig.ctas_per_sm (CTAs of pull_rows and reduce_push per SM, every SM in "
                         "the budget)")
    ap.add_argument("--no-nvshmem", action="store_true", help="leave out the torch_nvshmem contender")
    ap.add_argument("--x-outside-heap", action="store_true",
                    help="give ironlink x as a plain tensor (its rows copied into the stage) instead of a heap "
                         "tensor (pulled in place)")
    ap.add_argument("--no-fp8", action="store_true", help="leave out the ironlink_fp8 rows (fp8 dispatch)")
    ap.add_argument("--sms", type=int, nargs="+", default=[0],
                    help="MoeExchange SM budgets to time (e.g. 8 16 24 32 0; 0: every SM); the first one's "
                         "result is the reference the others and the contenders must reproduce")
    ap.add_argument("--relay", action="store_true",
                    help="also time MoeExchange(path='relay') (two all_to_all_v) as contender ironlink_relay")
    ap.add_argument("--low-latency-max-tokens", type=int, default=1024,
                    help="time MoeExchange(path='low_latency') as contender ironlink_ll up to this many tokens")
    ap.add_argument("--nvshmem-graph", action="store_true",
                    help="time torch_nvshmem in a CUDA graph (default: eagerly; its capture is untested)")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    # The experiment flags' launch choices, given to every MoeExchange (MoeBench.exchange).
    config = replace(DEFAULT, one_hot=args.sort_one_hot, sort_programs=args.sort_programs, pull_rows=args.pull_rows,
                     push_block=args.push_block, push_warps=args.push_warps, ctas_per_sm=args.ctas_per_sm)
    # The device is pinned before the group starts: PyTorch's NVSHMEM TeamManager (torch_nvshmem)
    # keeps the device it first saw and refuses any other ("TeamManager on multiple devices").
    ironlink.init_distributed()
    world = dist.get_world_size()
    sizes = [max(t, args.max_tokens) for t in tokens]  # each shape's MoeExchanges' max_tokens
    heap_bytes = max(shape_heap_bytes(world, size, args.hidden, args.topk, len(args.sms), args.relay, not args.no_fp8,
                                      size <= args.low_latency_max_tokens, config) for size in sizes)
    b = MoeBench(heap_bytes, args.hidden, args.topk, args.experts, fp8=not args.no_fp8, sms=tuple(args.sms),
                 relay=args.relay, low_latency_max_tokens=args.low_latency_max_tokens,
                 x_in_heap=not args.x_outside_heap, config=config)
    if not args.no_nvshmem:
        b.add_nvshmem(max(tokens), args.nvshmem_graph)
    for t in tokens:
        for skewed in (False, True):
            b.run(t, skewed, args.max_tokens)
    write_results(args.out, b.world, b.rows, torch_nvshmem=b.nvshmem_note, x="torch" if args.x_outside_heap else "heap",
                  sort={"one_hot": config.one_hot, "programs": config.sort_programs},
                  direct={"pull_rows": config.pull_rows, "push_block": config.push_block,
                          "push_warps": config.push_warps, "ctas_per_sm": config.ctas_per_sm})
    b.heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
