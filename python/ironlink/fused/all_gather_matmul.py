"""All-gather + matmul in one kernel: the column-parallel linear of sequence parallelism.

    a_full, out = ironlink.all_gather_matmul(a_shard, b)   # a_shard [M / world, K], b [K, N]
                                                           # -> a_full [M, K], out [M, N]

a_full is every rank's shard stacked in rank order, out = a_full @ b: PyTorch's
`fused_all_gather_matmul(a_shard, [b], gather_dim=0)`. This module checks, plans and launches;
the kernels are in `all_gather_matmul_kernels`.

Copy engine (one node, a contiguous shard: `uses_copy_engine`, the default). The shard travels
by the copy engine, so no CTA spends time on it: `allgather_matmul_copy_engine_kernel` computes
the own rows' tiles from a_shard, then each other rank's tiles chunk by chunk (a chunk is a group
of GROUP_M tile rows, the order the tile walk takes them) as each chunk's flag says it has
arrived. A side stream does the transfer (`launch_copy_engine`): it waits for the kernel's "go"
(`streams.wait_flag`), copies the shard into every peer's a_full chunk by chunk, and after
each chunk sets the peer's flag for it (`streams.write_flag`: written after the copy, with
a fence). The kernel's CTA 0 gives the go once every peer's launch has started (each tells the
others with `symm_signal_at`): until its launch starts a rank may use its a_full. The kernel's
waits time out (recorded, raised by the host); the stream waits only for its own kernel, which
gives the go after a timeout too. The last CTA to finish zeroes the ready flags.

SM push (a strided shard, or `tuning.ALL_GATHER_MATMUL_COPY_ENGINE` off): one persistent
launch; each CTA:
1. meets the same CTA of every other rank (a signal and a wait each way: a rank may use its
   a_full until its launch starts);
2. computes its output tiles of this rank's own rows, reading `a_shard` (nothing to wait for),
   and before each pushes a piece of its share of this rank's shard (units of COPY_ROWS x
   COPY_COLS, spread over all CTAs) into every rank's `a_full`: stores to a peer are posted, so
   they drain behind the tile's GEMM instead of delaying the GEMM's start;
3. tells the same CTA of every other rank that its copies are done and waits for theirs, then
   passes a grid barrier: after it, every rank's rows are in this rank's a_full;
4. computes its output tiles of the other ranks' rows (on Hopper in a tile loop flattened with
   the K loop, `tuning.matmul_flat`).
The copies overlap the GEMM of the own rows (1 / world of the work). Every rank signals and waits
equally often per launch: back-to-back launches and CUDA-graph replays need no reset. The launch
is persistent (at most one CTA per SM), as the grid barrier needs.

On a heap of several nodes a peer's a_full may have no address (another node), so the kernel
(`allgather_matmul_hierarchical_kernel`) copies the shard into its own block of a_full, computes
the own rows' tiles, passes a grid barrier, gathers a_full with `symm_all_gather_hierarchical`
(NVLink in the node, NVSHMEM puts across), passes a second grid barrier and computes the rest:
the gather no longer overlaps the GEMM. The default method there is "collective" (the same
hierarchical all-gather, then one cuBLAS GEMM); "overlap" copies between peers' memories with the
copy engine and is refused.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from .operators import torch_operators
from ..runtime import eager, streams, tuning
from ..runtime.distributed import sm_share
from ..runtime.launch import launch_with_status
from ..runtime.tensor_spec import TensorSpec
from ..runtime.registry import heap_for, in_heap
from ..runtime.staging import copy_back, empty_for, needs_staging, on_heap, staging_name
from ..runtime.workspaces import workspaces_heap_bytes
from . import copy_engine, cublas_methods
from .all_gather_matmul_kernels import (allgather_matmul_copy_engine_kernel, allgather_matmul_hierarchical_kernel,
                                        allgather_matmul_kernel)
from .diagnostics import NO_DIAGNOSTICS, Diagnostics
from .gemm_operands import check_operands, check_output, layout_for, operand_descriptors, peer_descriptor

COPY_ROWS, COPY_COLS = 8, 1024  # a unit of the push of the shard: 16 KiB of bf16 (units spread over all CTAs)
TMA_COPY_ROWS, TMA_COPY_COLS = 32, 256  # the same through TMA (a box is at most 256 elements wide)


class Plan(NamedTuple):
    rows: int  # per rank
    n: int
    k: int
    config: tuning.MatmulConfig
    ctas: int


def check_shapes(a_shard: TensorSpec, b: TensorSpec, a_full: TensorSpec, out: TensorSpec, device: str,
          world: int) -> tuple[int, int, int]:
    """(rows per rank, K, N) after checking the operands and outputs (pure: testable without a GPU)."""
    op = "all_gather_matmul"
    rows, k, n, code = check_operands(a_shard, b, device, op)
    check_output(a_full, (world * rows, k), code, device, op)
    check_output(out, (world * rows, n), code, device, op)
    return rows, k, n


def plan(a_shard: TensorSpec, b: TensorSpec, a_full: TensorSpec, out: TensorSpec, device: str, world: int,
         sms: int, config: Optional[tuning.MatmulConfig] = None) -> Plan:
    """Checks the operands (pure: testable without a GPU) and chooses the launch."""
    rows, k, n = check_shapes(a_shard, b, a_full, out, device, world)
    cfg = config or tuning.matmul_config(world * rows, n, k, world)
    tiles = world * cfg.tiles(rows, n)
    return Plan(rows, n, k, cfg, max(1, min(tiles, sms)))


@eager.routed(torch_operators)  # the operators of its name run it; a traced call goes to them
def all_gather_matmul(a_shard: Any, b: Any, heap: Any, a_full: Any = None, out: Any = None,
                      config: Optional[tuning.MatmulConfig] = None, check: bool = False,
                      method: Optional[str] = None, exchange: Optional[tuning.GatherExchange] = None) -> tuple[Any, Any]:
    """(a_full, out): `a_full` [M, K] = every rank's `a_shard` [M / world, K] in rank order, `out`
    [M, N] = a_full @ `b` [K, N] (bf16 or fp16; a_shard and b with any strides). `a_full` a heap
    tensor (default: allocated from `heap`, the caller frees it with heap.free) or any tensor on
    its GPU (every rank alike): then the op gathers into a heap workspace and copies it to
    `a_full`; `out` any contiguous CUDA tensor (default: a new one). `method`: "kernel" (this module's one-kernel
    Triton version; `config` its tiles), "collective" or "overlap" (cuBLAS GEMMs and ironlink
    transfers, `fused.cublas_methods`); default `tuning.sp_method` ("collective" on a heap of several
    nodes, where "overlap" is refused). `exchange`: how the kernel method moves the shard
    (`tuning.GatherExchange`; None: its defaults). Collective; CUDA-graph capturable when a_full
    is given."""
    
    import torch

    if heap is None and a_full is None:
        raise ValueError("all_gather_matmul needs heap= (or a_full=, a tensor of the symmetric heap)")
    h = heap_for(a_full if a_full is not None else a_shard, "a_full", heap, "all_gather_matmul")
    if needs_staging(h, a_full):  # peers write a_full at its heap offset: a workspace at one offset everywhere
        (gathered,) = on_heap(h, "all_gather_matmul", (a_full,), read=False)
        _, out = all_gather_matmul(a_shard, b, h, gathered, out, config, check, method, exchange)
        copy_back((a_full,), (gathered,))
        return a_full, out
    if check:  # every rank's call the same, or IronlinkError before anything launches
        h.compare_call("all_gather_matmul", a_shard=tuple(a_shard.shape), b=tuple(b.shape), dtype=str(a_shard.dtype),
                       method=method)
    rows, n = a_shard.shape[0], b.shape[-1]
    if a_full is None:
        a_full = empty_for(h, "all_gather_matmul", "a_full", (h.world_size * rows, a_shard.shape[-1]), a_shard.dtype)
    if out is None:
        out = torch.empty((h.world_size * rows, n), device=a_shard.device, dtype=a_shard.dtype)
    spec = TensorSpec.from_tensor
    method = cublas_methods.method_for("all_gather_matmul", a_full.shape[0], method, h.multi_node, h.world_size)
    if method != "kernel":
        rows, _, n = check_shapes(spec(a_shard, "a_shard"), spec(b, "b"), spec(a_full, "a_full"), spec(out, "out"),
                           str(h.device), h.world_size)
        if rows and n:
            in_heap(h, "all_gather_matmul", (a_full, "a_full"))
            cublas_methods.gather_then_multiply(a_shard, b, h, a_full, out, method, check)
        return a_full, out
    sms = sm_share(h.device)  # the grid barrier needs every CTA of every rank resident
    p = plan(spec(a_shard, "a_shard"), spec(b, "b"), spec(a_full, "a_full"), spec(out, "out"), str(h.device),
             h.world_size, sms, config)
    if p.rows == 0 or p.n == 0:
        return a_full, out
    in_heap(h, "all_gather_matmul", (a_full, "a_full"))
    if h.multi_node:
        c = p.config
        strides = a_shard.stride(0), a_shard.stride(1), b.stride(0), b.stride(1)
        meta = dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m, COPY_COLS=COPY_COLS,
                    WORLD=h.world_size, num_warps=c.warps, num_stages=c.stages)
        launch_with_status(
            "all_gather_matmul", h, p.ctas,
            lambda status: allgather_matmul_hierarchical_kernel[(p.ctas,)](
                h.ctx, a_shard, a_full, b, out, p.rows, p.n, p.k, *strides, status, **meta),
            check, function="symm_grid_barrier/symm_all_gather_hierarchical")
        return a_full, out
    exchange = gather_exchange(exchange)
    if uses_copy_engine(a_shard, exchange):  # a flag a chunk
        config, flags = copy_engine.prepare(h, "all_gather_matmul", p.rows, p.config, exchange.min_chunks, 1, check)
        p = p._replace(config=config)
        launch_with_status("all_gather_matmul", h, p.ctas,
                           lambda status: launch_copy_engine(h, p, a_shard, b, a_full, out, flags, status), check,
                           function="symm_signal_wait_at")
        return a_full, out
    launch_with_status("all_gather_matmul", h, p.ctas, lambda status: launch(h, p, a_shard, b, a_full, out, status),
                       check, function="symm_tile_wait")
    return a_full, out


def workspace_requests(p: Plan, world: int, method: str, exchange: tuning.GatherExchange,
                       multi_node: bool = False) -> dict[str, int]:
    """The heap workspaces a call of plan `p` takes by `method` with a contiguous shard, name ->
    bytes: the copy engine's flag words where `exchange` takes it (`copy_engine.prepare`), else
    none. `heap_bytes` adds them up."""
    if method != "kernel" or multi_node or not exchange.copy_engine:
        return {}
    _, words = copy_engine.planned(world, p.rows, p.config, exchange.min_chunks, 1)
    return {copy_engine.flags_name("all_gather_matmul"): copy_engine.flags_bytes(world, words)}


def heap_bytes(m: int, n: int, k: int, world: int, dtype: str = "bfloat16", sms: int = 132,
               method: Optional[str] = None, exchange: Optional[tuning.GatherExchange] = None,
               a_full: bool = False, outside_heap: bool = False) -> int:
    """The symmetric-heap bytes all_gather_matmul may take for calls of an M x K a_full (up to `m`
    rows, a multiple of `world`) @ [k, n] of `dtype` ("bfloat16" or "float16") over `world` ranks
    of one node with `sms` SMs, in any order (`method`, `exchange` as given to the op): its
    workspaces and, unless the caller passes its own `a_full` (a heap tensor; `outside_heap`: any
    other, and then its staging workspace), the a_full it allocates, rounded up to 4 KiB (the
    caller frees it). `out` is any CUDA tensor, outside this count. Size the heap with it. Pure:
    no GPU needed."""
    itemsize = 2
    b = TensorSpec("b", (k, n), dtype, itemsize, True, "cuda:0", 1 << 40)

    runs = gather_exchange(exchange)  # the exchange the op runs

    def requests(rows: int) -> dict[str, int]:
        p = plan(TensorSpec("a_shard", (rows, k), dtype, itemsize, True, "cuda:0", 1 << 20), b,
                 TensorSpec("a_full", (world * rows, k), dtype, itemsize, True, "cuda:0", 2 << 40),
                 TensorSpec("out", (world * rows, n), dtype, itemsize, True, "cuda:0", 3 << 40), "cuda:0", world, sms)
        chosen = cublas_methods.method_for("all_gather_matmul", world * rows, method, False, world)
        return workspace_requests(p, world, chosen, runs)

    made = 0 if a_full or outside_heap or m == 0 else -(-m * k * itemsize // 4096) * 4096
    staged = {staging_name("all_gather_matmul", 0): m * k * itemsize} if outside_heap and m else {}
    return made + workspaces_heap_bytes([*(requests(rows) for rows in range(1, m // world + 1)), staged])


all_gather_matmul.heap_bytes = heap_bytes  # type: ignore[attr-defined]  # the op says what it needs


def gather_exchange(requested: Optional[tuning.GatherExchange]) -> tuning.GatherExchange:
    """The exchange a call runs: `requested`, else the defaults (the same where ranks share a GPU:
    with half shares a whole fusion run passed there with the copy engine on, docs/gpu-testing.md)."""
    return tuning.GatherExchange() if requested is None else requested


def uses_copy_engine(a_shard: Any, exchange: tuning.GatherExchange) -> bool:
    """Whether the one-node kernel method runs with the copy engine (`launch_copy_engine`): as
    `exchange` says, unless the shard is not contiguous (a strided copy would run as a kernel,
    which could not start while this launch holds every SM)."""
    return exchange.copy_engine and a_shard.is_contiguous()


def _gemm_operands(p: Plan, a_shard: Any, b: Any, a_full: Any) -> tuple[Any, ...]:
    """What both one-node kernels read: (layout, a_own, b, a_all): TMA descriptors where the layout
    allows (`gemm_operands.layout_for`; a_full's rows aligned too), else the tensors."""
    c = p.config
    layout = layout_for(a_shard, b)
    if (p.k * a_full.element_size()) % 16:  # a_full's rows, read by TMA too
        layout = layout._replace(tma=False)
    a_own, b_arg = operand_descriptors(a_shard, b, layout, c.block_m, c.block_n, c.block_k)
    a_all = a_full_descriptor(a_full, c.block_m, c.block_k) if layout.tma else a_full
    return layout, a_own, b_arg, a_all


def _measured_push(push: Optional[tuning.GatherPush], a_shard: Any) -> tuning.GatherPush:
    """`push`, or the measured choices on a_shard's GPU (`tuning.gather_push`)."""
    import torch

    return push or tuning.gather_push(torch.cuda.get_device_capability(a_shard.device)[0])


def launch_copy_engine(heap: Any, p: Plan, a_shard: Any, b: Any, a_full: Any, out: Any, flags: Any,
                       status: Any, push: Optional[tuning.GatherPush] = None) -> None:
    """Launches plan `p` as `allgather_matmul_copy_engine_kernel` with the shard's transfers on a
    side stream (no checks: `all_gather_matmul` made them; a_shard contiguous): the stream waits
    for the kernel's go (`copy_engine.launch`), copies the shard into every peer's
    a_full by the copy engine chunk by chunk (`copy_engine.chunks`), setting the peer's ready flag of
    each, and copies it into this a_full; the current stream joins it. `push`: its `flat` only
    (the copy engine pushes)."""
    c = p.config
    layout, a_own, b_arg, a_all = _gemm_operands(p, a_shard, b, a_full)
    flat = _measured_push(push, a_shard).flat
    w, r, rows = heap.world_size, heap.rank, p.rows
    chunks = copy_engine.chunks(rows, c)

    def kernel() -> None:
        allgather_matmul_copy_engine_kernel[(p.ctas,)](
            heap.ctx, flags, a_own, a_all, b_arg, out, p.rows, p.n, p.k, a_shard.stride(0), a_shard.stride(1),
            b.stride(0), b.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
            GROUP_M=c.group_m, WORLD=w, TMA=layout.tma, B_ROW_MAJOR=layout.b_row_major, FLAT=flat and layout.tma,
            num_warps=c.warps, num_stages=c.stages)

    def transfers(side: Any) -> None:
        for i in range(1, w):
            q = (r + i) % w
            theirs = heap.peer_tensor(a_full, q)[r * rows:(r + 1) * rows]
            ready = heap.peer_tensor(flags, q)[copy_engine.flag_data(w) + r * len(chunks):]
            for j, (lo, hi) in enumerate(chunks):  # chunk by chunk: the peer's GEMM starts on the first
                theirs[lo:hi].copy_(a_shard[lo:hi])
                streams.write_flag(side, ready[j], 1)
        a_full[r * rows:(r + 1) * rows].copy_(a_shard)

    copy_engine.launch(heap, flags, kernel, transfers)


def launch(heap: Any, p: Plan, a_shard: Any, b: Any, a_full: Any, out: Any, status: Any,
           push: Optional[tuning.GatherPush] = None, diagnostics: Diagnostics = NO_DIAGNOSTICS) -> None:
    """Launches plan `p`'s one-node kernel (no checks: `all_gather_matmul` made them). The probes
    call it directly: `push` replaces the measured choices (`tuning.gather_push`),
    `diagnostics.communicate=False` leaves out the push and the waits on peers (the GEMM and the
    grid barrier alone; no trace here)."""
    communicate = diagnostics.untraced("all_gather_matmul")
    c = p.config
    layout, a_own, b_arg, a_all = _gemm_operands(p, a_shard, b, a_full)
    how = _measured_push(push, a_shard)
    flat = how.flat
    world = heap.world_size
    # TMA pushes need one peer (one descriptor) and the GEMM's TMA (Hopper, aligned rows).
    tma = layout.tma and world == 2 and how.tma_push
    copy_rows, copy_cols = (TMA_COPY_ROWS, TMA_COPY_COLS) if tma else (COPY_ROWS, COPY_COLS)
    peer_full = a_full
    if tma:
        peer_full = peer_descriptor(heap, a_full.view(world, p.rows, p.k), [1, copy_rows, copy_cols])
    allgather_matmul_kernel[(p.ctas,)](
        heap.ctx, a_shard, a_full, a_own, a_all, peer_full, b_arg, out, p.rows, p.n, p.k, a_shard.stride(0),
        a_shard.stride(1), b.stride(0), b.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
        GROUP_M=c.group_m, COPY_ROWS=copy_rows, COPY_COLS=copy_cols, WORLD=world, TMA=layout.tma,
        B_ROW_MAJOR=layout.b_row_major, FLAT=flat and layout.tma, TMA_PUSH=tma,
        SEGMENTS=how.segments if layout.tma else 1, COMMUNICATE=communicate,
        num_warps=c.warps, num_stages=c.stages)


def a_full_descriptor(a_full: Any, block_m: int, block_k: int) -> Any:
    """A TMA descriptor of a_full (a contiguous heap tensor: 16-byte aligned; rows of K elements,
    aligned when a_shard's are) in [block_m, block_k] blocks."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(a_full, list(a_full.shape), list(a_full.stride()), [block_m, block_k])


__all__ = ["COPY_COLS", "COPY_ROWS", "Plan", "TMA_COPY_COLS", "TMA_COPY_ROWS", "a_full_descriptor", "heap_bytes",
           "workspace_requests",
           "all_gather_matmul", "check_shapes", "launch", "launch_copy_engine", "plan", "uses_copy_engine"]
