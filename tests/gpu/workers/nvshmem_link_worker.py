"""GPU check of NVSHMEM linking, one process per GPU under torchrun, over PyTorch's NVSHMEM backend:

    . tests/gpu/setup_native.sh && torchrun --standalone --nproc_per_node=2 tests/gpu/workers/nvshmem_link_worker.py

Cases: the module init ran (NVSHMEM's PE and PE count read from the device match the process
group, and the kernel's module is among those initialized); `symm_nvshmem_ptr` finds every peer
of the node; a ring of puts with signal (each rank puts a pattern to the next, which waits for the
signal and checks the bytes), 20 rounds; argument errors give their status and send nothing.

Each rank prints "[rank r] case: OK" or a FAIL line; rank 0 prints
"NVSHMEM LINK world=W: P passed, F failed" and the process exits nonzero if any rank failed.
"""

from __future__ import annotations

import sys
import traceback
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
import triton
import triton.language as tl

import ironlink
import ironlink.language as il
from ironlink.language import _abi, _nvshmem
from ironlink.constants import CMP_GE, SIGNAL_OP_ADD

STATUS = _abi.STATUS


@ironlink.jit(nvshmem=True)
@triton.jit
def whoami_k(buf, peer, out):
    tl.store(out + 0, il.symm_nvshmem_my_pe(0))
    tl.store(out + 1, il.symm_nvshmem_n_pes(0))
    tl.store(out + 2, (il.symm_nvshmem_ptr(buf, peer) != 0).to(tl.int32))


@ironlink.jit(nvshmem=True)
@triton.jit
def ring_k(dst, src, sig, nbytes, peer, round_, out):
    s = il.symm_nvshmem_put_signal(dst, src, nbytes, sig, 1, SIGNAL_OP_ADD, peer)
    s += il.symm_nvshmem_quiet(0)
    s += il.symm_nvshmem_signal_wait(sig, CMP_GE, round_)
    tl.store(out, s)


@ironlink.jit(nvshmem=True)
@triton.jit
def bad_args_k(dst, src, sig, sig_misaligned, peer, bad_pe, out):
    tl.store(out + 0, il.symm_nvshmem_put_signal(dst, src, 16, sig, 1, SIGNAL_OP_ADD, bad_pe))
    tl.store(out + 1, il.symm_nvshmem_put_signal(dst, src, 16, sig, 1, 7, peer))
    tl.store(out + 2, il.symm_nvshmem_put_signal(dst, src, 16, sig_misaligned, 1, SIGNAL_OP_ADD, peer))
    tl.store(out + 3, il.symm_nvshmem_put_signal(dst, src, -1, sig, 1, SIGNAL_OP_ADD, peer))
    tl.store(out + 4, il.symm_nvshmem_signal_wait(sig, 99, 0))
    tl.store(out + 5, (il.symm_nvshmem_ptr(dst, bad_pe) == 0).to(tl.int32))


def main() -> int:
    dev = ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:  # PyTorch's NVSHMEM rendezvous needs two ranks
        print("NVSHMEM LINK world=1: skipped (PyTorch's NVSHMEM memory needs 2 ranks)", flush=True)
        dist.destroy_process_group()
        return 0
    symm_mem.set_backend("NVSHMEM")
    nbytes = 1 << 20
    buf = symm_mem.empty(nbytes, dtype=torch.uint8, device=dev)
    sig = symm_mem.empty(2, dtype=torch.int64, device=dev)
    for t in (buf, sig):
        symm_mem.rendezvous(t, group=dist.group.WORLD)
    sig.zero_()
    src = torch.full((nbytes,), rank + 1, dtype=torch.uint8, device=dev)
    out = torch.zeros(8, dtype=torch.int32, device=dev)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    torch.cuda.synchronize()
    dist.barrier()

    def whoami() -> None:
        before = set(_nvshmem.initialized_modules())
        whoami_k[(1,)](buf, nxt, out)
        got = out[:3].tolist()
        assert got == [rank, world, 1], f"(my_pe, n_pes, peer reachable) = {got}, want {[rank, world, 1]}"
        assert len(_nvshmem.initialized_modules() - before) == 1, "the kernel's module was not initialized once"
        for p in range(world):
            whoami_k[(1,)](buf, p, out)
            assert out[2].item() == 1, f"nvshmem_ptr to PE {p} is null on one node"

    def ring() -> None:
        for r in range(1, 21):
            buf.zero_()
            torch.cuda.synchronize()
            dist.barrier()
            ring_k[(1,)](buf, src, sig, nbytes, nxt, r, out, num_warps=4)
            torch.cuda.synchronize()
            assert out[0].item() == STATUS["OK"], f"round {r}: status {out[0].item()}"
            assert sig[0].item() == r, f"round {r}: signal {sig[0].item()}"
            bad = (buf != prev + 1).sum().item()
            assert bad == 0, f"round {r}: {bad} bytes differ from rank {prev}'s pattern"
            dist.barrier()  # nobody zeroes buf for the next round before its sender's data was checked

    def bad_args() -> None:
        sig.zero_()
        buf.zero_()
        torch.cuda.synchronize()
        dist.barrier()
        bad_args_k[(1,)](buf, src, sig, sig.data_ptr() + 4, nxt, world, out)
        torch.cuda.synchronize()
        want = [STATUS["INVALID_ARGUMENT"], STATUS["UNSUPPORTED_OP"], STATUS["MISALIGNED"],
                STATUS["INVALID_ARGUMENT"], STATUS["UNSUPPORTED_OP"], 1]
        assert out[:6].tolist() == want, f"{out[:6].tolist()} != {want}"
        dist.barrier()
        assert sig.tolist() == [0, 0] and buf.sum().item() == 0, "a refused put sent something"

    cases: list[tuple[str, Callable[[], None]]] = [("whoami", whoami), ("ring", ring), ("bad_args", bad_args)]
    failed = 0
    for name, case in cases:
        try:
            case()
            print(f"[rank {rank}] {name}: OK", flush=True)
        except Exception:
            failed += 1
            print(f"[rank {rank}] {name}: FAIL\n{traceback.format_exc()}", flush=True)
    totals = torch.tensor([failed], device=dev)
    dist.all_reduce(totals)
    if rank == 0:
        f = int(totals.item())
        print(f"NVSHMEM LINK world={world}: {len(cases) * world - f} passed, {f} failed", flush=True)
    dist.destroy_process_group()
    return 1 if totals.item() else 0


if __name__ == "__main__":
    sys.exit(main())
