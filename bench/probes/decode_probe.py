"""What a decode call costs in steady state, and what a graph replay adds once: a probe, not a
benchmark.

    torchrun --nproc_per_node=4 bench/probes/decode_probe.py --out decode-probe.json
    CUDA_VISIBLE_DEVICES=0,2 torchrun --nproc_per_node=2 bench/probes/decode_probe.py   (one pair of GPUs)

bench/fused.py and bench/allreduce.py time a CUDA graph of 20 back-to-back calls after a barrier
and report its time / 20, max over ranks. The ranks leave the barrier and launch their graph at
different times; the first rank's first call waits for the last rank's, so its time holds that
skew once, spread over the 20 calls, and more ranks mean a larger skew. Since 2026-11-28 their
timer (ironlink.tune.timing.replay_us) starts every rank's replay together on the device; here
each contender is captured twice, --short and --long calls, replayed in turns, and per rank:
- `graph_us`: the short graph's time / its calls, started together (what those benchmarks
  report at 20 calls);
- `graph_host_us`: the same, timed from the host barrier (what they reported before);
- `steady_us`: (long - short) / (long calls - short calls): the period of calls in step, what a
  model's graph of many layers pays per call;
- `once_us`: short - short calls x steady: what a replay adds once (the launch, what skew is
  left);
each the median over --reps replays, max over ranks; `rank_spread_us`: the short graph's
slowest rank's time / calls minus the fastest's.

`fanout[k]` isolates what the number of peers costs: the lamport all-reduce's exchange of 1 KiB
(one CTA, language/slots.py's slots and waits) where each rank sends to its k next ranks and waits for
its k previous ones, k = 1 .. world - 1, PDL as the op. k = 1 at world 4 against world 2's: what
four GPUs cost at one peer; k = 3 against k = 1: what each peer more costs. `copies[k]` sends k
copies to the next rank alone and polls k slots: the stores and polls of k peers without k peers
(world 2 runs it), so fanout[k] - copies[k] is what the peers themselves cost. `[k,together]`:
the k slots polled in one loop, as the ops poll at worlds 4 and 8, against one after another.
`--exchange-bytes` sizes a copy: how a CTA's time grows with the bytes it stores (split's CTA
stores 2 KiB to each of three peers at world 4, 1 token of hidden 8192; to one at world 2).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import ironlink
from ironlink import language as il
from ironlink.language import typed as ilt
from ironlink.language._flags import unempty
from ironlink.language.jit import jit
from ironlink.language.pdl import allow_next_kernel, wait_for_previous_kernel
from ironlink.language.slots import advance_epochs, at_peer, lamport_receive, peer_distances, slot_of
from ironlink.runtime.pdl import pdl_launch_options
from ironlink.runtime.workspaces import epoch_counters, lamport_workspace
from ironlink.tune.timing import captured, replay_us

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness ironlink_bench, run from anywhere
from ironlink_bench import record_row, write_results  # noqa: E402


MAX_COPIES = 3  # copies[k] at every world: k = 1 .. 3, world 4's fan-out


@triton.jit
def _empty(status):
    tl.store(status + tl.program_id(0), 0)


@jit(do_not_specialize=["ctx"])
def _exchange(ctx, buf, n, status, inbox, epochs, WORLD: tl.constexpr, K: tl.constexpr, TO_NEXT: tl.constexpr,
              SLOTS: tl.constexpr, TOGETHER: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
              PDL: tl.constexpr = False):
    """The lamport exchange alone (one CTA, no sum): rank r stores buf K times and polls K slots
    until written, emptying them.
    - fan-out (TO_NEXT false): one copy into its slot at each of ranks r + 1 .. r + K, polling its
      slots of ranks r - 1 .. r - K;
    - copies (TO_NEXT true): K copies into K slots at rank r + 1, polling the K slots that rank
      r - 1 fills here: K peers' stores and polls without K peers (world 2 can run it).
    TOGETHER: the K slots polled in one loop ([KP, BLOCK], KP a power of two >= K), as the ops'
    lamport reduce polls every peer at worlds 4 and 8 (`slots._reduce_in_groups`); else one slot
    after another. Each epoch's SLOTS slots rotate over WORLD copies, not the ops' two: with K <
    world - 1 (and for copies) the waits form a chain, not a clique, and a rank may run up to
    world - 2 calls ahead of the rank after it (at world 4, K = 1 overwrote slots not yet read
    with two copies: every call timed out)."""
    rank = il.symm_rank(ctx)
    dists = peer_distances(ctx, inbox, rank, WORLD)
    wait_for_previous_kernel(PDL)
    allow_next_kernel(PDL)
    epoch = tl.load(epochs + tl.program_id(0))
    slots = inbox + (epoch % WORLD).to(tl.int64) * SLOTS * n
    at = tl.arange(0, BLOCK)
    m = at < n
    v = unempty(tl.load(buf + at, mask=m))
    for k in tl.static_range(1, K + 1):
        if TO_NEXT:
            tl.store(at_peer(slots, dists, 1) + (k - 1) * n + at, v, mask=m)
        else:
            dest = (rank + k) % WORLD
            tl.store(at_peer(slots, dists, k) + slot_of(rank, dest, WORLD).to(tl.int64) * n + at, v, mask=m)
    s = tl.zeros((), dtype=tl.int32)
    if TOGETHER:
        q = tl.arange(0, KP)[:, None]
        if TO_NEXT:
            index = q
        else:
            index = slot_of((rank - (q + 1) + WORLD) % WORLD, rank, WORLD)
        _, s = lamport_receive(ctx, slots + index.to(tl.int64) * n + at[None, :], (q < K) & m[None, :])
    else:
        for k in tl.static_range(1, K + 1):
            if TO_NEXT:
                index = k - 1
            else:
                index = slot_of((rank - k + WORLD) % WORLD, rank, WORLD)
            _, w = lamport_receive(ctx, slots + tl.cast(index, tl.int64) * n + at, m)
            s = ilt.failure_or(s, w)
    advance_epochs(epochs, epoch + 1)
    tl.store(status + tl.program_id(0), s)


def exchange(heap: Any, buf: torch.Tensor, status: torch.Tensor, k: int, to_next: bool,
             together: bool) -> Callable[[], Any]:
    """`_exchange` of `buf` (k copies to the next rank where `to_next`, else to k peers), its
    slots polled together or one after another; a workspace per kind (the calls empty their slots)."""
    world = heap.world_size
    kind = "copies" if to_next else "fanout"
    slots = max(k, MAX_COPIES) if to_next else world - 1
    name = f"decode_probe/{kind}/{buf.nbytes}"
    inbox = lamport_workspace(heap, name, world * slots * buf.nbytes, buf.dtype)
    epochs = epoch_counters(heap, name)
    return partial(_exchange[(1,)], heap.ctx, buf, buf.numel(), status, inbox, epochs, WORLD=world, K=k,
                   TO_NEXT=to_next, SLOTS=slots, TOGETHER=together, KP=triton.next_power_of_2(k),
                   BLOCK=triton.next_power_of_2(buf.numel()), num_warps=4, **pdl_launch_options(True))


def measure(contenders: list[tuple[str, dict[str, Any], Callable[[], Any]]], short: int, long: int,
            reps: int) -> list[dict[str, Any]]:
    """Every contender's short and long graph, replayed in turns (rotated each round). Rank 0
    says on stderr which contender it captures and which round it replays, so a run that stops
    names where (its two runs of 2026-11-28 on 4 H200s printed nothing in 150 and 280 s)."""
    def say(what: str) -> None:
        if dist.get_rank() == 0:
            print(f"decode_probe: {what}", file=sys.stderr, flush=True)

    graphs = []
    for name, shape, fn in contenders:
        say(f"capturing {name} {shape}")
        graphs.append((captured(fn, short), captured(fn, long)))
    times: list[tuple[list[float], list[float], list[float]]] = [([], [], []) for _ in contenders]
    n = len(graphs)
    for r in range(reps):
        say(f"round {r + 1} of {reps}")
        for i in [(r + j) % n for j in range(n)]:
            for which in (0, 1):
                times[i][which].append(replay_us(graphs[i][which]))
            times[i][2].append(replay_us(graphs[i][0], aligned=False))
    mine = torch.tensor([[statistics.median(t) for t in ts] for ts in times], device="cuda")
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    per_rank = torch.stack(every).double()  # [ranks, contenders, 3]
    rows = []
    for i, (name, shape, _) in enumerate(contenders):
        t_short, t_long, t_host = per_rank[:, i, 0], per_rank[:, i, 1], per_rank[:, i, 2]
        steady = (t_long - t_short) / (long - short)
        rows.append({"contender": name, **shape, "graph_us": round(float((t_short / short).max()), 2),
                     "graph_host_us": round(float((t_host / short).max()), 2),
                     "steady_us": round(float(steady.max()), 2),
                     "once_us": round(float((t_short - short * steady).max()), 2),
                     "rank_spread_us": round(float((t_short / short).max() - (t_short / short).min()), 2),
                     "calls": [short, long]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--short", type=int, default=20)
    ap.add_argument("--long", type=int, default=100)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--tokens", default="1,8,32,128")
    ap.add_argument("--exchange-bytes", default="1024",
                    help="bytes a copy of the exchange probes, comma-separated (one CTA sends k copies: "
                         "2048 at k = 3 is what a split CTA stores at world 4, 1 token of hidden 8192)")
    ap.add_argument("--exchange-only", action="store_true",
                    help="the empty kernel and the exchange probes (fanout, copies) only")
    ap.add_argument("--modes", default="split,lamport,two_shot",
                    help="all_reduce_rmsnorm modes timed beside the default where they can run")
    args = ap.parse_args()
    ironlink.init_distributed()
    world = dist.get_world_size()
    heap = ironlink.SymmetricHeap(1 << 30)
    status = torch.zeros(256, dtype=torch.int32, device="cuda")
    contenders: list[tuple[str, dict[str, Any], Callable[[], Any]]] = [
        ("empty_kernel", {}, lambda: _empty[(1,)](status))]
    for nbytes in map(int, args.exchange_bytes.split(",")):
        buf = heap.zeros((nbytes // 2,), torch.bfloat16)
        for together in (False, True):
            how = ",together" if together else ""
            for k in range(1, world):
                contenders.append((f"fanout[{k}{how}]", {"bytes": nbytes},
                                   exchange(heap, buf, status, k, False, together)))
            for k in range(1, MAX_COPIES + 1):
                contenders.append((f"copies[{k}{how}]", {"bytes": nbytes}, exchange(heap, buf, status, k, True, together)))
    if args.exchange_only:
        args.tokens = ""
    else:
        for nbytes in (1024, 16384):
            buf = heap.zeros((nbytes // 2,), torch.bfloat16)
            nccl = torch.zeros(nbytes // 2, dtype=torch.bfloat16, device="cuda")
            contenders.append(("nccl_all_reduce", {"bytes": nbytes}, partial(dist.all_reduce, nccl)))
            contenders.append(("ironlink_op", {"bytes": nbytes}, partial(ironlink.all_reduce, buf, heap=heap)))
    for tokens in [int(t) for t in args.tokens.split(",") if t]:
        x = heap.zeros((tokens, args.hidden), torch.bfloat16)
        residual = torch.randn(tokens, args.hidden, device="cuda").to(torch.bfloat16)
        weight = torch.ones(args.hidden, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(residual)
        for mode in [None, *args.modes.split(",")]:
            def fused(x: torch.Tensor = x, residual: torch.Tensor = residual, weight: torch.Tensor = weight,
                      out: torch.Tensor = out, mode: Any = mode) -> Any:
                return ironlink.all_reduce_rmsnorm(x, residual, weight, 1e-6, out=out, heap=heap, mode=mode)
            try:
                fused()
            except ValueError:  # a mode that cannot run this shape (split's grid)
                continue
            contenders.append((f"ironlink_fused[{mode or 'default'}]", {"tokens": tokens}, fused))
    rows: list[dict[str, Any]] = []
    for row in measure(contenders, args.short, args.long, args.reps):
        record_row(rows, row)
    heap.check()
    write_results(args.out, world, rows, probe="decode_probe",
                  devices=torch.cuda.get_device_name(), visible=str(torch.cuda.device_count()))
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
