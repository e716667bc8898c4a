"""What the NVSHMEM suite's two parts share (`tests/gpu/workers/nvshmem_worker.py`): the heap size,
random inputs, the context's backend kind, one MoE layer run on a given heap, and a check that a block raises."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.distributed as dist

import ironlink
from ironlink.language import _abi

from _cases import expert_rows, moe_routing, moe_scaled_layer  # tests/gpu/workers/, the script's own directory

HEAP_BYTES = 160 << 20


def data(n: int, dtype: Any) -> Any:
    """`n` random values of `dtype` on this GPU (a case's input)."""
    return (torch.randn(n, device="cuda") * 2).to(dtype)


def backend_kind(heap: Any) -> int:
    """The backend field of the context the heap wrote to the device."""
    off, size = _abi.CONTEXT_FIELDS["backend"]
    return int.from_bytes(bytes(heap._open().read_context())[off:off + size], "little")


def moe_layer(heap: Any, tokens: int, skewed: bool, seed: int, fp8: bool = False) -> list[Any]:
    """One MoeExchange dispatch + combine on `heap` (routing from `seed`, the same on any heap):
    recv_x, expert counts and the combined output, cloned. Expert e of this rank scales its rows
    by (global expert id + 1) between the two. recv_x comes as its experts' rows sorted by their
    bits (`expert_rows`; an fp8 row's bytes followed by its scales' bytes) and without the
    offsets: the low-latency path (the default for few tokens on one node, bf16 or fp8) lays
    recv_x out by expert block, in an order that varies run to run, where the relay path (several
    nodes) packs it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden, k, experts = 256, 4, max(2 * world, 8)
    x, idx, wts = moe_routing(torch.Generator(device="cuda").manual_seed(seed * 100 + rank), tokens, hidden, experts, k,
                              skewed)
    moe = ironlink.MoeExchange(heap, tokens, hidden, k, experts,
                               dispatch_dtype=torch.float8_e4m3fn if fp8 else None)
    try:
        results = moe_scaled_layer(moe, x, idx, wts)
        assert int(results[-3].sum()) <= moe.capacity  # the expert counts
        if fp8:
            rows, scales, counts, offsets, out = results
            recv = torch.cat([rows.view(torch.uint8), scales.contiguous().view(torch.uint8)], 1)
        else:
            recv, counts, offsets, out = results
        return [torch.cat(expert_rows(recv, counts, offsets)), counts, out]
    finally:
        moe.close()


def same_moe_layer(heap: Any, ref: Any, tokens: int, skewed: bool, seed: int, fp8: bool) -> None:
    """`moe_layer` on `heap` equals it on the P2P heap `ref`, every output bit for bit."""
    got, want = (moe_layer(h, tokens, skewed, seed, fp8) for h in (heap, ref))
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"MoE output {i} differs from the P2P heap's"


@contextlib.contextmanager
def raises_ironlink(words: str) -> Iterator[None]:
    """The block must raise IronlinkError with `words` in its message."""
    try:
        yield
    except ironlink.IronlinkError as e:
        assert words in str(e), str(e)
        return
    raise AssertionError(f"no IronlinkError naming {words!r}")
