"""How fast a persistent Triton TMA GEMM runs on this GPU, by loop structure: a probe, not a
benchmark. For matmul_all_reduce's GEMM (issue 36): is the gap to cuBLAS the nested tile loop,
which drains the software pipeline at every tile, or the tile code itself?

    torchrun --nproc_per_node=2 bench/probes/gemm_probe.py --ms 1024,4096 --N 8192 --K 4096 --out gemm-probe.json
    # all_gather_matmul's per-rank product, several tiles and GROUP_M:
    torchrun --nproc_per_node=2 bench/probes/gemm_probe.py --ms 4096,16384 --N 4096 --K 8192 \
        --tiles 128x256x64,256x128x64 --group-ms 8,16 --variants flatten,flatten_subtile

Variants of one kernel (tile BLOCK_M x BLOCK_N x BLOCK_K from --tiles, default 128 x 256 x 64;
8 warps, bf16, b row-major [K, N]):
- nested: the tile loop and the K loop as written (what the fused kernels do today);
- flatten: `tl.range(..., flatten=True)`: Triton fuses the two loops into one and pipelines the
  loads across tile boundaries;
- warp_specialize: `tl.range(..., warp_specialize=True)` (producer / consumer warps), where this
  Triton compiles it for this GPU;
- subtile: the epilogue stores the tile as two [128, 128] halves (less shared memory for it).
Against torch.matmul into a preallocated output; CUDA graphs of 20 calls, median of the replays.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import ironlink
from ironlink.fused.gemm_tiles import tile_coords

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness ironlink_bench, run from anywhere
from ironlink_bench import record_row, time_graph, write_results  # noqa: E402


@triton.jit
def persistent_gemm(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, FLATTEN: tl.constexpr, WS: tl.constexpr,
                    SUBTILE: tl.constexpr):
    pid, grid = tl.program_id(0), tl.num_programs(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for t in tl.range(pid, tiles_m * tiles_n, grid, flatten=FLATTEN, warp_specialize=WS):
        tm, tn = tile_coords(t, tiles_m, tiles_n, GROUP_M)
        m0, n0 = tm * BLOCK_M, tn * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            acc = tl.dot(a_desc.load([m0, ki * BLOCK_K]), b_desc.load([ki * BLOCK_K, n0]), acc)
        if SUBTILE:
            halves = tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)).permute(0, 2, 1)
            left, right = tl.split(halves)
            c_desc.store([m0, n0], left.to(tl.bfloat16))
            c_desc.store([m0, n0 + BLOCK_N // 2], right.to(tl.bfloat16))
        else:
            c_desc.store([m0, n0], acc.to(tl.bfloat16))


VARIANTS = {"nested": (False, False, False), "flatten": (True, False, False), "warp_specialize": (False, True, False),
            "subtile": (False, False, True), "flatten_subtile": (True, False, True)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1024,4096")
    ap.add_argument("--N", dest="n", type=int, default=8192)
    ap.add_argument("--K", dest="k", type=int, default=4096)
    ap.add_argument("--stages", default="3,4")
    ap.add_argument("--tiles", default="128x256x64", help="BLOCK_MxBLOCK_NxBLOCK_K, comma-separated")
    ap.add_argument("--group-ms", default="8", help="GROUP_M values, comma-separated")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="of " + ", ".join(VARIANTS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ironlink.init_distributed()  # time_graph takes the max over ranks: each rank times its own GPU
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles_mnk = [tuple(map(int, t.split("x"))) for t in args.tiles.split(",")]
    rows: list[dict[str, Any]] = []
    for m in map(int, args.ms.split(",")):
        a = torch.randn(m, args.k, device="cuda").to(torch.bfloat16)
        b = (torch.randn(args.k, args.n, device="cuda") / args.k ** 0.5).to(torch.bfloat16)
        c = torch.empty(m, args.n, device="cuda", dtype=torch.bfloat16)
        ref = a @ b
        us = time_graph(lambda: torch.matmul(a, b, out=c), c.nbytes)
        record_row(rows, {"M": m, "N": args.n, "K": args.k, "variant": "torch.matmul", "us": round(us, 2)})
        for (bm, bn, bk), group_m, name, stages in itertools.product(
                tiles_mnk, map(int, args.group_ms.split(",")), args.variants.split(","),
                map(int, args.stages.split(","))):
            flatten, ws, subtile = VARIANTS[name]
            a_d = TensorDescriptor(a, list(a.shape), list(a.stride()), [bm, bk])
            b_d = TensorDescriptor(b, list(b.shape), list(b.stride()), [bk, bn])
            c_d = TensorDescriptor(c, list(c.shape), list(c.stride()), [bm, bn // 2 if subtile else bn])
            tiles = triton.cdiv(m, bm) * triton.cdiv(args.n, bn)
            row: dict[str, Any] = {"M": m, "N": args.n, "K": args.k, "variant": name, "stages": stages,
                                   "tile": f"{bm}x{bn}x{bk}", "group_m": group_m}
            try:
                def run() -> None:
                    persistent_gemm[(min(sms, tiles),)](a_d, b_d, c_d, m, args.n, args.k, BLOCK_M=bm, BLOCK_N=bn,
                                                        BLOCK_K=bk, GROUP_M=group_m, FLATTEN=flatten, WS=ws,
                                                        SUBTILE=subtile, num_warps=8, num_stages=stages)
                c.zero_()
                t0 = time.time()
                run()
                torch.cuda.synchronize()
                row["compile_s"] = round(time.time() - t0, 1)
                row["max_err"] = float((c.float() - ref.float()).abs().max())
                row["us"] = round(time_graph(run, c.nbytes), 2)
            except Exception as e:  # a variant this Triton or GPU does not take
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            record_row(rows, row)
    write_results(args.out, dist.get_world_size(), rows, probe="gemm_probe")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
