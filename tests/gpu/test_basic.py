"""Single-GPU proof: Triton kernels call ironlink's device functions and get the right values.

Every kernel runs with num_warps 4 and 8 on a grid of several CTAs. Each thread stores its own
result next to its `%tid.x`, so the checks cover every thread's call, not one thread's store.
Contexts are built by hand from `_abi.CONTEXT_FIELDS` (no host library needed): a fake one with
a wrong magic word, and a valid P2P one (rank 3 of 4) whose peer heaps lie in one real device
buffer.

Needs torch and a CUDA GPU (skips otherwise); runs under pytest or, where pytest is missing, as
`python3 tests/gpu/test_basic.py`. `tests/gpu/run.sh` is the entry point on the GPU machine.
"""

from __future__ import annotations

import struct
import sys
from typing import Any, Callable, Sequence

import triton
import triton.language as tl

import ironlink
import ironlink.language as il
from ironlink.language import _abi
from ironlink.constants import FENCE_SCOPE_CTA, FENCE_SCOPE_GPU, FENCE_SCOPE_SYSTEM

try:
    import pytest
except ImportError:  # the GPU machine may lack pytest: see the __main__ runner below
    pytest = None  # type: ignore[assignment]

NUM_WARPS = (4, 8)
GRID = 5  # several CTAs
RANK, WORLD = 3, 4
HEAP_SIZE = 1 << 20
STATUS = _abi.STATUS


class Skipped(Exception):
    pass


def skip(reason: str) -> None:
    if pytest is not None:
        pytest.skip(reason)
    raise Skipped(reason)


def require_gpu() -> Any:
    """torch, if it is installed and sees a CUDA GPU; otherwise the test is skipped."""
    try:
        import torch  # lazily: the CPU test environment has no torch
    except ImportError:
        skip("torch is not installed")
    if not torch.cuda.is_available():
        skip("no CUDA GPU")
    return torch


# --- contexts ----------------------------------------------------------------------------------------


def pack_context(**fields: int | Sequence[int]) -> bytes:
    """A SymmContext image: every field named in `fields` at its `_abi.CONTEXT_FIELDS` offset."""
    buf = bytearray(_abi.CONTEXT_SIZE)
    for name, value in fields.items():
        offset, size = _abi.CONTEXT_FIELDS[name]
        if isinstance(value, int):
            fmt = {4: "<i" if value < 0 else "<I", 8: "<Q"}[size]
            struct.pack_into(fmt, buf, offset, value)
        else:
            assert len(value) * 8 <= size, name
            struct.pack_into(f"<{len(value)}Q", buf, offset, *value)
    return bytes(buf)


def device_bytes(torch: Any, data: bytes) -> Any:
    return torch.tensor(list(data), dtype=torch.uint8, device="cuda")


def valid_context(torch: Any, heap: Any, **overrides: int | Sequence[int]) -> Any:
    """Rank RANK of WORLD on the P2P backend; peer p's heap is `heap[p * HEAP_SIZE:]`."""
    fields: dict[str, int | Sequence[int]] = dict(
        magic=_abi.CTX_MAGIC,
        version=_abi.ABI_VERSION,
        backend=_abi.BACKEND["P2P"],
        rank=RANK,
        world_size=WORLD,
        heap_size=HEAP_SIZE,
        timeout_ns=_abi.DEFAULT_TIMEOUT_NS,
        peer_heap=[heap.data_ptr() + p * HEAP_SIZE for p in range(WORLD)],
    )
    fields.update(overrides)
    return device_bytes(torch, pack_context(**fields))


# --- kernels -------------------------------------------------------------------------------------------


@triton.jit
def _tid(lane):
    # %tid.x of the thread that holds each element: proves which threads stored which results.
    return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r,r", [lane], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _slots(BLOCK: tl.constexpr, NRES: tl.constexpr):
    # One element per thread (BLOCK == threads per CTA); the stride NRES keeps stores unvectorized.
    lane = tl.arange(0, BLOCK)
    return lane, (tl.program_id(0) * BLOCK + lane) * NRES


@ironlink.jit
def _context_free_kernel(out_ptr, unused, BLOCK: tl.constexpr):
    lane, base = _slots(BLOCK, 5)
    zero = tl.zeros([BLOCK], dtype=tl.int64)
    tl.store(out_ptr + base, _tid(lane))
    tl.store(out_ptr + base + 1, il.ironlink_abi_version(unused) + zero)
    tl.store(out_ptr + base + 2, il.symm_fence(FENCE_SCOPE_CTA) + zero)
    tl.store(out_ptr + base + 3, il.symm_fence(FENCE_SCOPE_GPU) + zero)
    tl.store(out_ptr + base + 4, il.symm_fence(FENCE_SCOPE_SYSTEM) + zero)


@ironlink.jit
def _context_kernel(out_ptr, ctx, BLOCK: tl.constexpr):
    lane, base = _slots(BLOCK, 4)
    zero = tl.zeros([BLOCK], dtype=tl.int64)
    tl.store(out_ptr + base, _tid(lane))
    tl.store(out_ptr + base + 1, il.symm_rank(ctx) + zero)
    tl.store(out_ptr + base + 2, il.symm_world_size(ctx) + zero)
    tl.store(out_ptr + base + 3, il.symm_last_error(ctx) + zero)


@ironlink.jit
def _peer_kernel(out_ptr, ctx, x_ptr, outside_ptr, nbytes, WORLD_: tl.constexpr, BLOCK: tl.constexpr):
    NRES: tl.constexpr = 1 + 2 * WORLD_ + 5
    lane, base = _slots(BLOCK, NRES)
    zero = tl.zeros([BLOCK], dtype=tl.int64)
    tl.store(out_ptr + base, _tid(lane))
    for p in tl.static_range(WORLD_):
        tl.store(out_ptr + base + 1 + p, il.symm_peer_ptr(ctx, x_ptr, p) + zero)
        tl.store(out_ptr + base + 1 + WORLD_ + p, il.symm_peer_ptr_checked(ctx, x_ptr, nbytes, p) + zero)
    k = 1 + 2 * WORLD_
    tl.store(out_ptr + base + k, il.symm_peer_ptr(ctx, outside_ptr, 0) + zero)  # not in the heap
    tl.store(out_ptr + base + k + 1, il.symm_peer_ptr(ctx, x_ptr, WORLD_) + zero)  # no such peer
    tl.store(out_ptr + base + k + 2, il.symm_peer_ptr_checked(ctx, outside_ptr, nbytes, 0) + zero)
    tl.store(out_ptr + base + k + 3, il.symm_peer_ptr_checked(ctx, x_ptr, nbytes, -1) + zero)
    tl.store(out_ptr + base + k + 4, il.symm_peer_ptr_checked(ctx, x_ptr, 1 << 40, 0) + zero)  # runs past


@ironlink.jit
def _null_context_kernel(out_ptr, args, FN: tl.constexpr, BLOCK: tl.constexpr):
    lane, base = _slots(BLOCK, 2)
    tl.store(out_ptr + base, _tid(lane))
    tl.store(out_ptr + base + 1, FN(*args) + tl.zeros([BLOCK], dtype=tl.int64))


def run(torch: Any, kernel: Any, nres: int, num_warps: int, *args: Any, **kwargs: Any) -> list[list[list[int]]]:
    """Launches `kernel` on GRID CTAs; returns out[cta][thread][result], with column 0 the thread's tid."""
    block = 32 * num_warps
    out = torch.full((GRID, block, nres), -12345, dtype=torch.int64, device="cuda")
    kernel[(GRID,)](out, *args, BLOCK=block, num_warps=num_warps, **kwargs)
    torch.cuda.synchronize()
    rows = out.cpu().tolist()
    for cta in rows:  # every thread of every CTA stored exactly one row
        assert sorted(r[0] for r in cta) == list(range(block)), "not one row per thread"
    return rows


def columns(rows: list[list[list[int]]]) -> list[set[int]]:
    """For each result column (after the tid), the set of values all threads stored."""
    return [{r[i] for cta in rows for r in cta} for i in range(1, len(rows[0][0]))]


# --- tests ---------------------------------------------------------------------------------------------


def test_bitcode_for_this_gpu_is_found() -> None:
    torch = require_gpu()
    path = ironlink.bitcode_path()
    cc = torch.cuda.get_device_capability()
    assert path.endswith(".bc"), path
    print(f"GPU {torch.cuda.get_device_name()} (cc {cc}) links {path}")


def test_context_free_functions() -> None:
    torch = require_gpu()
    for nw in NUM_WARPS:
        got = columns(run(torch, _context_free_kernel, 5, nw, 0))
        assert got == [{_abi.ABI_VERSION}, {STATUS["OK"]}, {STATUS["OK"]}, {STATUS["OK"]}], (nw, got)


def test_null_context() -> None:
    torch = require_gpu()
    for nw in NUM_WARPS:
        got = columns(run(torch, _context_kernel, 4, nw, 0))
        assert got == [{STATUS["NULL_CONTEXT"]}] * 3, (nw, got)


def test_context_with_wrong_magic() -> None:
    torch = require_gpu()
    fake = device_bytes(torch, pack_context(magic=0x12345678, version=_abi.ABI_VERSION, rank=RANK, world_size=WORLD))
    for nw in NUM_WARPS:
        got = columns(run(torch, _context_kernel, 4, nw, fake))
        assert got == [{STATUS["UNKNOWN_CONTEXT"]}] * 3, (nw, got)


def test_context_checks_version_and_world_size() -> None:
    torch = require_gpu()
    heap = torch.zeros(WORLD * HEAP_SIZE, dtype=torch.uint8, device="cuda")
    old = valid_context(torch, heap, version=_abi.ABI_VERSION + 1)
    too_big = valid_context(torch, heap, world_size=_abi.MAX_RANKS + 1)
    got_old = columns(run(torch, _context_kernel, 4, 4, old))
    got_big = columns(run(torch, _context_kernel, 4, 4, too_big))
    assert got_old == [{STATUS["ABI_MISMATCH"]}] * 3, got_old
    assert got_big == [{STATUS["UNKNOWN_CONTEXT"]}] * 3, got_big


def test_valid_context() -> None:
    torch = require_gpu()
    heap = torch.zeros(WORLD * HEAP_SIZE, dtype=torch.uint8, device="cuda")
    ctx = valid_context(torch, heap)
    with_error = valid_context(torch, heap, error=STATUS["TIMEOUT"])
    for nw in NUM_WARPS:
        assert columns(run(torch, _context_kernel, 4, nw, ctx)) == [{RANK}, {WORLD}, {0}], nw
        assert columns(run(torch, _context_kernel, 4, nw, with_error)) == [{RANK}, {WORLD}, {STATUS["TIMEOUT"]}]


def test_peer_ptr_translates_heap_addresses() -> None:
    torch = require_gpu()
    heap = torch.zeros(WORLD * HEAP_SIZE, dtype=torch.uint8, device="cuda")
    outside = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    ctx = valid_context(torch, heap)
    offset, nbytes = 4096 + 48, 256
    x = heap[RANK * HEAP_SIZE + offset :]  # a tensor inside this rank's heap, passed as a pointer
    expected = [heap.data_ptr() + p * HEAP_SIZE + offset for p in range(WORLD)]
    for nw in NUM_WARPS:
        got = columns(run(torch, _peer_kernel, 1 + 2 * WORLD + 5, nw, ctx, x, outside, nbytes, WORLD_=WORLD))
        assert got[:WORLD] == [{a} for a in expected], (nw, got[:WORLD])
        assert got[WORLD : 2 * WORLD] == [{a} for a in expected], (nw, got[WORLD : 2 * WORLD])
        assert got[2 * WORLD :] == [
            {0},
            {0},
            {STATUS["OUT_OF_BOUNDS"]},
            {STATUS["INVALID_ARGUMENT"]},
            {STATUS["OUT_OF_BOUNDS"]},
        ], (nw, got[2 * WORLD :])


def ctx_functions() -> list[str]:
    """Every function of the table whose first argument is the context (collectives included)."""
    return [name for name, (args, _, _) in _abi.FUNCTIONS.items() if args and args[0][0] == "ctx"]


def test_every_context_function_rejects_a_null_context() -> None:
    # Table-driven, so functions added later are covered: with ctx = 0 each one must return at
    # once, in every thread: status functions (i32) NULL_CONTEXT; address/value functions (i64)
    # NULL_CONTEXT or 0, as their docs say.
    torch = require_gpu()
    failures = {}
    for name in ctx_functions():
        args, ret, _ = _abi.FUNCTIONS[name]
        allowed = {STATUS["NULL_CONTEXT"]} if ret == "i32" else {STATUS["NULL_CONTEXT"], 0}
        for nw in NUM_WARPS:
            got = columns(run(torch, _null_context_kernel, 2, nw, tuple(0 for _ in args), FN=getattr(il, name)))[0]
            if len(got) != 1 or not got <= allowed:
                failures[(name, nw)] = got
    assert not failures, failures


def _main(argv: list[str]) -> int:
    """A minimal runner for machines without pytest: runs every test_* function, prints a summary."""
    tests: list[tuple[str, Callable[[], None]]] = [
        (k, v) for k, v in globals().items() if k.startswith("test_") and callable(v)
    ]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print(f"PASS {name}")
        except Skipped as e:
            print(f"SKIP {name}: {e}")
        except Exception as e:  # report and go on, like pytest
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{len(tests) - failed} of {len(tests)} passed or skipped, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
