"""The backends' benchmark (issue 19): the same all-reduce over ironlink's P2P heap, over
PyTorch's NVSHMEM memory as one node, and over NVSHMEM as simulated nodes, against NCCL.

    bench/run.sh backends                    # 4 GPUs: nvshmem_2x2 = 2 nodes of 2
    bench/run.sh backends --max-bytes 16777216

Rows: `collective` ("all_reduce"), `dtype` ("bf16"), `bytes`, `backend` ("p2p", "nvshmem",
`nvshmem_<nodes>x<ranks per node>`, or "nccl"), `us`, `busbw_GBs`, `vs_p2p` (P2P time / this
one). Every ironlink row is `ironlink.all_reduce` with the tuned grid (`tuning.choose`); on the
simulated nodes that is `symm_all_reduce_hierarchical` (NVLink stands in for the network, so its
time is a lower bound for real nodes). Timing as `ironlink_bench` (CUDA graph, median, max over
ranks). Each backend's result is checked against NCCL's before it is timed. A benchmark, not a
test: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import ironlink
from ironlink_bench import SIZES, time_graph, write_results


def heaps(max_bytes: int) -> dict[str, ironlink.SymmetricHeap]:
    """One heap per backend; NVSHMEM ones only where PyTorch offers NVSHMEM and the world splits
    into nodes of at least one rank."""
    world = dist.get_world_size()
    nbytes = max_bytes + (16 << 20)
    out = {"p2p": ironlink.SymmetricHeap(nbytes)}
    import torch.distributed._symmetric_memory as symm_mem

    if world < 2 or not symm_mem.is_nvshmem_available():
        if dist.get_rank() == 0:
            print("nvshmem backends skipped: world 1 or no NVSHMEM in this torch", flush=True)
        return out
    out["nvshmem"] = ironlink.SymmetricHeap(nbytes, backend="nvshmem", node_size=world)
    per_node = world // 2
    out[f"nvshmem_{world // per_node}x{per_node}"] = ironlink.SymmetricHeap(
        nbytes, backend="nvshmem", node_size=per_node)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="JSON file to write (rank 0)")
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    args = ap.parse_args()
    # NVSHMEM's symmetric heap holds two of ours; the default (1 GiB) would not.
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(2 * args.max_bytes + (1 << 30)))
    ironlink.init_distributed()
    world = dist.get_world_size()
    hs = heaps(args.max_bytes)
    rows: list[dict] = []
    factor = 2 * (world - 1) / world
    for nbytes in [s for s in SIZES if s <= args.max_bytes]:
        n = nbytes // 2
        x = torch.randn(n, device="cuda").to(torch.bfloat16)
        ref = x.float()
        dist.all_reduce(ref)
        t = x.clone()
        times = {"nccl": time_graph(lambda: dist.all_reduce(t), nbytes)}
        for name, h in hs.items():
            buf = h.empty((n,), torch.bfloat16).copy_(x)
            ironlink.all_reduce(buf, heap=h, check=True)
            err = ((buf.float() - ref).abs() / ref.abs().clamp_min(1)).max().item()
            assert err < 2e-2, f"{name}: relative error {err} at {nbytes} B"
            times[name] = time_graph(lambda: ironlink.all_reduce(buf, heap=h), nbytes)
            h.check()
            h.free(buf)
        for name, us in times.items():
            algbw = nbytes / us / 1e3
            rows.append({"collective": "all_reduce", "dtype": "bf16", "bytes": nbytes, "backend": name,
                         "us": round(us, 3), "busbw_GBs": round(algbw * factor, 2),
                         "vs_p2p": round(times["p2p"] / us, 3)})
            if dist.get_rank() == 0:
                print(f"all_reduce bf16 {nbytes:>11} {name:>14} {us:>10.2f} us {algbw * factor:>8.1f} GB/s "
                      f"x{times['p2p'] / us:.2f} of p2p", flush=True)
    write_results(args.out, world, rows, backends=list(hs))
    for h in hs.values():
        h.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
