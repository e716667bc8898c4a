"""GPU test of ironlink under torch.compile (issue 40 item 3): the registered operators
(`torch.ops.ironlink.*`) let Dynamo capture a tensor-parallel block in one graph.

    torchrun --standalone --nproc_per_node=2 tests/gpu/workers/compile_worker.py    # tests/gpu/run.sh compile --worlds 2

First the TP block (below) eagerly, several steps back to back with no host sync between them,
with and without its MoE layer: no error, replicated results equal on every rank. Then cases,
each compiled with torch.compile(fullgraph=True) and compared bitwise with the same module run
eagerly, on every rank, for several steps of new inputs:
- the TP block: column-parallel linear, ReLU, row-parallel linear into a heap tensor (torch.mm
  out=) + all_reduce_rmsnorm (residual_out=), column-parallel linear, ReLU, matmul_all_reduce,
  then an MoE layer (router, MoeExchange.dispatch, one expert GEMM, combine); default mode and
  mode="reduce-overhead" (CUDA graphs: cudagraph skips must be 0);
- the other ops: all_reduce, all_gather (heap found from the tensor), reduce_scatter,
  all_to_all_v, all_gather_matmul, matmul_reduce_scatter; both modes.
A case also fails on a graph break, on more than one graph, and on results that differ between
ranks where they must agree. Rank 0 prints "== compile world N: P passed, F failed in T s ==" and
one line per case ("compile: <case>: ... graph breaks 0, cudagraph skips 0, staged ..."); without
GPUs, "skipped: no GPU".

Heap tensors and the MoeExchange are attributes of the nn.Module: Dynamo then treats their
tensors as static inputs, which CUDA graphs need (docs/python.md, "Under torch.compile").

Each forward starts with `ranks_meet`, an operator of the test's own: a host barrier among the
ranks once the graph runs. The ranks finish compiling at different times (2-4 s apart with
eight ranks on two GPUs' 32 cores, the verbose line below measured), and a rank whose compile
ends first would otherwise wait for the others inside its first ironlink kernel, up to the
heap's timeout; the test is of ironlink under torch.compile, not of that skew. With
$IRONLINK_GPU_VERBOSE=1 each rank prints how long its first compiled call took to reach the
barrier (its compile) and to run the rest.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Sequence

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the CPU machines have no torch
    torch = None  # type: ignore[assignment]

TOKENS, HIDDEN, FFN, EXPERTS, TOPK = 16, 1024, 2048, 8, 2
COMPILE_WAIT_S = 120.0  # the wait timeout of the first compiled call (see compare)
STEPS = 4  # reduce-overhead: the first call warms up, the second records, the rest replay
BF16 = None if torch is None else torch.bfloat16


MET: dict[str, float] = {}  # when ranks_meet last returned (time.time())


if torch is not None:
    @torch.library.custom_op("ironlink_test::ranks_meet", mutates_args=())
    def ranks_meet(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copies of the forward's inputs, once every rank has got here (module docs): everything
        the graph computes follows from them, so nothing of it runs before. Opaque to Dynamo, so
        the compiled graph calls it where the forward does. No barrier while a CUDA graph is
        captured (mode="reduce-overhead": a replay does not call it)."""
        if not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            dist.barrier()
        MET["at"] = time.time()
        return [t.clone() for t in inputs]

    @ranks_meet.register_fake
    def _(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.empty_like(t) for t in inputs]


def bits_equal(a: Any, b: Any) -> bool:
    """Bitwise equality (torch.equal says -0.0 == 0.0)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


def weight(g: Any, *shape: int, scale: float = 1.0) -> Any:
    return torch.nn.Parameter((torch.randn(*shape, generator=g, device="cuda") * scale).to(BF16), requires_grad=False)


class TPBlock(torch.nn.Module if torch is not None else object):  # type: ignore[misc]
    """The tensor-parallel block (module docs). Weights differ by rank (shards); activations are
    the same on every rank, as in tensor parallelism."""

    def __init__(self, heap: Any) -> None:
        super().__init__()
        import ironlink

        world, rank = heap.world_size, heap.rank
        g = torch.Generator(device="cuda").manual_seed(1000 + rank)
        f = FFN // world
        self.heap = heap
        self.w1, self.w2 = weight(g, HIDDEN, f, scale=HIDDEN ** -0.5), weight(g, f, HIDDEN, scale=f ** -0.5)
        self.w3, self.w4 = weight(g, HIDDEN, f, scale=HIDDEN ** -0.5), weight(g, f, HIDDEN, scale=f ** -0.5)
        # The norm's weight, the router and the expert: the same on every rank (normed is then too).
        g0 = torch.Generator(device="cuda").manual_seed(7)
        self.norm = weight(g0, HIDDEN)
        self.router = torch.nn.Parameter(torch.randn(HIDDEN, EXPERTS, generator=g0, device="cuda"), requires_grad=False)
        self.expert = weight(g0, HIDDEN, HIDDEN, scale=HIDDEN ** -0.5)
        self.partial = heap.empty((TOKENS, HIDDEN), BF16)  # the row-parallel GEMM's output, all-reduced
        self.mar_out = heap.empty((TOKENS, HIDDEN), BF16)
        self.moe = ironlink.MoeExchange(heap, max_tokens=TOKENS, hidden=HIDDEN, topk=TOPK, num_experts=EXPERTS)
        self.with_moe = True  # False: the block ends after matmul_all_reduce (eager_steps)

    def forward(self, x: Any, residual: Any) -> tuple[Any, ...]:
        import ironlink

        x, residual = torch.ops.ironlink_test.ranks_meet([x, residual])
        h = torch.relu(x @ self.w1)  # column-parallel
        torch.mm(h, self.w2, out=self.partial)  # row-parallel: partial sums, into the heap
        normed, res = ironlink.all_reduce_rmsnorm(self.partial, residual, self.norm, heap=self.heap,
                                                  residual_out=torch.empty_like(residual))
        h2 = torch.relu(normed @ self.w3)
        y = ironlink.matmul_all_reduce(h2, self.w4, out=self.mar_out, heap=self.heap)
        if not self.with_moe:
            return normed, res, y
        logits = y.float() @ self.router
        vals, idx = logits.topk(TOPK, dim=-1)
        recv, counts, offsets, handle = self.moe.dispatch(y, idx, vals.abs())
        out = self.moe.combine(recv @ self.expert, handle)
        return normed, res, y, counts, out

    # results ironlink makes bitwise the same on every rank (normed, residual, y); the rest are per rank
    REPLICATED = (0, 1, 2)

    @staticmethod
    def inputs(step: int) -> tuple[Any, ...]:
        g = torch.Generator(device="cuda").manual_seed(step)  # the same on every rank
        return (torch.randn(TOKENS, HIDDEN, generator=g, device="cuda").to(BF16),
                torch.randn(TOKENS, HIDDEN, generator=g, device="cuda").to(BF16))


class OtherOps(torch.nn.Module if torch is not None else object):  # type: ignore[misc]
    """all_reduce, all_gather, reduce_scatter, all_to_all_v, all_gather_matmul, matmul_reduce_scatter."""

    ROWS = 32  # all_to_all_v rows per rank

    def __init__(self, heap: Any) -> None:
        super().__init__()
        world, rank = heap.world_size, heap.rank
        g = torch.Generator(device="cuda").manual_seed(2000 + rank)
        f = FFN // world
        self.heap, self.world = heap, world
        n = TOKENS * HIDDEN
        self.buf, self.big, self.small = heap.empty((n,), BF16), heap.empty((world * n,), BF16), heap.empty((n,), BF16)
        self.rows_in = heap.empty((self.ROWS, HIDDEN), BF16)
        self.rows_out = heap.empty((world * self.ROWS, HIDDEN), BF16)
        self.send_counts = heap.empty((world,), torch.int64)
        self.recv_counts, self.recv_offsets = heap.empty((world,), torch.int64), heap.empty((world,), torch.int64)
        self.a_full = heap.empty((world * TOKENS, HIDDEN), BF16)
        self.w_ag, self.w_rs = weight(g, HIDDEN, f, scale=HIDDEN ** -0.5), weight(g, f, HIDDEN, scale=f ** -0.5)

    def forward(self, v: Any, rows: Any, counts: Any, shard: Any) -> tuple[Any, ...]:
        import ironlink

        v, rows, counts, shard = torch.ops.ironlink_test.ranks_meet([v, rows, counts, shard])
        self.buf.copy_(v)  # written first: the operator gets Inductor's copy and stages it
        ironlink.all_reduce(self.buf, heap=self.heap)
        ironlink.all_gather(self.big, self.buf)  # no heap=: found from the tensor when the graph runs
        ironlink.reduce_scatter(self.small, self.big, op="sum", heap=self.heap)
        self.rows_in.copy_(rows)
        self.send_counts.copy_(counts)
        out, rc, ro = ironlink.all_to_all_v(self.rows_in, self.send_counts, self.rows_out, self.recv_counts,
                                            self.recv_offsets, heap=self.heap)
        a_full, h = ironlink.all_gather_matmul(shard, self.w_ag, self.heap, a_full=self.a_full)
        o = ironlink.matmul_reduce_scatter(torch.relu(h), self.w_rs, self.heap)
        return self.small, out, rc, ro, a_full, h, o

    REPLICATED = (4,)  # a_full

    def inputs(self, step: int) -> tuple[Any, ...]:
        rank = dist.get_rank()
        g = torch.Generator(device="cuda").manual_seed(100 * step + rank)
        v = torch.randn(TOKENS * HIDDEN, generator=g, device="cuda").to(BF16)
        rows = torch.randn(self.ROWS, HIDDEN, generator=g, device="cuda").to(BF16)
        cut = sorted(torch.randint(0, self.ROWS + 1, (self.world - 1,), generator=g, device="cuda").tolist())
        bounds = [0, *cut, self.ROWS]
        counts = torch.tensor([bounds[i + 1] - bounds[i] for i in range(self.world)], dtype=torch.int64, device="cuda")
        shard = torch.randn(TOKENS, HIDDEN, generator=g, device="cuda").to(BF16)
        return v, rows, counts, shard


def eager_steps(module: Any, with_moe: bool) -> None:
    """STEPS eager forwards of the TP block back to back, no host sync between them (as an engine
    runs its layers): no error, and the replicated results equal on every rank. Without the MoE
    exchange too, which tells which part of the block a stall is in."""
    from _cases import same_on_all_ranks  # tests/gpu/workers/, the script's own directory

    module.with_moe = with_moe
    try:
        outs = [[t.clone() for t in module(*TPBlock.inputs(step))] for step in range(STEPS)]
        torch.cuda.synchronize()
        module.heap.check()
    finally:
        module.with_moe = True
    for step, got in enumerate(outs):
        for i in TPBlock.REPLICATED:
            same_on_all_ranks(got[i], f"step {step}: result {i}")


def compare(module: Any, inputs: Callable[[int], Sequence[Any]], replicated: Sequence[int], mode: str,
            name: str, notes: list[str]) -> None:
    """Eager and compiled `module` on STEPS steps of `inputs`: bitwise equal results, one graph, no
    graph break, and under reduce-overhead no cudagraph skip."""
    from torch._dynamo.utils import counters

    from _cases import VERBOSE, heap_timeout_s, same_on_all_ranks  # tests/gpu/workers/, the script's own directory

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(module, fullgraph=True, mode=None if mode == "default" else mode)
    for step in range(STEPS):
        # The first compiled call may JIT kernels the eager one did not (other strides): it waits
        # up to COMPILE_WAIT_S for its peers; the later steps with the suite's wait, so that a
        # stall in them fails in seconds, not minutes.
        module.heap.set_timeout(max(heap_timeout_s(), COMPILE_WAIT_S) if step == 0 else heap_timeout_s())
        args = inputs(step)
        want = [t.clone() for t in module(*[a.clone() for a in args])]
        called = time.time()
        got = [t.clone() for t in compiled(*[a.clone() for a in args])]
        torch.cuda.synchronize()
        if step == 0 and VERBOSE:
            print(f"[rank {dist.get_rank()}] {name}, mode {mode}: the first compiled call met the other ranks "
                  f"{MET['at'] - called:.1f} s after it began (its compile), then ran {time.time() - MET['at']:.1f} s",
                  flush=True)
        module.heap.check()
        for i, (g, w) in enumerate(zip(got, want)):
            assert bits_equal(g, w), (f"step {step}: result {i} differs from eager "
                                      f"(max abs diff {(g.float() - w.float()).abs().max().item()})")
        for i in replicated:
            same_on_all_ranks(got[i], f"step {step}: result {i}")
    breaks = sum(counters["graph_break"].values())
    graphs = counters["stats"]["unique_graphs"]
    skips = counters["inductor"]["cudagraph_skips"]
    staged = sorted(k.removeprefix("torch.ops.ironlink.") for k in module.heap._workspaces
                    if k.startswith("torch.ops.ironlink."))
    notes.append(f"compile: {name}, mode {mode}: {STEPS} steps bitwise equal to eager, graph breaks {breaks}, "
                 f"graphs {graphs}, cudagraph skips {skips}, staged through the heap: {', '.join(staged) or 'none'}")
    assert breaks == 0, f"{breaks} graph breaks: {dict(counters['graph_break'])}"
    assert graphs == 1, f"{graphs} graphs compiled (recompilations?)"
    assert mode == "default" or skips == 0, f"{skips} cudagraph skips (see the 'skipping cudagraphs' warning above)"


def main() -> int:
    if torch is None or not torch.cuda.is_available():
        print("compile: skipped: no GPU", flush=True)
        return 0
    from _cases import Cases, heap_timeout_s  # tests/gpu/workers/, the script's own directory
    import ironlink

    ironlink.init_distributed()
    import torch._inductor.config as inductor_config

    # Inductor rounds fused intermediates as eager does (bf16), so that results can match bitwise.
    inductor_config.emulate_precision_casts = True
    world = dist.get_world_size()
    t0 = time.time()
    notes: list[str] = []
    torch.set_grad_enabled(False)  # inference, as the engines that compile their models run it
    on: dict[str, Any] = {}  # the heap and the modules over it

    def fresh_heap() -> None:
        """A heap and the modules over it: the first, and after a case that failed with an
        IronlinkError (a timeout leaves the old heap's counters disagreeing)."""
        if "heap" in on:
            on["heap"].close()
        heap = ironlink.SymmetricHeap(1 << 30, timeout_s=heap_timeout_s())
        on.update(heap=heap, block=TPBlock(heap), other=OtherOps(heap))

    fresh_heap()
    cases = Cases(renew=fresh_heap)
    for with_moe in (True, False):
        cases.run(f"tp block eager{'' if with_moe else ' without the MoE exchange'}, {STEPS} steps back to back",
                  lambda: eager_steps(on["block"], with_moe))
    for mode in ("default", "reduce-overhead"):
        cases.run(f"tp block under torch.compile, {mode}",
                  lambda: compare(on["block"], TPBlock.inputs, TPBlock.REPLICATED, mode, "tp block", notes))
        cases.run(f"collectives and sequence-parallel ops under torch.compile, {mode}",
                  lambda: compare(on["other"], on["other"].inputs, OtherOps.REPLICATED, mode, "other ops", notes))
    if dist.get_rank() == 0:
        for n in notes:
            print(n, flush=True)
    code = cases.report("compile", world, t0)
    on["heap"].close()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
