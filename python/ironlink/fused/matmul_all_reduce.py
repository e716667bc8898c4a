"""Matmul + all-reduce in one kernel: the row-parallel linear of tensor parallelism.

    out = ironlink.matmul_all_reduce(a, b)      # a [M, K/world], b [K/world, N] -> out [M, N]

`out` (a heap tensor) gets sum_over_ranks(a_r @ b_r). Each rank's product is rounded to the output
dtype tile by tile, and the tiles are summed in fp32 in rank order: results are bitwise identical
on every rank.

Three methods, each one persistent kernel whose CTAs walk the output tiles (grid-stride: CTA c takes
every grid-th tile from c):

- "push" (the default on one node but for world 2's single waves): producer / consumer; no CTA
  waits for another rank before its next GEMM tile. Two kernels, chosen by `tuning.matmul_one_shot`:
  - one-shot (world 2, the tiles in at most `tuning.MATMUL_ONE_SHOT_MAX_WAVES` waves: latency
    rules): after computing tile t a CTA stages its partial in `out` and pushes it into its slot
    at every peer during its next tile's K loop, signals (`symm_tile_signal_others`), and then
    sums the tile of two steps before over the ranks: one NVLink hop, every rank sums every tile.
    After its last tile a CTA pushes that one in chunks with the reduce of the tile before between
    them (`tuning.MATMUL_TAIL_INTERLEAVED`), then signals and reduces it.
  - two-shot by slices (more waves, or more ranks): the ranks own equal slices of the tiles.
    Rank r computes the other slices first, its own last: a tile it does not own goes from
    registers into its slot at the owner (`symm_tile_signal`); a tile it owns is summed with the
    partials the peers pushed long before (`symm_tile_wait_others` rarely waits) and the sum goes
    into every rank's `out`. Per tile, a third of one-shot's extra HBM traffic (no staging, one
    rank reads the partials), and no tail of reduces after the last GEMM.
  Signals come after (part of) the next tile's GEMM, so a TMA push drains behind the GEMM; the
  two-shot tile loop is flattened with its K loop (`tuning.MATMUL_FLAT`). The workspace lives in
  the heap (`heap.workspace`): 2 x (world - 1) slots of [M, N]; alternate
  launches use alternate halves (a per-CTA launch counter), so a fast rank never overwrites
  partials a slow peer has not summed yet. A half is half the workspace whatever M and N
  (`workspaces.slot_half`): placed by the call's shape, a launch of another shape could store
  into the half a slow peer still read.
- "lamport" (small outputs, `tuning.matmul_method`): each tile's partial goes from registers into
  its slot at every peer as data that is its own flag (lamport slots, `ironlink.language.slots`) and the CTA
  polls its own slots for the peers' partials of the tile, sums them in rank order and stores the
  sum: no staging, fence or signal (`matmul_allreduce_lamport_kernel`). With PDL where the GPU has
  it (`ironlink.language.pdl`). Its slots live in the heap too (`lamport_workspace`), the same size as push's.
- "tile": each tile is all-reduced by the CTA that computed it, with `symm_tile_all_reduce`
  (a rendezvous with the peers' CTAs of the same tile, two cross-rank barriers): simple, but
  every CTA stops at its tile's barriers while nothing else runs on its SM.

This module plans and launches every method; its kernels are in `matmul_all_reduce_kernels`
("tile", "lamport", several nodes), `matmul_all_reduce_one_shot_kernels` and
`matmul_all_reduce_two_shot_kernels` ("push"). The operands are read through TMA descriptors
where the GPU and their layout allow (`gemm_operands.operand_layout`), else through pointers with
their strides. Tiles per launch are at most `MAX_TILES`; the tile shape (`tuning.matmul_config`)
grows for larger outputs to stay within it.

On a heap of several nodes the kernel computes every tile, passes a grid barrier and all-reduces
the whole output with `symm_all_reduce_hierarchical` (one launch, linked with the NVSHMEM bitcode;
communication no longer overlaps the GEMM). The tile all-reduce across nodes
(`symm_tile_all_reduce_hierarchical`) would keep the overlap; it has not been measured against
this yet (docs/backends.md).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import triton

from ..language import _abi
from .operators import torch_operators
from ..runtime import eager, tuning
from ..runtime.distributed import sm_share
from ..runtime.launch import launch_with_status
from ..runtime.pdl import choose_pdl, pdl_launch_options
from ..runtime.tensor_spec import TensorSpec
from ..runtime.workspaces import (EPOCH_COUNTER_BYTES, epoch_counters, epochs_name, lamport_name, lamport_workspace,
                                  slot_half, slot_halves, workspaces_heap_bytes)
from ..runtime.registry import heap_for, in_heap
from ..runtime.staging import copy_back, empty_for, needs_staging, on_heap, staging_name
from .gemm_operands import check_operands, check_output, layout_for, operand_descriptors, peer_descriptor
from .matmul_all_reduce_kernels import (matmul_allreduce_hierarchical_kernel, matmul_allreduce_kernel,
                                        matmul_allreduce_lamport_kernel)
from .matmul_all_reduce_one_shot_kernels import matmul_allreduce_push_kernel
from .matmul_all_reduce_two_shot_kernels import matmul_allreduce_owner_kernel
from .diagnostics import NO_DIAGNOSTICS, Diagnostics


METHODS = tuning.decode_table.MATMUL_METHODS  # the names a node's decode table may hold


class Plan(NamedTuple):
    m: int
    n: int
    k: int
    config: tuning.MatmulConfig
    ctas: int
    method: str
    one_shot: bool  # push: every rank sums every tile (else each its slice: two-shot)
    workspace_bytes: int  # push, lamport: the partials' slots, 2 x (world - 1) x [M, N]


def plan(a: TensorSpec, b: TensorSpec, out: TensorSpec, device: str, world: int, sms: int,
         config: Optional[tuning.MatmulConfig] = None, method: Optional[str] = None) -> Plan:
    """Checks the operands (pure: testable without a GPU) and chooses the launch."""
    m, k, n, code = check_operands(a, b, device, "matmul_all_reduce")
    check_output(out, (m, n), code, device, "matmul_all_reduce")
    cfg = config or tuning.matmul_config(m, n, k, world)
    tiles = cfg.tiles(m, n)
    if tiles > _abi.MAX_TILES:
        raise ValueError(f"{tiles} output tiles of {cfg.block_m}x{cfg.block_n}: at most {_abi.MAX_TILES} "
                         "(a larger tile shape, or split the matmul)")
    ctas = max(1, min(tiles, sms))
    method = method or tuning.matmul_method(tiles, ctas, world, m * n * out.itemsize)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    ws = 2 * (world - 1) * m * n * out.itemsize if method in ("push", "lamport") else 0
    return Plan(m, n, k, cfg, ctas, method, tuning.matmul_one_shot(tiles, ctas, world), ws)


@eager.routed(torch_operators)  # the operators of its name run it; a traced call goes to them
def matmul_all_reduce(a: Any, b: Any, out: Any = None, heap: Any = None,
                      config: Optional[tuning.MatmulConfig] = None, method: Optional[str] = None,
                      check: bool = False, exchange: Optional[tuning.PushPacing] = None) -> Any:
    """`out` [M, N] = sum over ranks of `a` [M, K] @ `b` [K, N] (bf16/fp16). `out` a heap tensor
    (when None, one is allocated from `heap`: the caller frees it with heap.free) or any tensor on
    its GPU (pass `heap=`; every rank alike): then the op writes a heap workspace and copies it to
    `out`.
    `method`: "push", "lamport" or "tile" (module docs; default `tuning.matmul_method`), on one
    node. "push" and "lamport" keep a workspace in the heap: 2 x (world - 1) x M x N elements.
    `exchange`: how the push kernels pace their pushes (`tuning.PushPacing`; None: the measured
    `tuning.push_pacing`). Collective; CUDA-graph capturable when `out` is given and the call ran
    once before with these shapes (the push or lamport method's workspace is made then)."""
    if heap is None and out is None:
        raise ValueError("matmul_all_reduce needs heap= (or out=, a tensor of the symmetric heap)")
    h = heap_for(out if out is not None else a, "out", heap, "matmul_all_reduce")
    if needs_staging(h, out):  # the ops read peers' out at its heap offset: a workspace at one offset everywhere
        (dst,) = on_heap(h, "matmul_all_reduce", (out,), read=False)
        matmul_all_reduce(a, b, dst, h, config, method, check, exchange)
        copy_back((out,), (dst,))
        return out
    if check:  # every rank's call the same, or IronlinkError before anything launches
        h.compare_call("matmul_all_reduce", a=tuple(a.shape), b=tuple(b.shape), dtype=str(a.dtype), method=method)
    if out is None:
        out = empty_for(h, "matmul_all_reduce", "out", (a.shape[0], b.shape[-1]), a.dtype)
    if h.multi_node and method is not None:
        raise ValueError("matmul_all_reduce: method= chooses between one-node kernels; this heap spans several "
                         "nodes (one hierarchical kernel)")
    specs = TensorSpec.from_tensor(a, "a"), TensorSpec.from_tensor(b, "b"), TensorSpec.from_tensor(out, "out")
    sms = sm_share(h.device)  # the kernels wait for peers' CTAs: every CTA of every rank resident
    p = plan(*specs, str(h.device), h.world_size, sms, config, method)
    if p.m == 0 or p.n == 0:
        return out
    in_heap(h, "matmul_all_reduce", (out, "out"))
    if h.multi_node:
        kernel, function = matmul_allreduce_hierarchical_kernel, "symm_grid_barrier/symm_all_reduce_hierarchical"
        c = p.config
        launch_with_status(
            "matmul_all_reduce", h, p.ctas,
            lambda status: kernel[(p.ctas,)](h.ctx, a, b, out, p.m, p.n, p.k, a.stride(0), a.stride(1), b.stride(0),
                                             b.stride(1), status, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
                                             BLOCK_K=c.block_k, GROUP_M=c.group_m, num_warps=c.warps,
                                             num_stages=c.stages),
            check, function=function)
        return out
    function = {"push": "symm_tile_wait_others/symm_tile_signal/symm_tile_wait",
                "lamport": "the wait for the peers' partials (symm_tile_wait)"}.get(p.method, "symm_tile_all_reduce")
    launch_with_status("matmul_all_reduce", h, p.ctas, lambda status: launch(h, p, a, b, out, status, exchange),
                       check, function=function)
    return out


def workspace_requests(p: Plan, itemsize: int) -> dict[str, int]:
    """The heap workspaces plan `p` (out of elements of `itemsize` bytes) takes, name -> bytes:
    "push" its slots, "lamport" its lamport slots, both the launch counters; "tile" none."""
    if p.method == "push":
        return {"matmul_all_reduce": p.workspace_bytes, epochs_name("matmul_all_reduce"): EPOCH_COUNTER_BYTES}
    if p.method == "lamport":
        return {lamport_name("matmul_all_reduce", itemsize): p.workspace_bytes,
                epochs_name("matmul_all_reduce"): EPOCH_COUNTER_BYTES}
    return {}


def heap_bytes(m: int, n: int, k: int, world: int, dtype: str = "bfloat16", sms: int = 132,
               method: Optional[str] = None, outside_heap: bool = False) -> int:
    """The symmetric-heap bytes matmul_all_reduce's workspaces may take for calls of [up to m, k] @
    [k, n] of `dtype` ("bfloat16" or "float16") over `world` ranks of one node with `sms` SMs, in
    any order (`method` as given to the op), beside `out` itself (`outside_heap`: out is not the
    heap's, and its staging workspace counts too): size the heap with it. Pure: no GPU needed."""
    b = TensorSpec("b", (k, n), dtype, 2, True, "cuda:0", 1 << 40)

    def plan_of(rows: int) -> Plan:
        return plan(TensorSpec("a", (rows, k), dtype, 2, True, "cuda:0", 1 << 20), b,
                    TensorSpec("out", (rows, n), dtype, 2, True, "cuda:0", 2 << 40), "cuda:0", world, sms, None, method)

    staged = {staging_name("matmul_all_reduce", 0): m * n * 2} if outside_heap and m else {}
    return workspaces_heap_bytes([*(workspace_requests(plan_of(rows), 2) for rows in range(1, m + 1)), staged])


matmul_all_reduce.heap_bytes = heap_bytes  # type: ignore[attr-defined]  # the op says what it needs


def launch(heap: Any, p: Plan, a: Any, b: Any, out: Any, status: Any, exchange: Optional[tuning.PushPacing] = None,
           diagnostics: Diagnostics = NO_DIAGNOSTICS) -> None:
    """Launches plan `p`'s one-node kernel (no checks: `matmul_all_reduce` made them), the push
    kernels paced by `exchange` (the op's `exchange=`; None: `tuning.push_pacing`). The benchmark
    and the probes call it directly: `diagnostics` times the GEMM alone or records where each
    CTA's time goes (language/trace.py). `p.one_shot` may be overridden (`p._replace`): both kernels
    take the same workspace."""
    c = p.config
    communicate, trace = diagnostics
    strides = a.stride(0), a.stride(1), b.stride(0), b.stride(1)
    stamps = trace if trace is not None else status
    meta = dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m, COMMUNICATE=communicate,
                TRACE=trace is not None, num_warps=c.warps, num_stages=c.stages)
    if p.method == "tile":
        matmul_allreduce_kernel[(p.ctas,)](heap.ctx, a, b, out, p.m, p.n, p.k, *strides, status, stamps, **meta)
        return
    import torch  # not at module load: the planning above runs without torch

    layout = layout_for(a, b)
    a_arg, b_arg = operand_descriptors(a, b, layout, c.block_m, c.block_n, c.block_k)
    if p.method == "lamport":
        if trace is not None:
            raise ValueError("method 'lamport' takes no trace (its tiles have no phases to stamp)")
        pdl = choose_pdl(None, torch.cuda.get_device_capability(out.device)[0], "matmul_all_reduce")
        inbox = lamport_workspace(heap, "matmul_all_reduce", p.workspace_bytes, out.dtype)
        matmul_allreduce_lamport_kernel[(p.ctas,)](
            heap.ctx, a_arg, b_arg, out, inbox, epoch_counters(heap, "matmul_all_reduce"), slot_half(inbox), p.m, p.n,
            p.k, *strides, status, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
            TMA=a_arg is not a, B_ROW_MAJOR=layout.b_row_major, WORLD=heap.world_size, COMMUNICATE=communicate,
            num_warps=c.warps, num_stages=c.stages, **pdl_launch_options(pdl))
        return
    pace = exchange or tuning.push_pacing(torch.cuda.get_device_capability(out.device)[0])
    ws = heap.workspace("matmul_all_reduce", p.workspace_bytes).view(out.dtype)
    epochs = epoch_counters(heap, "matmul_all_reduce")
    tma_gemm = a_arg is not a
    # TMA pushes need one peer (a descriptor per destination) and 16-byte aligned rows.
    tma = tma_gemm and heap.world_size == 2 and pace.tma_push and (p.n * out.element_size()) % 16 == 0
    common = dict(TMA=tma_gemm, B_ROW_MAJOR=layout.b_row_major, WORLD=heap.world_size, TMA_PUSH=tma, **meta)
    slots = slot_halves(ws, p.m, p.n) if tma else ws  # [parity, M, N] at world 2
    if p.one_shot:
        push_rows = max(1, min(c.block_m, 8192 // c.block_n))
        peer_slots = peer_descriptor(heap, slots, [1, push_rows, c.block_n]) if tma else ws  # unused unless TMA
        matmul_allreduce_push_kernel[(p.ctas,)](
            heap.ctx, a_arg, b_arg, out, ws, peer_slots, epochs, slot_half(ws), p.m, p.n, p.k, *strides, status, stamps,
            PUSH_ROWS=push_rows, REDUCE_ROWS=max(1, min(c.block_m, 16384 // c.block_n)),
            STAGGER=pace.stagger, TAIL_INTERLEAVED=pace.tail_interleaved, **common)
        return
    flat = pace.flat
    block = [1, c.block_m, c.block_n // 2 if flat else c.block_n]
    peer_slots = peer_descriptor(heap, slots, block) if tma else ws
    peer_out = peer_descriptor(heap, out.view(1, p.m, p.n), block) if tma else out
    k_tiles = triton.cdiv(p.k, c.block_k)
    signal_k = min(k_tiles, round(pace.signal_at * k_tiles)) * c.block_k
    every = pace.signal_every
    matmul_allreduce_owner_kernel[(p.ctas,)](
        heap.ctx, a_arg, b_arg, out, ws, peer_slots, peer_out, epochs, slot_half(ws), p.m, p.n, p.k, *strides, signal_k,
        status, stamps, FLAT=flat, SIGNAL_EVERY=every if flat and heap.world_size == 2 else 1, **common)


__all__ = ["METHODS", "Plan", "heap_bytes", "launch", "matmul_all_reduce", "plan", "workspace_requests"]
