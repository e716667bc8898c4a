"""Does confining MPS clients (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, tests/gpu/mps.sh `mps_confine`)
keep each client's grid resident at once when GPU-mates run theirs at the same time? ironlink's
`sm_share` needs it: a rank that shares a GPU launches grids whose CTAs wait for each other and
for peers' CTAs, and a CTA that finds no SM makes them time out. NVIDIA's MPS documentation
says the percentage is a limit, not a reservation (kernels of different clients may run on the
same SM).

Each client process (all on GPU 0) launches, at the same moment (a barrier), one kernel of
`--grid` CTAs (default: the SMs the GPU reports to it) of `--warps` warps, each holding
`--heavy` fp32 values in registers (65536 at 16 warps: 128 registers a thread, one CTA an SM, as
ironlink's fused kernels); each CTA records its SM (%smid) and spins `--hold-ms` on the global
timer, then records when it started and ended. Printed per client: the SMs the GPU reports, the
distinct SMs its CTAs ran on, whether they all started at once (within START_SLACK_MS of the
first), and when its grid ran against the other clients'; then the SMs that CTAs of more than
one client ran on. Under confinement %smid is virtual: every client's CTAs report SMs 0-31.

Session 62 (2 H200s, 4 clients at 25 %, 32 SMs reported; docs/record.md): light grids of 32
CTAs all start at once; heavy grids of 16 or 24 did 3 times of 3, of 28 or 32 one client's
CTAs waited 200 ms for an SM every time. Hence `SHARED_GPU_SM_DIVISOR`.

    bench/probes/mps_sm_sets_probe.sh 4     # 4 clients, confined then not: light and heavy CTAs
    source tests/gpu/mps.sh; start_mps; mps_confine 4
    python3 bench/probes/mps_sm_sets_probe.py --clients 4 --warps 16 --heavy 65536 --grid 24
    stop_mps

Needs torch and triton (not the ironlink wheel).
"""

from __future__ import annotations

import argparse

import torch
import torch.multiprocessing as mp
import triton
import triton.language as tl
from triton.language.extra.cuda import utils as tl_cuda


# CTAs of one launch start within microseconds of each other when the GPU has room for them all;
# one that waited for an SM starts when some CTA (of this client or another) ended, at least
# --hold-ms later, or up to that much later where the others' CTAs had begun before it.
START_SLACK_MS = 1.0


@triton.jit
def hold(out, hold_ns, zeros, HEAVY: tl.constexpr):
    """out[3 pid .. 3 pid + 2]: this CTA's SM, and the global timer when it started and ended.
    HEAVY > 0: the CTA also holds HEAVY fp32 zeros (`zeros`) in registers across the spin, so it
    needs as many registers as ironlink's heaviest fused kernels (one CTA an SM at 16 warps)."""
    if HEAVY > 0:
        held = tl.load(zeros + tl.arange(0, HEAVY))
    start = tl_cuda.globaltimer()
    now = start
    while now - start < hold_ns:
        now = tl_cuda.globaltimer()
    base = out + tl.program_id(0) * 3
    sm = tl_cuda.smid().to(tl.int64)
    if HEAVY > 0:
        sm += tl.sum(held * (now - start).to(tl.float32)).to(tl.int64)  # zero; keeps `held` live
    tl.store(base, sm)
    tl.store(base + 1, start)
    tl.store(base + 2, now)


def client(me: int, grid: int, warps: int, heavy: int, hold_ms: float, start: mp.Barrier, out: mp.Queue) -> None:
    torch.cuda.set_device(0)
    reported = torch.cuda.get_device_properties(0).multi_processor_count
    grid = grid or reported
    rec = torch.zeros(grid * 3, dtype=torch.int64, device="cuda")
    zeros = torch.zeros(max(heavy, 1), dtype=torch.float32, device="cuda")
    k = hold[(grid,)](rec, 1000, zeros, HEAVY=heavy, num_warps=warps)  # compiled and loaded before the barrier
    torch.cuda.synchronize()
    start.wait()
    hold[(grid,)](rec, int(hold_ms * 1e6), zeros, HEAVY=heavy, num_warps=warps)
    torch.cuda.synchronize()
    r = rec.view(grid, 3).cpu()
    regs = f"{k.n_regs} registers a thread, {k.n_spills} spilled"
    out.put((me, reported, grid, regs, r[:, 0].tolist(), r[:, 1].tolist(), r[:, 2].tolist()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=4, help="processes on GPU 0 at once (under MPS: its clients)")
    ap.add_argument("--grid", type=int, default=0, help="CTAs a client (0: the SMs the GPU reports to it)")
    ap.add_argument("--warps", type=int, default=16)
    ap.add_argument("--heavy", type=int, default=0,
                    help="fp32 values a CTA holds in registers (a power of two; 0: none). 65536 at 16 warps: "
                         "128 a thread, the register file of an SM for one CTA")
    ap.add_argument("--hold-ms", type=float, default=200.0)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(a.clients), ctx.Queue()
    ps = [ctx.Process(target=client, args=(c, a.grid, a.warps, a.heavy, a.hold_ms, start, out)) for c in range(a.clients)]
    for p in ps:
        p.start()
    rows = sorted(out.get(timeout=300) for _ in ps)
    for p in ps:
        p.join(timeout=60)
    clients_on: dict[int, set[int]] = {}
    t0 = min(min(r[5]) for r in rows)
    for me, reported, grid, regs, sms, starts, ends in rows:
        spread_ms = (max(starts) - min(starts)) / 1e6
        resident = spread_ms < START_SLACK_MS  # a CTA that waited for an SM started later
        print(f"client {me}: reports {reported} SMs; {grid} CTAs x {a.warps} warps ({regs}) on {len(set(sms))} SMs; "
              f"all started at once: {'yes' if resident else 'NO'} (starts {spread_ms:.1f} ms apart, "
              f"hold {a.hold_ms:.0f} ms); ran {(min(starts) - t0) / 1e6:.1f} .. {(max(ends) - t0) / 1e6:.1f} ms "
              f"after the first client's start", flush=True)
        for sm in set(sms):
            clients_on.setdefault(sm, set()).add(me)
    shared = sorted(sm for sm, cs in clients_on.items() if len(cs) > 1)
    print(f"SMs used: {len(clients_on)}; used by more than one client: {len(shared)} {shared}", flush=True)
    together = max(min(r[5]) for r in rows) < min(max(r[6]) for r in rows)
    print(f"all clients' grids resident at the same moment: {'yes' if together else 'no'}", flush=True)


if __name__ == "__main__":
    main()
