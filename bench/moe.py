"""MoE dispatch + combine against the torch.distributed path, same process, same GPUs:

    torchrun --nproc_per_node=4 bench/moe.py --out bench/results/moe-4xh200.json   (tests/gpu/run.sh moe-bench)

Rows: op (dispatch, combine, dispatch_combine), contender (ironlink: ironlink.MoeExchange in a
CUDA graph; torch_a2a: sort, count exchange with all_to_all_single, counts read back to the host,
all_to_all_single of the rows and back, timed eagerly since it syncs), tokens (per rank), hidden,
topk, experts, routing (uniform; skewed: expert 0 is every token's first choice), us, GBps
(payload rows x hidden x 2 bytes this rank sends, per second). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

import torch
import torch.distributed as dist

import ironlink
from ironlink.bench import time_eager, time_graph, write_results

TOKENS = [128, 512, 2048, 4096, 8192]


class MoeBench:
    def __init__(self, heap_bytes: int, hidden: int, topk: int, experts: int, profile: bool = False) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.profile = profile
        self.heap = ironlink.SymmetricHeap(heap_bytes)
        self.hidden, self.topk, self.experts = hidden, topk, experts
        self.rows: list[dict[str, Any]] = []

    def record(self, op: str, who: str, shape: dict[str, Any], us: float, payload: int) -> None:
        row = {"op": op, "contender": who, **shape, "us": round(us, 3), "GBps": round(payload / us / 1e3, 2)}
        self.rows.append(row)
        if self.rank == 0:
            print(f"{op:>17} {who:>9} {shape} {us:10.2f} us {row['GBps']:8.1f} GB/s", flush=True)

    def routing(self, tokens: int, skewed: bool) -> tuple[Any, Any, Any]:
        g = torch.Generator(device="cuda").manual_seed(1000 + self.rank)
        x = torch.randn(tokens, self.hidden, device="cuda", generator=g).to(torch.bfloat16)
        scores = torch.rand(tokens, self.experts, device="cuda", generator=g)
        if skewed:
            scores[:, 0] += 10
        idx = scores.topk(self.topk, dim=1).indices
        w = torch.softmax(torch.randn(tokens, self.topk, device="cuda", generator=g), 1)
        return x, idx, w

    def run(self, tokens: int, skewed: bool) -> None:
        shape = {"tokens": tokens, "hidden": self.hidden, "topk": self.topk, "experts": self.experts,
                 "routing": "skewed" if skewed else "uniform"}
        x, idx, w = self.routing(tokens, skewed)
        payload = tokens * self.topk * self.hidden * 2
        moe = ironlink.MoeExchange(self.heap, tokens, self.hidden, self.topk, self.experts)
        try:
            recv_x, _, _, handle = moe.dispatch(x, idx, w)
            self.record("dispatch", "ironlink", shape, time_graph(lambda: moe.dispatch(x, idx, w), payload), payload)
            self.record("combine", "ironlink", shape, time_graph(lambda: moe.combine(recv_x, handle), payload), payload)
            self.record("dispatch_combine", "ironlink", shape,
                        time_graph(lambda: self._ironlink_layer(moe, x, idx, w), payload), 2 * payload)
            if self.profile:
                self._profile(lambda: self._ironlink_layer(moe, x, idx, w), shape)
            moe.check()
        finally:
            moe.close()
        d, c = self._torch_path(x, idx, w)
        self.record("dispatch", "torch_a2a", shape, time_eager(d), payload)
        self.record("dispatch_combine", "torch_a2a", shape, time_eager(c), 2 * payload)

    def _profile(self, fn: Callable[[], None], shape: dict[str, Any]) -> None:
        """Rank 0 prints the GPU time of each kernel of one call (after a warm-up), largest first."""
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        if self.rank == 0:
            print(f"profile {shape}:\n" + prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)

    @staticmethod
    def _ironlink_layer(moe: Any, x: Any, idx: Any, w: Any) -> None:
        recv_x, _, _, handle = moe.dispatch(x, idx, w)
        moe.combine(recv_x, handle)

    def _torch_path(self, x: Any, idx: Any, w: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
        world, le, k = self.world, self.experts // self.world, self.topk

        def dispatch() -> Any:
            experts = idx.reshape(-1)
            order = torch.argsort(experts, stable=True)
            send = x[order // k]
            counts = torch.bincount(experts // le, minlength=world)
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts)
            sc, rc = counts.tolist(), recv_counts.tolist()  # the host sync
            recv = torch.empty(sum(rc), x.shape[1], device="cuda", dtype=x.dtype)
            dist.all_to_all_single(recv, send, rc, sc)
            return recv, order, sc, rc

        def layer() -> Any:
            recv, order, sc, rc = dispatch()
            back = torch.empty(len(order), x.shape[1], device="cuda", dtype=x.dtype)
            dist.all_to_all_single(back, recv, sc, rc)
            rows = torch.empty_like(back)
            rows[order] = back
            return (rows.view(-1, k, x.shape[1]).float() * w.float()[..., None]).sum(1).to(x.dtype)

        return dispatch, layer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="JSON file to write (rank 0)")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--profile", action="store_true",
                    help="also print the GPU time of each kernel of one ironlink layer per token count (torch.profiler)")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    b = MoeBench(24 << 30, args.hidden, args.topk, args.experts, args.profile)
    for t in map(int, args.tokens.split(",")):
        for skewed in (False, True):
            b.run(t, skewed)
    write_results(args.out, b.world, b.rows)
    b.heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
