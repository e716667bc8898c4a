"""An MoE layer on ironlink.MoeExchange, in a CUDA graph whose routing changes at every replay.

    torchrun --standalone --nproc_per_node=N examples/moe_layer.py      (N = 1 to 8 GPUs)

Each rank routes its tokens (a linear router, top-k, softmax over the chosen scores), dispatches
them to the ranks that hold their experts, runs its local experts as one grouped GEMM (a Triton
kernel that reads the per-expert counts and offsets on the GPU: no host sync anywhere), and
combines the outputs back on the tokens' ranks, weighted. The layer is captured once; every
replay gets new tokens, so new routing. Each rank checks its output against the same layer in
torch (every expert's weights come from one seed on every rank); rank 0 prints one line.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import ironlink

TOKENS, HIDDEN, TOPK, EXPERTS_PER_RANK = 512, 1024, 4, 8  # tokens and experts per rank
BM, BN, BK = 64, 64, 64  # the grouped GEMM's tile
REPLAYS, TOLERANCE = 5, 2e-2  # bf16 rows, fp32 accumulation: relative to the largest output


@triton.jit
def grouped_gemm(x, w, counts, offsets, y, K, N, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """y[rows of e] = x[rows of e] @ w[e] for each local expert e, whose rows are offsets[e] ..
    offsets[e] + counts[e] (read here, on the GPU). Grid: (experts, row blocks of the largest
    count possible, column blocks); a block past its expert's count returns at once."""
    e, mb, nb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    count = tl.load(counts + e)
    if mb * BM >= count:
        return
    first = tl.load(offsets + e)
    rows, cols, ks = mb * BM + tl.arange(0, BM), nb * BN + tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(x + (first + rows)[:, None] * K + (k0 + ks)[None, :],
                    mask=(rows < count)[:, None] & (k0 + ks < K)[None, :], other=0.0)
        b = tl.load(w + e * K * N + (k0 + ks)[:, None] * N + cols[None, :],
                    mask=(k0 + ks < K)[:, None] & (cols < N)[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(y + (first + rows)[:, None] * N + cols[None, :], acc.to(y.dtype.element_ty),
             mask=(rows < count)[:, None] & (cols < N)[None, :])


def reference(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, w_all: torch.Tensor) -> torch.Tensor:
    """The layer in torch, fp32: out[t] = sum over j of weights[t, j] * x[t] @ w_all[idx[t, j]]."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w_all.shape[0]):
        t, j = (idx == e).nonzero(as_tuple=True)
        out.index_add_(0, t, weights[t, j][:, None] * (x[t].float() @ w_all[e].float()))
    return out


def main() -> None:
    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    experts = EXPERTS_PER_RANK * world
    g = torch.Generator(device="cuda").manual_seed(0)  # the same router and experts on every rank
    router = torch.randn(HIDDEN, experts, device="cuda", generator=g) / HIDDEN ** 0.5
    w_all = (torch.randn(experts, HIDDEN, HIDDEN, device="cuda", generator=g) / HIDDEN ** 0.5).to(torch.bfloat16)
    w_local = w_all[rank * EXPERTS_PER_RANK:(rank + 1) * EXPERTS_PER_RANK].contiguous()  # rank r's experts
    heap = ironlink.SymmetricHeap(ironlink.MoeExchange.heap_bytes(world, TOKENS, HIDDEN, TOPK))
    moe = ironlink.MoeExchange(heap, TOKENS, HIDDEN, TOPK, experts)
    x = torch.empty(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")
    y = torch.zeros(moe.capacity, HIDDEN, dtype=torch.bfloat16, device="cuda")

    def layer() -> tuple[torch.Tensor, ...]:
        top, idx = (x.float() @ router).topk(TOPK, dim=1)
        weights = torch.softmax(top, dim=1)
        recv_x, counts, offsets, handle = moe.dispatch(x, idx, weights)
        grid = (EXPERTS_PER_RANK, triton.cdiv(world * TOKENS, BM), triton.cdiv(HIDDEN, BN))  # a token picks an expert once
        grouped_gemm[grid](recv_x, w_local, counts, offsets, y, HIDDEN, HIDDEN, BM=BM, BN=BN, BK=BK)
        return moe.combine(y, handle), idx, weights, counts

    def new_tokens(step: int) -> None:
        x.copy_(torch.randn(TOKENS, HIDDEN, device="cuda", generator=torch.Generator("cuda").manual_seed(
            1000 * step + rank)).to(torch.bfloat16))

    new_tokens(0)
    layer()  # compiles the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, idx, weights, counts = layer()
    worst, seen = 0.0, set()
    for step in range(1, REPLAYS + 1):
        new_tokens(step)
        graph.replay()
        torch.cuda.synchronize()
        moe.check()  # raises what a dispatch flagged (capacity, bad ids) or a peer's timeout
        want = reference(x, idx, weights, w_all)
        worst = max(worst, ((out.float() - want).abs().max() / want.abs().max()).item())
        seen.add(tuple(counts.tolist()))
    assert worst <= TOLERANCE, f"rank {rank}: max relative error {worst:.2e} > {TOLERANCE}"
    assert len(seen) == REPLAYS, f"rank {rank}: the routing did not change between replays"
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    stats = torch.tensor([worst, start.elapsed_time(end) / 20 * 1e3], device="cuda")
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"moe layer: {world} GPUs x {TOKENS} tokens, top-{TOPK} of {experts} experts, hidden {HIDDEN}: "
              f"{REPLAYS} CUDA-graph replays with new routing, max relative error {stats[0]:.1e} on every rank "
              f"(tolerance {TOLERANCE:g}); {stats[1]:.0f} us per layer (router, dispatch, grouped GEMM, combine)",
              flush=True)
    moe.close()
    heap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
