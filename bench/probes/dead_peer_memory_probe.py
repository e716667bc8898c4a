"""What a rank can still touch after a peer process died: its own memory, and the dead peer's heap.

Session 55's killed-rank run at world 4 with two ranks on each of two H200s (`--shared-gpu`,
CUDA MPS) gave TIMEOUT on the two ranks of the other GPU but CUDA_ERROR_ILLEGAL_ADDRESS on the
victim's GPU-mate, which had launched nothing since the kill (its call comparison runs on the
host): the fault reached its context from the GPU's MPS server. This probe tells whether a
GPU-mate's death always does that or only with work in flight, and whether the dead peer's heap
can still be read (CUDA IPC keeps an exporter's memory for its importers on other GPUs); its
answer (2 H200s, session 56: only a death with a kernel in flight, any kernel; the heap stays
readable) is in docs/reliability.md. Two
ranks, a FileStore rendezvous (not torchrun: its agent would kill the survivor), one fresh pair
per case:

  idle     the victim finishes its GPU work, then SIGKILLs itself
  busy     the victim launches a ~1 s spin kernel (torch.cuda._sleep), then SIGKILLs itself
  in_call  the victim launches an all-reduce the survivor never joins (it waits on the survivor,
           as killed-rank's victim does), then SIGKILLs itself

After --settle-s the survivor runs, in order (the first CUDA error ends its context, so each
step after one reports "not run"):
  own        a kernel on its own heap tensor, synchronized
  peer_read  a read of the dead rank's copy of that tensor (heap.peer_tensor), synchronized
  own_again  the own-memory kernel again

"own" failing after "idle" means any GPU-mate's death poisons the survivors' contexts under MPS;
failing only after "busy" or "in_call", that only a death with work in flight (or with a
kernel touching peers in flight) does. On two GPUs (no MPS)
"own" should pass in both cases; "peer_read" says whether the dead rank's heap stays readable.

    python3 bench/probes/dead_peer_memory_probe.py                  # ranks on GPUs 0 and 1
    bash bench/probes/dead_peer_memory_probe.sh                     # both on GPU 0 under MPS, then apart

Prints one JSON line per case and writes them to $OUT/dead-peer-memory-<placement>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CASES = ("idle", "busy", "in_call")
STEPS = ("own", "peer_read", "own_again")
ELEMENTS = 1 << 20  # fp32: 4 MiB, past any cache line the survivor might still hold


def survivor_steps(torch: Any, heap: Any, x: Any) -> dict[str, str]:
    """Runs STEPS in order; each "ok", the error's text, or "not run" after an error."""
    steps: dict[str, str] = {}
    actions = {
        "own": lambda: x.add_(1.0),
        "peer_read": lambda: heap.peer_tensor(x, 1).sum(),
        "own_again": lambda: x.add_(1.0),
    }
    failed = False
    for name in STEPS:
        if failed:
            steps[name] = "not run"
            continue
        try:
            actions[name]()
            torch.cuda.synchronize()
            steps[name] = "ok"
        except Exception as e:  # noqa: BLE001 - any CUDA error is the answer
            steps[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            failed = True
    return steps


def worker(case: str, rank: int, store: str, settle_s: float) -> None:
    import torch
    import torch.distributed as dist

    import ironlink

    shared = os.environ.get("IRONLINK_SHARED_GPU") == "1"
    local = 2 * rank if shared else rank  # shared: GPU (2 * rank) % GPUs, 0 for both on 1 or 2 GPUs
    ironlink.init_distributed(local_rank=local, store=dist.FileStore(store, 2), rank=rank, world_size=2)
    heap = ironlink.SymmetricHeap(ELEMENTS * 4 + (1 << 20), timeout_s=2.0)
    x = heap.empty((ELEMENTS,), torch.float32)
    x.fill_(float(rank + 1))
    ironlink.all_reduce(x, heap=heap)  # the peers' memory is mapped and works
    assert bool((x == 3.0).all()), f"rank {rank}: the first all-reduce is wrong"
    heap.barrier()
    if rank == 1:  # the victim
        if case == "busy":
            torch.cuda._sleep(2_000_000_000)  # ~1 s of clock cycles, in flight when it dies
        elif case == "in_call":
            ironlink.all_reduce(x, heap=heap)  # spins on the survivor's arrival when it dies
        else:
            torch.cuda.synchronize()
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(settle_s)  # the victim is dead and its client torn down by now
    result = {"case": case, "device": torch.cuda.current_device(), "steps": survivor_steps(torch, heap, x)}
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # no collective close: the dead rank would never join it


def run_case(case: str, settle_s: float, limit_s: float) -> dict[str, Any]:
    store = os.path.join(tempfile.mkdtemp(prefix="ironlink-dead-peer-"), "store")
    env = dict(os.environ, **SAFE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_DIR, env.get("PYTHONPATH")]))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", case, str(rank), store, str(settle_s)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for rank in range(2)]
    outs, codes = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0] + f"\n[parent] pid {p.pid} killed after {limit_s} s\n"
        outs.append(out)
        codes.append(p.returncode)
    found = [json.loads(line[7:]) for line in outs[0].splitlines() if line.startswith("RESULT ")]
    record: dict[str, Any] = found[0] if found else {"case": case, "steps": {}, "survivor_output": outs[0][-2000:]}
    record["exit_codes"] = codes
    return record


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        case, rank, store, settle_s = sys.argv[2:6]
        worker(case, int(rank), store, float(settle_s))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--settle-s", type=float, default=4.0, help="the survivor's wait after the barrier")
    p.add_argument("--limit-s", type=float, default=120.0, help="per process, before it is killed")
    args = p.parse_args()
    shared = os.environ.get("IRONLINK_SHARED_GPU") == "1"
    placement = "one-gpu-mps" if shared else "two-gpus"
    records = []
    for case in CASES:
        r = dict(run_case(case, args.settle_s, args.limit_s), placement=placement)
        print(json.dumps(r), flush=True)
        records.append(r)
    out = os.environ.get("OUT", "build/gpu-out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"dead-peer-memory-{placement}.json"), "w") as f:
        json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
