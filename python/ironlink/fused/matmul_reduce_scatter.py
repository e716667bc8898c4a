"""Matmul + reduce-scatter in one kernel: the row-parallel linear of sequence parallelism.

    out = ironlink.matmul_reduce_scatter(a, b)   # a [M, K], b [K, N] -> out [M / world, N]

Rank d's `out` gets rows d * M / world .. of sum_over_ranks(a_r @ b_r): PyTorch's
`fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0)`. This module checks, plans and launches;
the kernels are in `matmul_reduce_scatter_kernels`. One persistent launch, matmul_all_reduce's
two-shot by slices (`matmul_all_reduce_two_shot_kernels`) with the destinations' row blocks as the
slices:
- Rank r walks the output tiles block by block from block r + 1 on, its own block last. A tile
  of another block goes, rounded to the output dtype, from registers into its slot at the
  block's rank (a TMA store at world 2), announced to it (`symm_tile_signal`) once the CTA has
  run its next tile's K loop (the push drains behind the GEMM).
- A tile of its own block is summed, in rank order in fp32, with the partials its peers pushed
  (they computed this block first, long before: `symm_tile_wait_others` rarely waits) and
  stored into `out`. A wait never depends on another wait, so no cycle of waits can form.
- The slots alternate between two halves of the workspace by launch parity: a rank ends launch
  n only after every peer pushed into it in launch n, so after every peer ended launch n - 1;
  its launch n + 1 cannot overwrite a slot of launch n - 1 still being read.
No staging copy, no pass after the last GEMM. Every rank signals and waits equally often per
launch: back-to-back launches and CUDA-graph replays need no reset. The launch is persistent (at
most one CTA per SM): its waits need every CTA resident.

Copy engine (one node, from `tuning.MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS` rows a block on:
faster than the CTAs' pushes above there, slower below, measured; why is not probed):
`matmul_reducescatter_copy_engine_kernel` walks the tiles in the same order, but a tile of
another block is stored into a local workspace and counted; a side stream copies each chunk (a
group of GROUP_M tile rows) into its slot at the block's rank once the kernel's count says all
its tiles are there, and sets that rank's flag for it (`copy_engine`: the flag words, the go
after every peer's launch has started, the launch order). No CTA spends time on NVLink stores;
a tile of the own block waits for its chunk's flags, then sums the partials as above.

On a heap of several nodes a destination's workspace may have no address (another node), so the
kernel (`matmul_reducescatter_hierarchical_kernel`) computes every tile of a @ b into a workspace
[M, N], passes a grid barrier, reduce-scatters it in place with
`symm_reduce_scatter_hierarchical` (NVLink in the node, NVSHMEM puts across), passes a second
grid barrier and copies its block to `out`: the reduction no longer overlaps the GEMM. The
default method there is "collective" (one cuBLAS GEMM, then the same hierarchical
reduce-scatter); "overlap" copies between peers' memories with the copy engine and is refused.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from ..language import _abi
from .operators import torch_operators
from ..runtime import eager, streams, tuning
from ..runtime.distributed import sm_share
from ..runtime.launch import launch_with_status
from ..runtime.tensor_spec import TensorSpec
from ..runtime.registry import heap_for
from ..runtime.workspaces import (EPOCH_COUNTER_BYTES, epoch_counters, epochs_name, slot_half, slot_halves,
                                  workspaces_heap_bytes)
from . import copy_engine, cublas_methods
from .gemm_operands import check_operands, check_output, layout_for, operand_descriptors, peer_descriptor
from .diagnostics import NO_DIAGNOSTICS, Diagnostics
from .matmul_reduce_scatter_kernels import (matmul_reducescatter_copy_engine_kernel,
                                            matmul_reducescatter_hierarchical_kernel, matmul_reducescatter_kernel)

COPY_COLS = 1024  # elements of a row of the result copied per piece to `out` (on a heap of several nodes)


class Plan(NamedTuple):
    m: int
    n: int
    k: int
    config: tuning.MatmulConfig
    tiles: int  # per destination rank
    ctas: int
    workspace_bytes: int


def check_shapes(a: TensorSpec, b: TensorSpec, out: TensorSpec, device: str, world: int) -> tuple[int, int, int]:
    """(M, K, N) after checking the operands and `out` (pure: testable without a GPU)."""
    op = "matmul_reduce_scatter"
    m, k, n, code = check_operands(a, b, device, op)
    if m % world:
        raise ValueError(f"{op}: M = {m} rows must split evenly over {world} ranks")
    check_output(out, (m // world, n), code, device, op)
    return m, k, n


def plan(a: TensorSpec, b: TensorSpec, out: TensorSpec, device: str, world: int, sms: int,
         config: Optional[tuning.MatmulConfig] = None) -> Plan:
    """Checks the operands (pure: testable without a GPU) and chooses the launch."""
    op = "matmul_reduce_scatter"
    m, k, n = check_shapes(a, b, out, device, world)
    cfg = config or tuning.matmul_config(m // world, n, k, world)
    tiles = cfg.tiles(m // world, n)
    if tiles > _abi.MAX_TILES:
        raise ValueError(f"{op}: {tiles} tiles of {cfg.block_m}x{cfg.block_n} per rank: at most "
                         f"{_abi.MAX_TILES} (a larger tile shape, or split the matmul)")
    ws = 2 * (world - 1) * (m // world) * n * a.itemsize  # the partials' slots, by launch parity
    return Plan(m, n, k, cfg, tiles, max(1, min(world * tiles, sms)), ws)


@eager.routed(torch_operators)  # the operators of its name run it; a traced call goes to them
def matmul_reduce_scatter(a: Any, b: Any, heap: Any, out: Any = None, config: Optional[tuning.MatmulConfig] = None,
                          check: bool = False, method: Optional[str] = None,
                          exchange: Optional[tuning.ScatterExchange] = None) -> Any:
    """`out` [M / world, N]: this rank's rows of sum over ranks of `a` [M, K] @ `b` [K, N] (bf16 or
    fp16, any strides). `out` may be any CUDA tensor (default: a new one, contiguous). Uses
    workspaces of about M x N elements from `heap`, kept between calls (`heap.workspace`).
    `method`: "kernel" (this module's one-kernel Triton version; `config` its tiles), "collective"
    or "overlap" (cuBLAS GEMMs and ironlink transfers, `fused.cublas_methods`); default
    `tuning.sp_method` ("collective" on a heap of several nodes, where "overlap" is refused).
    `exchange`: how the kernel method moves the partials (`tuning.ScatterExchange`; None: its
    defaults). Collective; CUDA-graph capturable."""
    
    import torch

    if heap is None:
        raise ValueError("matmul_reduce_scatter needs heap= (its workspace lives in the symmetric heap)")
    h = heap_for(a, "a", heap, "matmul_reduce_scatter")
    if check:  # every rank's call the same, or IronlinkError before anything launches
        h.compare_call("matmul_reduce_scatter", a=tuple(a.shape), b=tuple(b.shape), dtype=str(a.dtype), method=method)
    if out is None:
        out = torch.empty((a.shape[0] // h.world_size, b.shape[-1]), device=a.device, dtype=a.dtype)
    specs = TensorSpec.from_tensor(a, "a"), TensorSpec.from_tensor(b, "b"), TensorSpec.from_tensor(out, "out")
    method = cublas_methods.method_for("matmul_reduce_scatter", a.shape[0], method, h.multi_node, h.world_size)
    if method != "kernel":
        m, _, n = check_shapes(*specs, str(h.device), h.world_size)
        if m and n:
            cublas_methods.multiply_then_scatter(a, b, h, out, method, check)
        return out
    sms = sm_share(h.device)  # the grid barrier needs every CTA of every rank resident
    p = plan(*specs, str(h.device), h.world_size, sms, config)
    if p.m == 0 or p.n == 0:
        return out
    c = p.config
    if h.multi_node:
        nbytes = full_bytes(p, a.element_size())
        partials = h.workspace(cublas_methods.PARTIALS, nbytes)[:nbytes].view(a.dtype)
        launch_with_status(
            "matmul_reduce_scatter", h, p.ctas,
            lambda status: matmul_reducescatter_hierarchical_kernel[(p.ctas,)](
                h.ctx, a, b, out, partials, p.m, p.n, p.k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                out.stride(0), out.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                GROUP_M=c.group_m, WORLD=h.world_size, COPY_COLS=COPY_COLS, num_warps=c.warps,
                num_stages=c.stages),
            check, function="symm_grid_barrier/symm_reduce_scatter_hierarchical")
        return out
    dst = out if out.is_contiguous() else torch.empty(out.shape, device=out.device, dtype=out.dtype)
    rows = p.m // h.world_size  # a rank's block
    exchange = scatter_exchange(exchange)
    if exchange.takes_copy_engine(rows):  # 2 words a chunk and rank
        config, flags = copy_engine.prepare(h, "matmul_reduce_scatter", rows, p.config, exchange.min_chunks, 2, check)
        p = p._replace(config=config)
        launch_with_status("matmul_reduce_scatter", h, p.ctas,
                           lambda status: launch_copy_engine(h, p, a, b, dst, flags, status), check,
                           function="symm_signal_wait_at")
    else:
        launch_with_status("matmul_reduce_scatter", h, p.ctas,
                           lambda status: launch(h, p, a, b, dst, status, exchange), check,
                           function="symm_tile_signal/symm_tile_wait_others")
    if dst is not out:
        out.copy_(dst)
    return out


def scatter_exchange(requested: Optional[tuning.ScatterExchange]) -> tuning.ScatterExchange:
    """The exchange a call runs: `requested`, else the defaults (the same where ranks share a GPU:
    with half shares a whole fusion run passed there with the copy engine on, docs/gpu-testing.md)."""
    return tuning.ScatterExchange() if requested is None else requested


# The copy engine's landing slots at each rank: (world - 1) blocks of M / world x N elements.
SLOTS = "matmul_reduce_scatter/slots"


def full_bytes(p: Plan, itemsize: int) -> int:
    """Bytes of an [M, N] workspace of plan `p` (the partials, the sends)."""
    return p.m * p.n * itemsize


def slot_bytes(p: Plan, itemsize: int, world: int) -> int:
    """Bytes of the copy engine's landing slots (`SLOTS`) of plan `p`."""
    return (world - 1) * (p.m // world) * p.n * itemsize


def workspace_requests(p: Plan, itemsize: int, world: int, method: str, exchange: tuning.ScatterExchange,
                       multi_node: bool = False) -> dict[str, int]:
    """The heap workspaces a call of plan `p` (elements of `itemsize` bytes) takes by `method`,
    name -> bytes: what `matmul_reduce_scatter` asks `heap.workspace` for, and what `heap_bytes`
    adds up."""
    full, rows = full_bytes(p, itemsize), p.m // world
    if method == "collective" or (method == "kernel" and multi_node):
        return {cublas_methods.PARTIALS: full}
    if method == "overlap":
        return {cublas_methods.PARTIALS: full, cublas_methods.SENDS: full}
    if exchange.takes_copy_engine(rows):
        _, words = copy_engine.planned(world, rows, p.config, exchange.min_chunks, 2)
        return {cublas_methods.SENDS: full, SLOTS: slot_bytes(p, itemsize, world),
                copy_engine.flags_name("matmul_reduce_scatter"): copy_engine.flags_bytes(world, words)}
    return {"matmul_reduce_scatter": p.workspace_bytes, epochs_name("matmul_reduce_scatter"): EPOCH_COUNTER_BYTES}


def heap_bytes(m: int, n: int, k: int, world: int, dtype: str = "bfloat16", sms: int = 132,
               method: Optional[str] = None, exchange: Optional[tuning.ScatterExchange] = None) -> int:
    """The symmetric-heap bytes matmul_reduce_scatter's workspaces may take for calls of [up to
    m, k] @ [k, n] (M a multiple of `world`) of `dtype` ("bfloat16" or "float16") over `world`
    ranks of one node with `sms` SMs, in any order (`method`, `exchange` as given to the op);
    `out` is any CUDA tensor, outside this count: size the heap with it. Pure: no GPU needed."""
    itemsize = 2
    b = TensorSpec("b", (k, n), dtype, itemsize, True, "cuda:0", 1 << 40)

    runs = scatter_exchange(exchange)  # the exchange the op runs

    def requests(rows: int) -> dict[str, int]:
        p = plan(TensorSpec("a", (rows, k), dtype, itemsize, True, "cuda:0", 1 << 20), b,
                 TensorSpec("out", (rows // world, n), dtype, itemsize, True, "cuda:0", 2 << 40), "cuda:0", world, sms)
        chosen = cublas_methods.method_for("matmul_reduce_scatter", rows, method, False, world)
        return workspace_requests(p, itemsize, world, chosen, runs)

    return workspaces_heap_bytes(requests(rows) for rows in range(world, m + 1, world))


matmul_reduce_scatter.heap_bytes = heap_bytes  # type: ignore[attr-defined]  # the op says what it needs


def launch_copy_engine(heap: Any, p: Plan, a: Any, b: Any, out: Any, flags: Any, status: Any) -> None:
    """Launches plan `p` as `matmul_reducescatter_copy_engine_kernel` into the contiguous `out`
    with the partials' transfers on a side stream (no checks: `matmul_reduce_scatter` made them):
    after the kernel's go (`copy_engine.launch`), for each other block in the kernel's order and
    each chunk of it, the stream waits until the kernel has counted all the chunk's tiles,
    zeroes the count, copies the chunk from `sends` into its slot at the block's rank and sets
    that rank's ready flag of it."""
    c = p.config
    world, r, rows = heap.world_size, heap.rank, p.m // heap.world_size
    layout = layout_for(a, b)
    a_arg, b_arg = operand_descriptors(a, b, layout, c.block_m, c.block_n, c.block_k)
    nbytes = full_bytes(p, out.element_size())
    sends = heap.workspace(cublas_methods.SENDS, nbytes)[:nbytes].view(out.dtype).view(p.m, p.n)
    landing = slot_bytes(p, out.element_size(), world)
    slots = heap.workspace(SLOTS, landing)[:landing].view(out.dtype)
    slots = slots.view(world - 1, rows, p.n)
    chunks = copy_engine.chunks(rows, c)
    tiles_n = -(-p.n // c.block_n)
    counts = copy_engine.flag_data(world)
    ready = counts + world * len(chunks)

    def kernel() -> None:
        matmul_reducescatter_copy_engine_kernel[(p.ctas,)](
            heap.ctx, flags, a_arg, b_arg, out, sends, slots, p.m, p.n, p.k, a.stride(0), a.stride(1), b.stride(0),
            b.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
            WORLD=world, TMA=layout.tma, B_ROW_MAJOR=layout.b_row_major, num_warps=c.warps, num_stages=c.stages)

    def transfers(side: Any) -> None:
        for i in range(1, world):
            d = (r + i) % world  # the kernel's order of blocks
            theirs = heap.peer_tensor(slots, d)[(r - d - 1) % world]  # language.slots.slot_of(r, d)
            their_ready = heap.peer_tensor(flags, d)[ready + r * len(chunks):]
            for j, (lo, hi) in enumerate(chunks):
                count = flags[counts + d * len(chunks) + j]
                streams.wait_flag(side, count, -(-(hi - lo) // c.block_m) * tiles_n)  # the chunk's tiles
                streams.write_flag(side, count, 0)
                theirs[lo:hi].copy_(sends[d * rows + lo:d * rows + hi])
                streams.write_flag(side, their_ready[j], 1)

    copy_engine.launch(heap, flags, kernel, transfers)


def launch(heap: Any, p: Plan, a: Any, b: Any, out: Any, status: Any,
           exchange: tuning.ScatterExchange = tuning.ScatterExchange(),
           diagnostics: Diagnostics = NO_DIAGNOSTICS) -> None:
    """Launches plan `p`'s one-node kernel into the contiguous `out` (no checks:
    `matmul_reduce_scatter` made them), at world 2 a release every `exchange.signal_every` tiles;
    `diagnostics` (the probes): `communicate=False` the GEMM alone (no trace here)."""
    communicate, signal_every = diagnostics.untraced("matmul_reduce_scatter"), exchange.signal_every
    c = p.config
    world, rows = heap.world_size, p.m // heap.world_size
    layout = layout_for(a, b)
    a_arg, b_arg = operand_descriptors(a, b, layout, c.block_m, c.block_n, c.block_k)
    ws = heap.workspace("matmul_reduce_scatter", p.workspace_bytes).view(out.dtype)
    epochs = epoch_counters(heap, "matmul_reduce_scatter")
    # TMA pushes need one peer (a descriptor per destination) and 16-byte aligned rows.
    tma_push = layout.tma and world == 2 and (p.n * out.element_size()) % 16 == 0
    peer_slots = ws
    if tma_push:
        block = [1, c.block_m, c.block_n // 2]
        peer_slots = peer_descriptor(heap, slot_halves(ws, rows, p.n), block)
    matmul_reducescatter_kernel[(p.ctas,)](
        heap.ctx, a_arg, b_arg, out, ws, peer_slots, epochs, slot_half(ws), p.m, p.n, p.k, a.stride(0),
        a.stride(1), b.stride(0), b.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
        GROUP_M=c.group_m, WORLD=world, TMA=layout.tma, B_ROW_MAJOR=layout.b_row_major, TMA_PUSH=tma_push,
        SIGNAL_EVERY=signal_every if world == 2 else 1, COMMUNICATE=communicate, num_warps=c.warps,
        num_stages=c.stages)


__all__ = ["COPY_COLS", "Plan", "SLOTS", "check_shapes", "full_bytes", "heap_bytes", "launch", "launch_copy_engine",
           "matmul_reduce_scatter", "plan", "slot_bytes", "workspace_requests"]
