"""Can ranks that share one GPU wait on each other? A ping-pong between two processes on GPU 0.

Two processes map one flag buffer (CUDA IPC through torch.multiprocessing) and run a Triton
kernel each that bounces a counter back and forth `rounds` times, spinning on the other's
store. Without MPS the GPU time-slices between the two contexts, so each wait lasts until the
other context is scheduled; with MPS both kernels run at once. Prints the time per round trip,
or TIMEOUT if a wait ran past its bound. Used to decide whether multi-rank GPU tests can run on
a machine with one GPU (timings there mean nothing; correctness does).

    python3 bench/probes/shared_gpu_probe.py [--rounds N]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.multiprocessing as mp
import triton
import triton.language as tl


@triton.jit
def ping_pong(flags, me: tl.constexpr, rounds, spin_limit):
    """Rank 0 writes round i to flags[0] and waits for flags[1] == i; rank 1 the mirror."""
    mine = flags + me
    theirs = flags + (1 - me)
    timed_out = 0
    for i in range(1, rounds + 1):
        if me == 0:
            tl.atomic_xchg(mine, i, sem="release", scope="sys")
        spins = 0
        while (tl.atomic_add(theirs, 0, sem="acquire", scope="sys") < i) & (spins < spin_limit):
            spins += 1
        if spins >= spin_limit:
            timed_out = 1
        if me == 1:
            tl.atomic_xchg(mine, i, sem="release", scope="sys")
    tl.atomic_xchg(flags + 2 + me, timed_out + 1)


def worker(me: int, q: mp.Queue, out: mp.Queue, rounds: int) -> None:
    torch.cuda.set_device(0)
    flags = torch.zeros(4, dtype=torch.int64, device="cuda") if me == 0 else q.get()
    if me == 0:
        q.put(flags)
    ping_pong[(1,)](flags, me, 0, 1)  # compile outside the timed run
    torch.cuda.synchronize()
    t = time.perf_counter()
    ping_pong[(1,)](flags, me, rounds, 1 << 30)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    status = int(flags[2 + me].item())
    out.put((me, dt, status))
    time.sleep(1.0)  # keep the owner alive until the peer has read


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2000)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, q, out, a.rounds)) for r in range(2)]
    for p in ps:
        p.start()
    res = sorted(out.get(timeout=300) for _ in ps)
    for p in ps:
        p.join(timeout=60)
    for me, dt, status in res:
        verdict = "TIMEOUT" if status == 2 else "ok"
        print(f"rank {me}: {verdict}, {a.rounds} rounds in {dt * 1e3:.1f} ms, {dt / a.rounds * 1e6:.1f} us per round trip")


if __name__ == "__main__":
    main()
