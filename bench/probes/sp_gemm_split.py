"""How the sequence-parallel ops' GEMMs, split by rank block, fill one GPU: a probe, not a
benchmark (issue 61 item 3). It needs one GPU only: the split's cost is the GEMMs', not NVLink's.

    torchrun --nproc_per_node=1 bench/probes/sp_gemm_split.py --ms 1024,4096,16384 --worlds 4,2 \
        --out sp-gemm-split.json

The cuBLAS methods ("overlap", fused/cublas_methods.py) multiply block by block so that the
transfers overlap the GEMMs: all_gather_matmul a block [M / world, K] x b [K, N / world] once each
rank's shard is in, matmul_reduce_scatter a partial [M / world, K / world] x [K / world, N] for
each destination. A block can hold too few tiles to fill the GPU (all_gather_matmul at M = 4096,
world 4: [1024, 8192] x [8192, 2048], 64 tiles of 128 x 256 on 132 SMs): one block after another
leaves SMs idle, where PyTorch's pipelined ops alternate two streams, so two blocks' GEMMs run at
once. Per op, M and world (K = N = 8192, bf16, as bench/fused.py), each in CUDA graphs, median:
- whole: the op's GEMMs as one (the unsplit product; the floor);
- serial: the world block GEMMs one after another on one stream (the "overlap" method's order);
- two_streams: the blocks alternating between the current stream and a second one (PyTorch's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

import ironlink

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness ironlink_bench, run from anywhere
from ironlink_bench import record_row, time_graph, write_results  # noqa: E402


def blocks(op: str, m: int, world: int, k: int, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(the whole product's (rows, inner, cols), one block's) of `op` at M = `m` over `world` ranks."""
    if op == "all_gather_matmul":  # out [M, N / world] = a_full [M, K] @ b [K, N / world]
        return (m, k, n // world), (m // world, k, n // world)
    # matmul_reduce_scatter: partials [M, N] = a [M, K / world] @ b [K / world, N], a block per destination
    return (m, k // world, n), (m // world, k // world, n)


def split_runs(block: tuple[int, int, int], world: int) -> dict[str, Callable[[], None]]:
    """The serial and two-stream orders of `world` block GEMMs of shape `block`."""
    rows, inner, cols = block
    a = [torch.randn(rows, inner, device="cuda").to(torch.bfloat16) for _ in range(world)]
    b = (torch.randn(inner, cols, device="cuda") / inner ** 0.5).to(torch.bfloat16)
    out = [torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16) for _ in range(world)]
    side = torch.cuda.Stream()

    def serial() -> None:
        for i in range(world):
            torch.matmul(a[i], b, out=out[i])

    def two_streams() -> None:
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        for i in range(world):
            with torch.cuda.stream(side if i % 2 else main):
                torch.matmul(a[i], b, out=out[i])
        main.wait_stream(side)

    return {"serial": serial, "two_streams": two_streams}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1024,4096,16384")
    ap.add_argument("--worlds", default="4,2")
    ap.add_argument("--ops", default="all_gather_matmul,matmul_reduce_scatter")
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ironlink.init_distributed()  # time_graph takes the max over ranks: one rank here
    rows: list[dict[str, Any]] = []
    for op in args.ops.split(","):
        for world in map(int, args.worlds.split(",")):
            for m in map(int, args.ms.split(",")):
                whole, block = blocks(op, m, world, args.k, args.n)
                a = torch.randn(whole[0], whole[1], device="cuda").to(torch.bfloat16)
                b = (torch.randn(whole[1], whole[2], device="cuda") / whole[1] ** 0.5).to(torch.bfloat16)
                c = torch.empty(whole[0], whole[2], device="cuda", dtype=torch.bfloat16)
                runs = {"whole": lambda: torch.matmul(a, b, out=c), **split_runs(block, world)}
                for name, run in runs.items():
                    us = time_graph(run, c.nbytes)
                    record_row(rows, {"op": op, "M": m, "world": world, "block": "x".join(map(str, block)),
                                      "order": name, "us": round(us, 2)})
                del a, b, c, runs
    write_results(args.out, dist.get_world_size(), rows, probe="sp_gemm_split")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
