"""Does a stream's flag wait (`cuStreamWaitValue64`, ironlink's copy-engine side streams) hold up
work of another stream? A probe of the lead for the copy-engine stall under CUDA MPS
(docs/record.md, sessions 58 and 59): streams share the hardware work queues the driver gives a
context (CUDA_DEVICE_MAX_CONNECTIONS of them; under MPS the clients take theirs from one pool of
the server's), and work queued behind a wait in the same hardware queue cannot start, whatever
stream it came from.

Each client process makes `--waiters` streams of its own (cuStreamCreate, as `side_streams`
does) that each wait for a flag word in pinned host memory and then write a "done" word, and one
more stream that runs a kernel and then writes the flag: the waits end only if that stream's work
is not queued behind one of them. The host polls the done words for `--stall-s`; on a stall it
writes the flag itself (host memory: no GPU queue needed), so the probe always ends. Printed per
client: waiters, ok or STALLED, and the milliseconds.

    python3 bench/probes/stream_queue_probe.py                                   # one client
    CUDA_DEVICE_MAX_CONNECTIONS=1 python3 bench/probes/stream_queue_probe.py     # the control: one queue, stalls
    source tests/gpu/mps.sh; start_mps; python3 bench/probes/stream_queue_probe.py --clients 4; stop_mps

Needs the ironlink wheel (its native stream calls) and torch.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.multiprocessing as mp


def client(me: int, waiters: int, stall_s: float, start: mp.Barrier, out: mp.Queue) -> None:
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=1, help="processes on GPU 0 at once (under MPS: its clients)")
    ap.add_argument("--waiters", default="1,2,4,8,16,32", help="waiting streams a client, comma-separated")
    ap.add_argument("--stall-s", type=float, default=2.0)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    for waiters in (int(w) for w in a.waiters.split(",")):
        start, out = ctx.Barrier(a.clients), ctx.Queue()
        ps = [ctx.Process(target=client, args=(r, waiters, a.stall_s, start, out)) for r in range(a.clients)]
        for p in ps:
            p.start()
        rows = sorted(out.get(timeout=300) for _ in ps)
        for p in ps:
            p.join(timeout=60)
        for me, w, verdict, ms in rows:
            print(f"client {me}: {w} waiting streams: {verdict} in {ms:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
