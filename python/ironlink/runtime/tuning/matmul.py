"""Launch choices of matmul_all_reduce (`ironlink.matmul_all_reduce`): the GEMM tile by M, the
method by tiles and world, and the push kernels' pacing. The tile configuration is also what
the sequence-parallel ops' kernels take."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...language._abi import MAX_TILES
from . import decode_table
from .lookup import by_size


class MatmulConfig(NamedTuple):
    """A Triton GEMM tile configuration (of `matmul_all_reduce`)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    warps: int
    stages: int

    def tiles(self, m: int, n: int) -> int:
        """Tiles of this shape in an [m, n] output (partial tiles at the edges count)."""
        return -(-m // self.block_m) * -(-n // self.block_n)


# (largest M, config) in increasing M; past the last, the last. Small M is bound by reading B:
# narrow tiles give every SM a share of it. Large M: 128 x 256 tiles measured fastest of three on
# 4 H200s (bench/results/experiments/fused-matmul-configs-4xNVIDIA-H200-20261122-125605.json: 161 / 621 us at M = 1024 /
# 4096, against 186 / 719 for 128 x 128 and 254 / 998 for 128 x 64).
MATMUL_CONFIGS: tuple[tuple[int, MatmulConfig], ...] = (
    (16, MatmulConfig(16, 64, 128, 8, 4, 4)),
    (32, MatmulConfig(32, 64, 128, 8, 4, 4)),
    (64, MatmulConfig(64, 64, 64, 8, 4, 4)),
    (256, MatmulConfig(64, 128, 64, 8, 4, 4)),
    (1 << 62, MatmulConfig(128, 256, 64, 8, 8, 3)),
)


# matmul_all_reduce "push": the CTAs push their previous tile at STAGGER different points of the
# current tile's K loop (CTA c at (c % STAGGER) / STAGGER of it), so partials leave over the whole
# tile time instead of in one burst that queues every CTA behind a full NVLink.
MATMUL_PUSH_STAGGER = 8
# matmul_all_reduce "push", two-shot: a CTA signals its last tile's pushes after this share of
# its next tile's K loop (the pushes drain behind the GEMM; the signal waits for them). Measured on
# 2 H100s at M = 4096 / 1024 (graph us): 0.0 497.5 / 142.5, 0.5 465.3 / 139.0, 1.0 477.3 / 141.7
# (bench/results/experiments/fused-timeline-two-shot-2xNVIDIA-H100-20261125-2036.json).
MATMUL_SIGNAL_AT = 0.5
# matmul_all_reduce "push", two-shot: one K loop per tile in a flattened tile loop (Triton pipelines
# loads across tiles), the signal after it and the epilogue in halves; MATMUL_SIGNAL_AT then
# unused. The GEMM alone that way: 369.9 us at M = 4096 against 391.2 nested and cuBLAS's 366.5
# (bench/results/experiments/gemm-probe-2xNVIDIA-H100-20261125.json).
MATMUL_FLAT = True


def matmul_flat(cc_major: int) -> bool:
    """Whether matmul_all_reduce's two-shot kernel runs its flattened loop on a GPU of compute
    capability `cc_major`.x: Hopper only, where it was measured and fits shared memory (on sm_100
    Triton 3.5 pipelines it into 245,808 bytes, over the 232,448 a CTA may have)."""
    return MATMUL_FLAT and cc_major == 9


# matmul_all_reduce "push" at world 2: one-shot while the tiles take at most this many waves of
# the CTAs. At M = 1024 (256 tiles of 128 x 256 on 132 CTAs: two waves) one-shot beat two-shot in
# four of five runs (graph us, one-shot / two-shot): 2 H200s 132.7 / 138.6 (git 784be2d) and
# 131.9 / 139.5 (7b34909); 2 H100s 139.0 / 142.4 (6759c28) and 136.3 / 141.6 (99b169a); level
# in the fifth (138.6 / 138.9, 2 H200s, f2ca070); at M = 4096 (eight waves) two-shot won each
# time (462.8 / 490.0 on 2 H200s at 7b34909).
MATMUL_ONE_SHOT_MAX_WAVES = 2
# At world 2, matmul_all_reduce's two-shot kernel (flattened loop) and matmul_reduce_scatter's
# kernel signal their pushes every this many tiles with one release (`symm_tile_signal_batch`).
# With all 132 CTAs signalling, one signal costs a CTA 1.9 us with nothing written before it and
# 4.6 us after a TMA push (2 H200s, bench/probes/signal_probe.py). matmul_all_reduce at M = 4096, graph
# us, batches of 1 / 2 / 4 / 8 (2 H200s, git 5a2a6ff, one run of bench/fused.py): 485.3 / 470.1 /
# 462.4 / 465.0 (bench/results/experiments/fused-signal-batch-ab-2xH200-5a2a6ff.json).
MATMUL_SIGNAL_EVERY = 4
# matmul_all_reduce "push", one-shot: after the tile loop, the last tile's push in chunks with the
# reduce of the tile before between them (`push_while_reducing`), rather than the push first.
MATMUL_TAIL_INTERLEAVED = True


@dataclass(frozen=True)
class PushPacing:
    """How matmul_all_reduce's "push" kernels pace their pushes: the op's and its `launch`'s `exchange=`.
    `push_pacing` gives the measured choices; a probe builds its own (`dataclasses.replace`)."""

    stagger: int  # one-shot: the CTAs push at `stagger` points of a tile's K loop (MATMUL_PUSH_STAGGER)
    tail_interleaved: bool  # one-shot: the last tile's push between the reduces (MATMUL_TAIL_INTERLEAVED)
    signal_at: float  # two-shot, nested loop: the signal after this share of the next K loop (MATMUL_SIGNAL_AT)
    flat: bool  # two-shot: the flattened tile loop (`matmul_flat`)
    signal_every: int  # two-shot, flat, world 2: a release every this many tiles (MATMUL_SIGNAL_EVERY)
    tma_push: bool = True  # world 2: TMA pushes where the layout allows; False: stores from registers


def push_pacing(cc_major: int) -> PushPacing:
    """The measured pacing on a GPU of compute capability `cc_major`.x."""
    return PushPacing(MATMUL_PUSH_STAGGER, MATMUL_TAIL_INTERLEAVED, MATMUL_SIGNAL_AT, matmul_flat(cc_major),
                      MATMUL_SIGNAL_EVERY)


def matmul_one_shot(tiles: int, ctas: int, world: int) -> bool:
    """matmul_all_reduce "push": one-shot (every rank sums every tile, one NVLink hop) at world 2
    while the tiles take at most MATMUL_ONE_SHOT_MAX_WAVES waves, where latency rules; else
    two-shot by slices (each rank sums its slice: less extra memory traffic, a shorter tail)."""
    return world == 2 and tiles <= MATMUL_ONE_SHOT_MAX_WAVES * ctas


def matmul_method(tiles: int, ctas: int, world: int, out_bytes: int) -> str:
    """matmul_all_reduce's method on one node for `tiles` output tiles (`out_bytes` of out) on a
    grid of `ctas`: the world's decode table where the node measured that size (`python -m
    ironlink.tune`), else the rule: "lamport" at world 2 while every tile is in the first wave
    (each CTA's tile goes out from registers as it is done and is read as it lands; a CTA with
    more tiles would wait on each), else "push" (producer / consumer: no CTA waits for a peer
    before its next tile). 2 H200s, N = 8192, K = 4096, graph us, lamport / push / torch.matmul +
    ironlink.all_reduce, one run (git 21a219a, bench/results/fused-2xNVIDIA-H200-20261126-222454.json):
    M = 16 (128 tiles of 16 x 64) 21.4 / 25.9 / 25.0; 128 (128 of 64 x 128) 33.6 / 37.1 / 37.7;
    1024 (256 of 128 x 256, two waves) 154.2 / 140.2 / 161.9."""
    measured = decode_table.table_for(world).matmul_method(out_bytes)
    return measured or ("lamport" if world == 2 and tiles <= ctas else "push")


def matmul_config(m: int, n: int, k: int, world: int) -> MatmulConfig:
    """The tile configuration for an [m, k] x [k, n] matmul + all-reduce: from `MATMUL_CONFIGS`,
    widened until the output has at most MAX_TILES tiles (each tile has its own slot)."""
    del k, world
    _, cfg = by_size(MATMUL_CONFIGS, m)
    while cfg.tiles(m, n) > MAX_TILES and cfg.block_n < 256:
        cfg = cfg._replace(block_n=cfg.block_n * 2)
    while cfg.tiles(m, n) > MAX_TILES and cfg.block_m < 256:
        cfg = cfg._replace(block_m=cfg.block_m * 2)
    return cfg


__all__ = ["MATMUL_CONFIGS", "MATMUL_FLAT", "MATMUL_ONE_SHOT_MAX_WAVES", "MATMUL_PUSH_STAGGER", "MATMUL_SIGNAL_AT",
           "MATMUL_SIGNAL_EVERY", "MATMUL_TAIL_INTERLEAVED", "MatmulConfig", "PushPacing", "matmul_config", "matmul_flat",
           "matmul_method", "matmul_one_shot", "push_pacing"]
