"""What the fused kernels whose data the copy engine carries share (all_gather_matmul's and
matmul_reduce_scatter's one-kernel methods on one node): the flag words between a kernel, its
side stream and the peers, the start and end of a launch, and the launch order.

Flag words (u64, a heap workspace per op, zero between launches), per rank:
- FLAG_GO: this rank's kernel -> its side stream: every peer's launch has started, so the
  stream may write into the peers' buffers (the stream waits for it, then zeroes it);
- FLAG_FREE + p: rank p's kernel -> this rank's kernel: p's launch has started, so p is done
  with the buffers this rank's stream writes (a rank may use them until its launch starts);
- flag_done(world): the count of the launch's CTAs that have finished (`close_launch`);
- from flag_data(world) on: the op's own words (chunk flags).

A chunk is a group of GROUP_M tile rows of a block, the order the kernels' tile walk takes them
(`gemm_tiles.tile_coords`): tile row tm is in chunk tm // GROUP_M, rows `chunks(rows, config)`. The
kernels run `chunked(rows, config, min_chunks)`: GROUP_M small enough for a few chunks a block (the
op's exchange config says how few: `tuning.GatherExchange`, `tuning.ScatterExchange`).

The stream waits (no timeout) only for words its own kernel sets, after a timeout too; every
wait on a peer is in a kernel and times out (recorded; the host raises).
"""

from __future__ import annotations

from typing import Any, Callable

from ..runtime import tuning

import triton
import triton.language as tl

from .. import language as il
from ..language import _abi
from ..language import typed as ilt
from ..runtime import streams
from . import barrier

FLAG_GO: tl.constexpr = tl.constexpr(0)
FLAG_FREE: tl.constexpr = tl.constexpr(1)
EQ: tl.constexpr = tl.constexpr(_abi.CMP["EQ"])
SET: tl.constexpr = tl.constexpr(_abi.SIGNAL_OP["SET"])
ADD: tl.constexpr = tl.constexpr(_abi.SIGNAL_OP["ADD"])


def chunked(rows: int, config: tuning.MatmulConfig, min_chunks: int) -> tuning.MatmulConfig:
    """`config` with GROUP_M halved until a block of `rows` rows has at least `min_chunks` chunks
    (or GROUP_M is 1): the config a copy-engine kernel runs."""
    tiles_m = -(-rows // config.block_m)
    group_m = config.group_m
    while group_m > 1 and -(-tiles_m // group_m) < min_chunks:
        group_m //= 2
    return config._replace(group_m=group_m)


def chunks(rows: int, config: tuning.MatmulConfig) -> list[tuple[int, int]]:
    """The row ranges [lo, hi) of a block of `rows` rows, a chunk each: GROUP_M tile rows."""
    step = config.group_m * config.block_m
    return [(lo, min(lo + step, rows)) for lo in range(0, rows, step)]


def flag_done(world: int) -> int:
    return FLAG_FREE.value + world


def flag_data(world: int) -> int:
    return flag_done(world) + 1


@triton.jit
def data_words(flags, WORLD: tl.constexpr):
    """The op's own words in a kernel: `flags + flag_data(WORLD)`."""
    return flags + FLAG_FREE + WORLD + 1


@triton.jit
def open_launch(ctx, flags, rank, WORLD: tl.constexpr):
    """CTA 0: tells every peer that this launch has started, waits until each says the same,
    then lets the side stream go (even after a timeout: the stream's wait has none of its own).
    Returns the status (0 on other CTAs)."""
    worst = rank * 0
    if tl.program_id(0) == 0:
        for i in tl.static_range(1, WORLD):
            il.symm_signal_at(ctx, flags + FLAG_FREE + rank, 1, SET, (rank + i) % WORLD)
        for i in tl.static_range(1, WORLD):
            p = (rank + i) % WORLD
            worst = ilt.failure_or(worst, il.symm_signal_wait_at(ctx, flags + FLAG_FREE + p, EQ, 1))
            tl.store(flags + FLAG_FREE + p, 0)
        il.symm_signal_at(ctx, flags + FLAG_GO, 1, SET, rank)
    return worst


@triton.jit
def close_launch(flags, words, count, WORLD: tl.constexpr, BLOCK: tl.constexpr = 128):
    """The launch's last CTA to get here (every other CTA has passed its waits) zeroes the count
    of finished CTAs and the `count` flag words at `words` its CTAs waited on: plain stores, as
    the next launch's peers write them only after it has started."""
    done = flags + FLAG_FREE + WORLD
    if tl.atomic_add(done, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        tl.store(done, 0)
        for i in range(0, count, BLOCK):
            at = i + tl.arange(0, BLOCK)
            tl.store(words + at, tl.zeros([BLOCK], dtype=tl.int64), mask=at < count)


def flags_workspace(heap: Any, name: str, op_words: int, check: bool) -> Any:
    """This rank's flag words of op `name` (int64 [flag_data(world) + op_words]), a heap
    workspace, zero between launches. Made on the first call (or one that needs more words), all
    of it zeroed (a later call with more words, another shape's, uses the same one: its words
    must be zero too, not what freed heap memory held), then a barrier of the ranks, so that no
    peer sets a flag in it before it is zeroed."""
    import torch

    def zero_all(workspace: Any) -> None:
        workspace[:] = 0

    count = flags_bytes(heap.world_size, op_words) // 8
    made = not heap.has_workspace(name, count * 8)
    flags = heap.workspace(name, count * 8, init=zero_all).view(torch.int64)[:count]
    if made:
        barrier.device_barrier(heap, check)
    return flags


def flags_bytes(world: int, op_words: int) -> int:
    """The bytes of an op's flag words at `world` ranks with `op_words` words of its own."""
    return 8 * (flag_data(world) + op_words)


def flags_name(op: str) -> str:
    """The heap workspace of op's flag words."""
    return f"{op}/flags"


def planned(world: int, rows: int, config: tuning.MatmulConfig, min_chunks: int,
            words_per_chunk: int) -> tuple[tuning.MatmulConfig, int]:
    """(config, op words) of an op's copy-engine kernel for blocks of `rows` rows: its config
    `chunked` into at least `min_chunks` chunks, and `words_per_chunk` of the op's own words per
    rank and chunk (pure: `prepare` and the ops' heap_bytes)."""
    config = chunked(rows, config, min_chunks)
    return config, words_per_chunk * world * len(chunks(rows, config))


def prepare(heap: Any, op: str, rows: int, config: tuning.MatmulConfig, min_chunks: int, words_per_chunk: int,
            check: bool) -> tuple[tuning.MatmulConfig, Any]:
    """What op's copy-engine kernel runs with for blocks of `rows` rows (`planned`): its config
    and its flag words (`flags_workspace` `flags_name(op)`)."""
    config, words = planned(heap.world_size, rows, config, min_chunks, words_per_chunk)
    return config, flags_workspace(heap, flags_name(op), words, check)


def launch(heap: Any, flags: Any, kernel: Callable[[], None], transfers: Callable[[Any], None]) -> None:
    """Launches `kernel` on the current stream, then runs `transfers(side)` on a side stream
    after the go of this launch (and after the current stream's earlier work); the current
    stream joins it. The kernel goes first: a stream wait enqueued before it could deadlock with
    anything that synchronizes the device in between (the kernel's first launch loads its
    module, which waits for every stream)."""
    import torch

    main = torch.cuda.current_stream()
    (side,) = streams.side_streams(heap.device.index, 1, main)
    before = torch.cuda.Event()
    before.record(main)  # what the kernel's inputs need
    kernel()
    side.wait_event(before)
    with torch.cuda.stream(side):
        streams.wait_flag(side, flags[FLAG_GO.value], 1)
        streams.write_flag(side, flags[FLAG_GO.value], 0)
        transfers(side)
    main.wait_stream(side)


__all__ = ["ADD", "EQ", "FLAG_FREE", "FLAG_GO", "SET", "chunked", "chunks", "close_launch", "data_words", "flag_data", "flag_done",
           "flags_bytes", "flags_name", "flags_workspace", "launch", "open_launch", "planned", "prepare"]
