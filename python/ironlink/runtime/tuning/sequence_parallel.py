"""Launch choices of the sequence-parallel ops (`ironlink.all_gather_matmul`,
`ironlink.matmul_reduce_scatter`): the method by M and world, and the copy engine's part in
their kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .lookup import by_size, nearest_world
from .matmul import MATMUL_SIGNAL_EVERY, matmul_flat


# all_gather_matmul / matmul_reduce_scatter (ironlink.fused): how they run, by M (rows of the
# whole product) and measured world size. "collective": one ironlink collective and one cuBLAS
# GEMM; "overlap": the GEMM split by rank block, overlapped with copy-engine transfers; "kernel":
# the one-kernel Triton version (fused/all_gather_matmul.py, fused/matmul_reduce_scatter.py).
# (largest M, method) in increasing M; past the last, the last; a world without a table takes
# `lookup.nearest_world`'s.
SP_METHODS: dict[int, dict[str, tuple[tuple[int, str], ...]]] = {
    # 2 H200s, us: all_gather_matmul collective 39.7 / 41.8 against overlap 64.5 / 63.5 at M = 128,
    # overlap 116.2 / 113.9 against collective 130.3 / 127.0 at 1024 (git 784be2d, 7b34909:
    # bench/results/fused-2xNVIDIA-H200-20261125-234653.json, -20261126-021817.json);
    # matmul_reduce_scatter collective 37.0 / 35.5 against kernel 53.8 / 53.6 at M = 128, and its
    # kernel (two-shot by slices, TMA pushes) fastest from 1024 up, with the contenders timed in
    # turns (9bbf473, -20261126-050609.json): 125.0 / 444.8 / 1857.8 at 1024 / 4096 / 16384 against
    # overlap 130.0 / 453.9 / 2054.5 (timed one after another, as before, the overlap method ran
    # first and looked level at 16384).
    2: {"all_gather_matmul": ((512, "collective"), (1 << 62, "overlap")),
        "matmul_reduce_scatter": ((512, "collective"), (1 << 62, "kernel"))},
    # 4 H200s, K = N = 8192, bf16 (bench/results/fused-4xNVIDIA-H200-20261122-183637.json):
    # all_gather_matmul collective 96 / overlap 109 us at M = 1024, 350 / 290 at 4096;
    # matmul_reduce_scatter collective 28 / overlap 52 at M = 128, 102 / 89 at 1024. The kernel
    # method was slowest at every M.
    4: {"all_gather_matmul": ((2048, "collective"), (1 << 62, "overlap")),
        "matmul_reduce_scatter": ((512, "collective"), (1 << 62, "overlap"))},
}
SP_METHOD_NAMES = ("kernel", "collective", "overlap")
# all_gather_matmul's kernel: the pieces each own-row tile's K loop is cut into, one piece of the
# push of the shard before each (fused/all_gather_matmul_kernels.py).
ALL_GATHER_MATMUL_PUSH_SEGMENTS = 4
# all_gather_matmul's kernel on one node with a contiguous shard: the copy engine moves the shard
# to every peer (announced through heap flags) and the kernel's CTAs only compute; False: the
# kernel's CTAs push the shard themselves (above).
ALL_GATHER_MATMUL_COPY_ENGINE = True
# matmul_reduce_scatter's kernel on one node: from a rank's block of this many rows on
# (M // world), its partials are stored locally and moved by the copy engine
# (`matmul_reducescatter_copy_engine_kernel`); below it, and with None, the kernel's CTAs push
# them (`matmul_reducescatter_kernel`); 0: the copy engine at every M. Graph us, copy engine /
# CTAs' pushes / torch_symm_fused, 2 H200s:
# - M = 1024 (512 rows a block): 160.3 / 123.6 / 125.6 (session 39, bench/results/experiments/
#   fused-rs-copy-engine-every-m-2xNVIDIA-H200-16ab847.json; why is not probed);
# - M = 2048 / 4096 / 8192 / 16384: 211.0 / 231.5 / 234.9, 415.1 / 461.3 / 484.9, 875.0 / 907.9 /
#   956.7, 1789.5 / 1797.5 / 2025.8 (session 38, bench/results/experiments/
#   fused-copy-engine-2xNVIDIA-H200-20261127.json).
MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS: int | None = 1024


# The copy-engine kernels, by op: a block of a rank's rows is cut into at least this many chunks
# (the GEMM's GROUP_M halved until it is, down to 1). matmul_reduce_scatter's own tiles wait for
# the peers' copies of the same rows, which start only when a whole chunk is computed: with one
# chunk a block (GROUP_M 8, 1024 rows, M = 2048) its copy-engine kernel took 265.9 us, with 2
# chunks 211.0, with 4 215.3; at M = 4096, 8192, 16384 2 / 1 / 4 chunks at least: 415.1 / 416.1 /
# 426.8, 875.0 / 879.1 / 879.4, 1789.5 / 1790.5 / 1795.0. all_gather_matmul's kernel reads the
# peers' rows only after its own: GROUP_M as planned / 4 chunks at least 201.4 / 211.6 (M = 2048),
# 393.3 / 385.0 (M = 4096). 2 H200s, session 38
# (bench/results/experiments/fused-copy-engine-2xNVIDIA-H200-20261127.json).
COPY_ENGINE_MIN_CHUNKS = {"all_gather_matmul": 1, "matmul_reduce_scatter": 2}


@dataclass(frozen=True)
class GatherExchange:
    """How all_gather_matmul's kernel method moves the shard (`all_gather_matmul(exchange=)`; None:
    these defaults, the measured choices): by the copy engine where the shard is contiguous
    (ALL_GATHER_MATMUL_COPY_ENGINE; False: the kernel's CTAs push it), in at least `min_chunks`
    chunks a block (COPY_ENGINE_MIN_CHUNKS)."""

    copy_engine: bool = ALL_GATHER_MATMUL_COPY_ENGINE
    min_chunks: int = COPY_ENGINE_MIN_CHUNKS["all_gather_matmul"]


@dataclass(frozen=True)
class ScatterExchange:
    """How matmul_reduce_scatter's kernel method moves the partials (`matmul_reduce_scatter(exchange=)`;
    None: these defaults, the measured choices): by the copy engine from blocks of
    `copy_engine_min_rows` rows a rank on (MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS; None: never,
    0: always), in at least `min_chunks` chunks a block (COPY_ENGINE_MIN_CHUNKS); else the CTAs push
    them, at world 2 with a release every `signal_every` tiles (MATMUL_SIGNAL_EVERY)."""

    copy_engine_min_rows: Optional[int] = MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS
    min_chunks: int = COPY_ENGINE_MIN_CHUNKS["matmul_reduce_scatter"]
    signal_every: int = MATMUL_SIGNAL_EVERY

    def takes_copy_engine(self, block_rows: int) -> bool:
        """Whether the kernel on one node, with blocks of `block_rows` rows a rank, has the copy
        engine move its partials."""
        return self.copy_engine_min_rows is not None and block_rows >= self.copy_engine_min_rows


@dataclass(frozen=True)
class GatherPush:
    """How all_gather_matmul's kernel runs its GEMM and pushes the shard: what its `launch` takes
    (`push=`). `gather_push` gives the measured choices; a probe builds its own."""

    flat: bool  # the flattened tile loop (`matmul_flat`), with the GEMM's TMA
    segments: int  # pieces of each own-row tile's K loop, a piece of the push before each, with the
    # GEMM's TMA (ALL_GATHER_MATMUL_PUSH_SEGMENTS; the pointer GEMM takes 1: a piece beside its
    # accumulator spills registers)
    tma_push: bool = True  # world 2: TMA pushes where the layout allows; False: stores from registers


def gather_push(cc_major: int) -> GatherPush:
    """The measured choices on a GPU of compute capability `cc_major`.x."""
    return GatherPush(matmul_flat(cc_major), ALL_GATHER_MATMUL_PUSH_SEGMENTS)


def sp_method(op: str, m: int, world: int) -> str:
    """How the sequence-parallel op `op` runs for an M-row product at `world` ranks (SP_METHODS of
    `lookup.nearest_world`)."""
    return by_size(SP_METHODS[nearest_world(SP_METHODS, world)][op], m)[1]


def check_sp_method(method: str) -> str:
    """`method` if it names a sequence-parallel method, else ValueError."""
    if method not in SP_METHOD_NAMES:
        raise ValueError(f"method must be one of {SP_METHOD_NAMES}, got {method!r}")
    return method


__all__ = ["ALL_GATHER_MATMUL_COPY_ENGINE", "ALL_GATHER_MATMUL_PUSH_SEGMENTS", "COPY_ENGINE_MIN_CHUNKS", "GatherExchange",
           "GatherPush", "gather_push", "MATMUL_REDUCE_SCATTER_COPY_ENGINE_MIN_ROWS", "SP_METHODS", "SP_METHOD_NAMES",
           "ScatterExchange", "check_sp_method", "sp_method"]
