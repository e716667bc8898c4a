"""Host-level collectives on tensors of an ``ironlink.SymmetricHeap``, for code that writes no Triton.

    heap = ironlink.SymmetricHeap(1 << 30)
    x = heap.empty((4096,), torch.bfloat16)
    ironlink.all_reduce(x, heap=heap)                  # in place; later calls find the heap alone
    ironlink.all_gather(out, inp)                      # out: world x inp.numel() elements
    ironlink.reduce_scatter(out, inp, op="max")        # inp: world x out.numel() elements

Each call is collective (every rank, same sizes, same order) and launches one small kernel on the
current stream, with the grid and num_warps of ``ironlink.tuning`` for its size and world size.
Nothing syncs the host unless ``check=True``, which waits for the kernel and raises IronlinkError
on a non-zero device status; otherwise errors the device records (timeouts) are raised by
``heap.check()``. The calls work inside CUDA graph capture (not with ``check=True``) once each
collective has run outside capture on that device: the first call compiles its kernel and
allocates the per-device status buffer, neither of which may happen while capturing.

The argument checks are pure functions over `TensorSpec`s (`ironlink.runtime.tensor_spec`), so
they are testable without torch or a GPU.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Union

import triton.language as tl

from ..runtime import eager, tuning
from ..language import typed as ilt
from ..runtime.distributed import grid_cap
from ..language.jit import jit
from ..runtime.registry import heap_for, in_heap
from ..runtime.staging import copy_back, needs_staging, on_heap, staging_name
from ..runtime.launch import launch_with_status
from ..runtime.tensor_spec import TensorSpec, check_tensor, overlap, reduce_op_code, reduce_op_name
from .. import language as il
from ..language.pdl import allow_next_kernel, wait_for_previous_kernel
from .operators import torch_operators
from ..language.slots import advance_epochs, lamport_reduce, lamport_send, launch_slots, peer_distances
from ..runtime.pdl import choose_pdl, pdl_launch_options
from ..runtime.workspaces import (EPOCH_COUNTER_BYTES, epoch_counters, epochs_name, lamport_name, lamport_workspace,
                                  lamport_workspace_name, slot_half, workspaces_heap_bytes)

__all__ = ["Plan", "all_reduce", "all_gather", "reduce_scatter"]


class Plan(NamedTuple):
    """What a launch needs: elements per call argument `n`, dtype code, message bytes for tuning."""

    n: int
    dtype: int
    nbytes: int


def plan_all_reduce(t: TensorSpec, device: str) -> Plan:
    return Plan(t.numel, check_tensor(t, device), t.nbytes)


def _plan_blocks(whole: TensorSpec, block: TensorSpec, world: int, rank: int, device: str) -> Plan:
    """Shared by all_gather (whole = out) and reduce_scatter (whole = inp): `whole` is `world`
    blocks of `block`'s size, same dtype, and `block` may overlap `whole` only as its rank-th block."""
    code = check_tensor(whole, device)
    if check_tensor(block, device) != code:
        raise TypeError(f"{whole.name} is {whole.dtype} but {block.name} is {block.dtype}; they must match")
    if whole.numel != world * block.numel:
        raise ValueError(
            f"{whole.name} must have world size x {block.name}'s elements ({world} x {block.numel} = "
            f"{world * block.numel}), got {whole.numel} (shape {whole.shape})"
        )
    if overlap(whole, block) and block.data_ptr != whole.data_ptr + rank * block.nbytes:
        raise ValueError(
            f"{block.name} overlaps {whole.name} but is not its block for rank {rank} "
            f"({whole.name}[{rank * block.numel}:{(rank + 1) * block.numel}]), the only overlap allowed"
        )
    return Plan(block.numel, code, whole.nbytes)


def plan_all_gather(out: TensorSpec, inp: TensorSpec, world: int, rank: int, device: str) -> Plan:
    return _plan_blocks(out, inp, world, rank, device)


def plan_reduce_scatter(out: TensorSpec, inp: TensorSpec, world: int, rank: int, device: str) -> Plan:
    return _plan_blocks(inp, out, world, rank, device)


# --- kernels -------------------------------------------------------------------------------------
# One per collective; each CTA writes its status. ctx, n and op are not specialized: their values
# do not change the code (the device dispatches on op at run time), and every specialization would
# be another multi-second compile (op = 1 and op a multiple of 16 were two more variants). On a
# heap of several nodes `@jit` compiles the same kernel for it: the hierarchical algorithm, with
# NVSHMEM between the nodes (`ironlink.language.topology`).


@jit(do_not_specialize=["ctx", "n", "op"])
def _all_reduce_kernel(ctx, buf, n, op, status, PDL: tl.constexpr = False):
    # With PDL (ironlink.language.pdl): the buffer, the heap's state and the status buffer may be the
    # previous kernel's output, so wait for it first; the next kernel waits for us likewise.
    wait_for_previous_kernel(PDL)
    allow_next_kernel(PDL)
    tl.store(status + tl.program_id(0), ilt.all_reduce(ctx, buf, n, op))


@jit(do_not_specialize=["ctx"])  # n specialized: divisible by 16, its 16-byte units load and store whole
def _all_reduce_lamport_kernel(ctx, buf, n, status, inbox, half, epochs, WORLD: tl.constexpr, OP: tl.constexpr,
                               BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """The small all-reduce through lamport slots (`language.slots`): CTA pid sends elements
    pid * BLOCK.. of `buf` into its slot at every peer, reads the peers' as they land, and stores
    the reduction (rank order, fp32) back into `buf`. No signal, no barrier, no fence: each CTA
    waits only for the same elements of every peer; `half`: the elements of one half of `inbox`
    (`launch_slots`). The rank and the peers' addresses come from
    the context, which no kernel writes: read before the wait for the previous kernel."""
    rank = il.symm_rank(ctx)
    dists = peer_distances(ctx, inbox, rank, WORLD)
    wait_for_previous_kernel(PDL)
    allow_next_kernel(PDL)
    epoch, _, slots = launch_slots(inbox, epochs, half)
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = at < n
    slot = tl.cast(n, tl.int64)
    lamport_send(buf, slots, slot, at, m, rank, dists, WORLD)
    total, s = lamport_reduce(ctx, buf, slots, slot, at, m, rank, WORLD, OP)
    if s == 0:
        tl.store(buf + at, total.to(buf.dtype.element_ty), mask=m)
    advance_epochs(epochs, epoch + 1)
    tl.store(status + tl.program_id(0), s)


@jit(do_not_specialize=["ctx", "n"])
def _all_gather_kernel(ctx, inp, out, n, status):
    tl.store(status + tl.program_id(0), ilt.all_gather(ctx, inp, out, n))


@jit(do_not_specialize=["ctx", "n", "op"])
def _reduce_scatter_kernel(ctx, inp, out, n, op, status):
    tl.store(status + tl.program_id(0), ilt.reduce_scatter(ctx, inp, out, n, op))


# --- host side -----------------------------------------------------------------------------------

def _launch(collective: str, kernel: Any, heap: Any, plan: Plan, args: tuple[Any, ...], check: bool,
            pdl: bool = False) -> None:
    """`pdl`: the kernel takes a PDL constexpr and launches with programmatic dependent launch."""
    ctas, warps = tuning.choose(collective, plan.nbytes, heap.world_size)
    ctas = min(ctas, grid_cap(heap.device))
    options = pdl_launch_options(pdl)
    launch_with_status(collective, heap, ctas,
                       lambda status: kernel[(ctas,)](heap.ctx, *args, status, num_warps=warps, **options), check)


# @eager.routed: the operator of the same name (ops/torch_library.py) runs the function, found by
# name in runtime.eager (the operators cannot import this module: it imports them, to route), and
# a call that Dynamo traces goes to that operator.
@eager.routed(torch_operators)
def all_reduce(t: Any, op: Union[str, int] = "sum", heap: Optional[Any] = None, check: bool = False,
               pdl: Optional[bool] = None, config: Optional[tuning.AllReduceConfig] = None) -> Any:
    """In-place all-reduce of `t` (a contiguous fp32/fp16/bf16 tensor on the heap's GPU) over the
    heap's group; `op` is "sum", "max", "min", "prod" or "avg". `t` may be any CUDA tensor
    (with `heap=`): the lamport path (the decode sizes) reads only this rank's `t` and stores into
    the peers' workspaces, so it takes `t` where it is; the device library's all-reduce reads the
    peers' copies at `t`'s offset, so a `t` outside the heap goes through a heap workspace there
    (`runtime.staging`: two copies). `pdl`: launch with programmatic dependent launch
    (`ironlink.language.pdl`; None: `tuning.DECODE_PDL` where the GPU has it, compute capability
    9.0+; one-node heaps).
    `config`: choices beyond the decode table (`tuning.AllReduceConfig`; None: its defaults).
    Returns `t`."""
    import torch

    code = reduce_op_code(op)
    spec = TensorSpec.from_tensor(t, "t")
    h = heap_for(t, "t", heap, "all_reduce")
    plan = plan_all_reduce(spec, str(h.device))
    if check:  # every rank's call the same, or IronlinkError before anything launches
        h.compare_call("all_reduce", elements=plan.n, dtype=spec.dtype, op=reduce_op_name(code))
    if plan.n:  # nothing to do for empty tensors (same sizes on every rank: every rank skips)
        use_pdl = choose_pdl(pdl, torch.cuda.get_device_capability(h.device)[0], "all_reduce", h.multi_node)
        if _all_reduce_lamport(h, t, plan, code, check, use_pdl, config or tuning.AllReduceConfig()):
            return t
        staged = on_heap(h, "all_reduce", (t,))  # every rank alike: the workspace at one offset everywhere
        _launch("all_reduce", _all_reduce_kernel, h, plan, (staged[0], plan.n, code), check, use_pdl)
        copy_back((t,), staged)
    return t


def _all_reduce_lamport(heap: Any, t: Any, plan: Plan, code: int, check: bool, pdl: bool,
                        config: tuning.AllReduceConfig) -> bool:
    """Runs `all_reduce` through lamport slots where the tuning takes it (one node, up to
    `tuning.all_reduce_takes_lamport` bytes) and its workspace exists or can be made (not during
    a CUDA graph capture: then the device library's all-reduce runs, as before the first eager
    call), on the grid `config` gives; returns whether it ran."""
    import torch

    requests = workspace_requests(plan.nbytes, t.element_size(), heap.world_size, heap.multi_node)
    if not requests:
        return False
    block = config.lamport_cta_bytes // t.element_size()
    ctas = -(-plan.n // block)
    nbytes = requests[lamport_name("all_reduce", t.element_size())]
    if ctas > grid_cap(heap.device):
        return False
    made = heap.has_workspace(lamport_workspace_name("all_reduce", t.dtype), nbytes)
    if torch.cuda.is_current_stream_capturing() and not made:
        return False
    inbox, epochs = lamport_workspace(heap, "all_reduce", nbytes, t.dtype), epoch_counters(heap, "all_reduce")
    options = pdl_launch_options(pdl)
    launch_with_status("all_reduce", heap, ctas, lambda status: _all_reduce_lamport_kernel[(ctas,)](
        heap.ctx, t, plan.n, status, inbox, slot_half(inbox), epochs, WORLD=heap.world_size, OP=code, BLOCK=block,
        num_warps=config.lamport_warps, **options), check,
        function="the wait for the peers' elements (symm_tile_wait)")
    return True


def workspace_requests(nbytes: int, itemsize: int, world: int, multi_node: bool = False) -> dict[str, int]:
    """The heap workspaces an all_reduce of `nbytes` (elements of `itemsize` bytes) over `world`
    ranks takes, name -> bytes: where the tuning sends it through lamport slots, the slots (each
    peer's copy, two calls' worth) and the launch counters; else none (the device library's
    all-reduce uses the heap's scratch region)."""
    if multi_node or not tuning.all_reduce_takes_lamport(nbytes, world):
        return {}
    return {lamport_name("all_reduce", itemsize): 2 * (world - 1) * nbytes,
            epochs_name("all_reduce"): EPOCH_COUNTER_BYTES}


def heap_bytes(nbytes: int, world: int, dtype: str = "bfloat16", outside_heap: bool = False) -> int:
    """The symmetric-heap bytes all_reduce's workspaces may take for calls of up to `nbytes` of
    `dtype` ("float32", "float16" or "bfloat16") over `world` ranks of one node, in any order,
    beside the tensor itself (`outside_heap`: the tensors are not the heap's, and the staging
    workspace counts too): size the heap with it. Pure: no GPU needed."""
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    # The lamport path takes every size up to a limit: its largest call is the largest size up
    # to `nbytes` that the tuning sends there.
    limits = [lim for lim, path in tuning.decode_table.table_for(world).all_reduce if path == "lamport"]
    largest = min(nbytes, max(limits, default=0))
    staged = {staging_name("all_reduce", 0): nbytes} if outside_heap else {}
    return workspaces_heap_bytes([workspace_requests(largest, itemsize, world), staged])


all_reduce.heap_bytes = heap_bytes  # type: ignore[attr-defined]  # the op says what it needs


@eager.routed(torch_operators)
def all_gather(out: Any, inp: Any, heap: Optional[Any] = None, check: bool = False) -> Any:
    """Block p of `out` (world x inp.numel() elements) gets rank p's `inp`, as
    torch.distributed.all_gather_into_tensor. `inp` may be this rank's block of `out`. Tensors
    outside the heap (on its GPU, `heap=` given, every rank alike) go through heap workspaces, as
    under torch.compile (`runtime.staging`). Returns `out`."""
    h = heap_for(out, "out", heap, "all_gather")
    if needs_staging(h, out) or needs_staging(h, inp):
        s_out, s_inp = on_heap(h, "all_gather", (out, inp))
        all_gather(s_out, s_inp, h, check)
        copy_back((out,), (s_out,))
        return out
    specs = TensorSpec.from_tensor(out, "out"), TensorSpec.from_tensor(inp, "inp")
    plan = plan_all_gather(*specs, h.world_size, h.rank, str(h.device))
    if check:
        h.compare_call("all_gather", elements=plan.n, dtype=specs[1].dtype)
    if plan.n:  # nothing to do for empty tensors (same sizes on every rank: every rank skips)
        in_heap(h, "all_gather", (out, "out"), (inp, "inp"))
        _launch("all_gather", _all_gather_kernel, h, plan, (inp, out, plan.n), check)
    return out


@eager.routed(torch_operators)
def reduce_scatter(
    out: Any, inp: Any, op: Union[str, int] = "sum", heap: Optional[Any] = None, check: bool = False
) -> Any:
    """`out` gets the reduction over ranks of block `rank` of `inp` (world x out.numel() elements), as
    torch.distributed.reduce_scatter_tensor. `out` may be this rank's block of `inp`. Tensors
    outside the heap go through heap workspaces, as `all_gather`'s. Returns `out`."""
    code = reduce_op_code(op)
    h = heap_for(inp, "inp", heap, "reduce_scatter")
    if needs_staging(h, out) or needs_staging(h, inp):
        s_out, s_inp = on_heap(h, "reduce_scatter", (out, inp))
        reduce_scatter(s_out, s_inp, op, h, check)
        copy_back((out,), (s_out,))
        return out
    specs = TensorSpec.from_tensor(out, "out"), TensorSpec.from_tensor(inp, "inp")
    plan = plan_reduce_scatter(*specs, h.world_size, h.rank, str(h.device))
    if check:
        h.compare_call("reduce_scatter", elements=plan.n, dtype=specs[1].dtype, op=reduce_op_name(code))
    if plan.n:  # nothing to do for empty tensors (same sizes on every rank: every rank skips)
        in_heap(h, "reduce_scatter", (inp, "inp"), (out, "out"))
        _launch("reduce_scatter", _reduce_scatter_kernel, h, plan, (inp, out, plan.n, code), check)
    return out
