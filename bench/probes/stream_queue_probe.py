"""Does a stream's flag wait (`cuStreamWaitValue64`, ironlink's copy-engine side streams) hold up
work of another stream? A probe of the lead for the copy-engine stall under CUDA MPS
(docs/record.md, sessions 58 and 59): streams share the hardware work queues the driver gives a
context (CUDA_DEVICE_MAX_CONNECTIONS of them; under MPS the clients take theirs from one pool of
the server's), and work queued behind a wait in the same hardware queue cannot start, whatever
stream it came from.

Each client process makes `--waiters` streams of its own (cuStreamCreate, as `side_streams`
does) that each wait for a flag word in pinned host memory and then write a "done" word, and one
more stream, the main one, whose work ends the waits. Two orders (`--order`):
- waits-first: the waits are enqueued, then the main stream runs a kernel and writes the flag:
  the waits end only if the main stream's work is not queued behind one of them. The host polls
  the done words for `--stall-s`; on a stall it writes the flag itself (host memory: no GPU
  queue needed), so the probe always ends.
- kernel-first, ironlink's copy-engine order (`copy_engine.launch`): the main stream's kernel
  is launched first; it sets the flag and spins until every done word is written (or gives up
  after about `--stall-s`). The waits, enqueued after it, end only if a wait queued behind the
  running kernel is still dispatched (the queue moves on once the kernel has started, not once
  it has ended).
Printed per client: waiters, ok or STALLED, and the milliseconds.

    python3 bench/probes/stream_queue_probe.py                                   # one client
    CUDA_DEVICE_MAX_CONNECTIONS=1 python3 bench/probes/stream_queue_probe.py     # the control: one queue, stalls
    source tests/gpu/mps.sh; start_mps; python3 bench/probes/stream_queue_probe.py --clients 4; stop_mps
    python3 bench/probes/stream_queue_probe.py --order kernel-first              # and the same three ways

Waits-first (session 60, one H200): one client stalled from 8 waiting streams, with one
connection from 1, four MPS clients from 2. Kernel-first (session 61): no stall in any of the three
ways, up to 32 waiting streams (docs/record.md).

Needs the ironlink wheel (its native stream calls) and torch.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.multiprocessing as mp
import triton
import triton.language as tl


@triton.jit
def go_then_wait(flag, done, status, spin_limit, WAITERS: tl.constexpr):
    """Sets flag[0], then spins until every done word is set or spin_limit polls; status[0]: 1
    the words came, 2 it gave up."""
    tl.atomic_xchg(flag, 1, sem="release", scope="sys")
    words = tl.arange(0, WAITERS)
    spins = 0
    while (tl.sum(tl.load(done + words, volatile=True)) < WAITERS) & (spins < spin_limit):
        spins += 1
    tl.store(status, tl.where(spins < spin_limit, 1, 2))


def polls_per_second() -> int:
    """How many polls of go_then_wait take about a second on this GPU (a run that gives up)."""
    flag = torch.zeros(1, dtype=torch.int64, pin_memory=True)  # host words, as the probe's
    done = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    go_then_wait[(1,)](flag, done, status, 1000, WAITERS=1)  # compiled and loaded
    torch.cuda.synchronize()
    start = time.perf_counter()
    go_then_wait[(1,)](flag, done, status, 200_000, WAITERS=1)
    torch.cuda.synchronize()
    return max(1, int(200_000 / (time.perf_counter() - start)))


def client(me: int, waiters: int, stall_s: float, order: str, start: mp.Barrier, out: mp.Queue) -> None:
    if order == "kernel-first":
        kernel_first(me, waiters, stall_s, start, out)
        return
    from ironlink.runtime.native import load_native

    native = load_native()
    torch.cuda.set_device(0)
    dev = torch.cuda.current_device()
    # Pinned host words: the GPU reaches them through UVA, and the host can write the flag
    # directly to end a stall.
    flag = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    done = torch.zeros(waiters, dtype=torch.int64, pin_memory=True)
    waiting = [native.stream_create(dev) for _ in range(waiters)]
    setter = torch.cuda.ExternalStream(native.stream_create(dev), device=dev)
    x = torch.zeros(1 << 20, device="cuda")
    x.add_(1)  # the kernel's module loaded before the clock starts
    torch.cuda.synchronize()
    start.wait()
    t = time.perf_counter()
    for i, s in enumerate(waiting):
        native.stream_wait_u64(dev, s, flag.data_ptr(), 1)
        native.stream_write_u64(dev, s, done.data_ptr() + 8 * i, 1)
    with torch.cuda.stream(setter):
        x.add_(1)  # a kernel on the stream the waits depend on
    native.stream_write_u64(dev, setter.cuda_stream, flag.data_ptr(), 1)
    while int(done.sum()) < waiters and time.perf_counter() - t < stall_s:
        time.sleep(1e-4)
    ms = (time.perf_counter() - t) * 1e3
    stalled = int(done.sum()) < waiters
    if stalled:
        flag[0] = 1  # ends the waits from the host
    torch.cuda.synchronize()
    out.put((me, waiters, "STALLED" if stalled else "ok", ms))


def kernel_first(me: int, waiters: int, stall_s: float, start: mp.Barrier, out: mp.Queue) -> None:
    """The kernel-first order (module docs)."""
    from ironlink.runtime.native import load_native

    native = load_native()
    torch.cuda.set_device(0)
    dev = torch.cuda.current_device()
    flag = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    done = torch.zeros(waiters, dtype=torch.int64, pin_memory=True)
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    waiting = [native.stream_create(dev) for _ in range(waiters)]
    main = torch.cuda.ExternalStream(native.stream_create(dev), device=dev)
    limit = int(stall_s * polls_per_second())
    torch.cuda.synchronize()
    start.wait()
    t = time.perf_counter()
    with torch.cuda.stream(main):
        go_then_wait[(1,)](flag, done, status, limit, WAITERS=waiters)
    for i, s in enumerate(waiting):
        native.stream_wait_u64(dev, s, flag.data_ptr(), 1)
        native.stream_write_u64(dev, s, done.data_ptr() + 8 * i, 1)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t) * 1e3
    out.put((me, waiters, "ok" if int(status.item()) == 1 else "STALLED", ms))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=1, help="processes on GPU 0 at once (under MPS: its clients)")
    ap.add_argument("--waiters", default="1,2,4,8,16,32", help="waiting streams a client, comma-separated")
    ap.add_argument("--stall-s", type=float, default=2.0)
    ap.add_argument("--order", choices=("waits-first", "kernel-first"), default="waits-first")
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    for waiters in (int(w) for w in a.waiters.split(",")):
        start, out = ctx.Barrier(a.clients), ctx.Queue()
        ps = [ctx.Process(target=client, args=(r, waiters, a.stall_s, a.order, start, out)) for r in range(a.clients)]
        for p in ps:
            p.start()
        rows = sorted(out.get(timeout=300) for _ in ps)
        for p in ps:
            p.join(timeout=60)
        for me, w, verdict, ms in rows:
            print(f"{a.order}: client {me}: {w} waiting streams: {verdict} in {ms:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
