"""Does loading a kernel's module in one process wait for another process's spinning kernel on
the same GPU? A probe for the e2e world-4 timeouts under CUDA MPS (docs/record.md, session 49):
a rank's first call loads new modules (Triton's and Inductor's kernels load at their first
launch) while its peers' first ironlink kernels already spin waiting for it. If the load waits
for every running kernel of the GPU (MPS runs every client's work in one server), the peers
spin until their timeout while it loads: each of that step's calls times out in turn.

Two processes on GPU 0 share a flag word (CUDA IPC through torch.multiprocessing). Process 0
launches a kernel that spins until the flag is set (bounded: about --spin-s seconds, then it
gives up: TIMEOUT). Process 1 then either
- "load first": launches a kernel it has compiled but never launched (its module loads now),
  then sets the flag; or
- "flag first": sets the flag, then makes the same first launch (the control);
- "alloc first" / "free first": in place of the first launch, a cudaMalloc of a new 1 GiB
  segment (torch.empty beyond the caching allocator's pool), or a cudaFree of one
  (torch.cuda.empty_cache after dropping it), the other calls a compiled step's first run makes.
Printed per order: how long process 1's first launch took, and whether process 0's spin ended
on the flag or timed out. A first launch that lasts as long as the spin, with TIMEOUT, in "load
first" only, says the module load waited for the other process's kernel.

    nvidia-cuda-mps-control -d; python3 bench/probes/module_load_probe.py; echo quit | nvidia-cuda-mps-control
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.multiprocessing as mp
import triton
import triton.language as tl


@triton.jit
def spin(flag, status, spin_limit):
    """Spins until flag[0] != 0 or spin_limit polls; status[0]: 1 the flag came, 2 timed out."""
    spins = 0
    while (tl.atomic_add(flag, 0, sem="acquire", scope="sys") == 0) & (spins < spin_limit):
        spins += 1
    tl.store(status, tl.where(spins < spin_limit, 1, 2))


@triton.jit
def set_flag(flag):
    tl.atomic_xchg(flag, 1, sem="release", scope="sys")


@triton.jit
def fresh(buf, SALT: tl.constexpr):
    """A kernel of its own module for each SALT: compiled ahead, loaded at its first launch."""
    tl.store(buf, tl.load(buf) + SALT)


def worker(me: int, order: str, q: mp.Queue, ready: mp.Queue, out: mp.Queue, spin_limit: int) -> None:
    torch.cuda.set_device(0)
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    if me == 0:
        flag = torch.zeros(1, dtype=torch.int32, device="cuda")
        spin[(1,)](status, status, 0)  # compiled and loaded: a spin of no polls
        torch.cuda.synchronize()
        q.put(flag)
        ready.get()  # the peer compiled its kernels: the spin starts only now
        t = time.perf_counter()
        spin[(1,)](flag, status, spin_limit)
        q.put("spinning")
        torch.cuda.synchronize()
        out.put((me, time.perf_counter() - t, int(status.item())))
        time.sleep(1.0)  # keep the flag's owner alive until the peer is done with it
        return
    flag = q.get()
    buf = torch.zeros(1, dtype=torch.int32, device="cuda")
    set_flag[(1,)](buf)  # compiled and loaded ahead
    salt = int(time.time() * 1000) % 1000003  # a module no run has loaded
    fresh.warmup(buf, SALT=salt, grid=(1,))  # compiled, not loaded
    torch.cuda.synchronize()
    ready.put("compiled")
    assert q.get() == "spinning"
    time.sleep(0.2)  # the spin has started
    first_launch = 0.0
    held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda") if order == "free first" else None
    for step in (("flag", "load") if order == "flag first" else ("load", "flag")):
        if step == "flag":
            set_flag[(1,)](flag)
        else:
            t = time.perf_counter()
            if order == "alloc first":
                held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
            elif order == "free first":
                held = None
                torch.cuda.empty_cache()
            else:
                fresh[(1,)](buf, SALT=salt)
            torch.cuda.synchronize()
            first_launch = time.perf_counter() - t
    torch.cuda.synchronize()
    del held  # the alloc case's segment lived until its flag was set
    out.put((me, first_launch, 0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spin-limit", type=int, default=20_000_000, help="polls before the spin gives up (about 4 s on an H200)")
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    for order in ("flag first", "load first", "alloc first", "free first"):
        q, ready, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
        ps = [ctx.Process(target=worker, args=(r, order, q, ready, out, a.spin_limit)) for r in range(2)]
        for p in ps:
            p.start()
        res = dict((me, (dt, status)) for me, dt, status in (out.get(timeout=600) for _ in ps))
        for p in ps:
            p.join(timeout=60)
        spin_s, status = res[0]
        verdict = {1: "ended on the flag", 2: "TIMEOUT"}.get(status, f"status {status}")
        what = {"alloc first": "cudaMalloc of 1 GiB", "free first": "cudaFree of 1 GiB"}.get(order, "first launch of a new module")
        print(f"{order}: process 1's {what} took {res[1][0] * 1e3:.1f} ms; "
              f"process 0's spin {verdict} after {spin_s * 1e3:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
