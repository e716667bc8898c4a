"""A rank SIGKILLed during an all-reduce: the others get TIMEOUT within the bound, nothing stays on
the GPUs, and a new process group and heap on the same GPUs work.

    python3 tests/gpu/workers/killed_rank.py --world 4          # tests/gpu/run.sh killed-rank

Not under torchrun: its agent kills every worker when one dies, which is what must not decide
the outcome here. This parent starts one process per GPU itself (a FileStore rendezvous and
ironlink.init_distributed), for a large (256 MiB bf16) and a small (2 KiB) all-reduce:

1. every rank makes a heap (wait timeout --timeout-s), runs one all-reduce correctly, meets the
   others at a barrier, then launches the same all-reduce twice (check=True on each); the victim
   (the last rank) launches the first one and SIGKILLs itself at once, so it dies with its part
   of the call in flight (or just done: then the survivors' second call is the one it misses);
2. each survivor must raise IronlinkError with status TIMEOUT within 2 x timeout + --slack-s
   (one of its two calls waits for the dead rank), then `heap.check()` must raise, then it exits
   without a collective close (the dead rank would never join one); where ranks share GPUs
   (more ranks than GPUs, under MPS), a survivor on the victim's GPU may instead raise the CUDA
   error that MPS puts in every client's context of that GPU, within the same bound;
3. every process must be gone within --exit-s, and nvidia-smi must list none of their pids;
4. a fresh launch (new store, new process group, new heap, same GPUs) all-reduces correctly.
Prints one line per phase and `killed-rank: ... passed` / `FAILED`; writes $OUT/killed-rank.json
and each process's output to $OUT/killed-rank-processes.log;
exit status non-zero on failure. Without 2 GPUs it prints "killed-rank: skipped: no GPU", unless
$IRONLINK_SHARED_GPU=1 lets the ranks share one (tests/gpu/run.sh --shared-gpu, under MPS).
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
from typing import Any, Optional

SIZES = {"large": 128 << 20, "small": 1024}  # bf16 elements: 256 MiB and 2 KiB
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python")  # the ironlink package
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# --- the worker: one rank ---------------------------------------------------------------------------


def worker(role: str, size: str, rank: int, world: int, store: str, timeout_s: float) -> None:
    """role: "victim", "survivor" or "fresh". Prints one `RESULT {json}` line (survivors, fresh)."""
    import torch
    import torch.distributed as dist

    import ironlink
    from ironlink.language import _abi

    ironlink.init_distributed(local_rank=rank, store=dist.FileStore(store, world), rank=rank, world_size=world)
    n = SIZES[size]
    heap = ironlink.SymmetricHeap(n * 2 + (1 << 20), timeout_s=timeout_s)
    x = heap.empty((n,), torch.bfloat16)
    x.fill_(float(rank + 1))
    ironlink.all_reduce(x, heap=heap, check=True)  # compiles, and proves the heap works
    want = float(world * (world + 1) // 2)
    assert bool((x == want).all()), f"rank {rank}: the first all-reduce is wrong"
    if role == "fresh":
        heap.close()
        dist.destroy_process_group()
        print("RESULT " + json.dumps({"rank": rank, "ok": True}), flush=True)
        return
    heap.barrier()
    if role == "victim":
        ironlink.all_reduce(x)
        os.kill(os.getpid(), signal.SIGKILL)  # with the call in flight
    t0 = time.time()
    result: dict[str, Any] = {"rank": rank, "size": size, "device": torch.cuda.current_device()}
    try:
        for call in (1, 2):
            ironlink.all_reduce(x, check=True)
            result[f"call{call}"] = "ok"
        result["error"] = "no TIMEOUT: both all-reduces completed without the dead rank"
    except ironlink.IronlinkError as e:
        result.update(status=e.status, function=e.function, message=str(e), seconds=round(time.time() - t0, 3))
        result["timeout"] = e.status == _abi.STATUS["TIMEOUT"]
    try:
        heap.check()
        result["check_raised"] = False
    except ironlink.IronlinkError as e:
        result["check_raised"], result["check_message"] = True, str(e)
    print("RESULT " + json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no collective close or NCCL teardown: the dead rank would never join them


# --- the parent -----------------------------------------------------------------------------------


def launch(roles: list[str], size: str, timeout_s: float, exit_s: float, log: Any) -> tuple[list[dict[str, Any]], list[int], list[int]]:
    """Runs one process per role (rank = index); returns (RESULT records, exit codes, pids)."""
    store = os.path.join(tempfile.mkdtemp(prefix="ironlink-killed-rank-"), "store")
    env = dict(os.environ, **SAFE_ENV, LOCAL_WORLD_SIZE=str(len(roles)))  # ranks per GPU, where they share
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_DIR, env.get("PYTHONPATH")]))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", role, size, str(rank), str(len(roles)), store,
                               str(timeout_s)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for rank, role in enumerate(roles)]
    deadline = time.time() + exit_s
    results, codes = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()  # one of ours, by its pid
            out, _ = p.communicate()
            out += f"\n[parent] pid {p.pid} did not exit within {exit_s} s: killed\n"
        log.write(f"--- pid {p.pid} ({roles[procs.index(p)]}), exit {p.returncode}\n{out}\n")
        codes.append(p.returncode)
        results += [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    return results, codes, [p.pid for p in procs]


def gpu_count() -> int:
    """GPUs nvidia-smi lists (0 without it); the parent itself never touches CUDA."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    try:
        import torch  # noqa: F401 - the workers need it
    except ImportError:
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def gpu_pids() -> set[int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60).stdout
    return {int(w) for w in out.split() if w.isdigit()}


def left_on_gpus(pids: list[int], wait_s: float = 15.0) -> set[int]:
    """Our pids that nvidia-smi still lists after up to `wait_s` (the driver tears down contexts late)."""
    end = time.time() + wait_s
    while True:
        left = gpu_pids() & set(pids)
        if not left or time.time() > end:
            return left
        time.sleep(0.5)


def gpu_mate_fault(r: dict[str, Any], victim_gpu: Optional[int]) -> bool:
    """Whether survivor record `r` is the CUDA error that MPS gives a rank sharing the dead rank's
    GPU (docs/reliability.md: the victim dies with its all-reduce in flight, and MPS reports that
    fault to every client of its GPU; nothing the survivor did). `victim_gpu`: None
    where every rank has a GPU of its own, and then no survivor is excused."""
    return (victim_gpu is not None and r.get("device") == victim_gpu and r.get("status") is None
            and "CUDA driver call" in str(r.get("message")))


def scenario(size: str, world: int, victim_gpu: Optional[int], args: argparse.Namespace, log: Any) -> dict[str, Any]:
    bound = 2 * args.timeout_s + args.slack_s
    roles = ["survivor"] * (world - 1) + ["victim"]
    results, codes, pids = launch(roles, size, args.timeout_s, args.exit_s, log)
    problems = []
    if codes[-1] != -signal.SIGKILL:
        problems.append(f"the victim exited with {codes[-1]}, not SIGKILL")
    if any(c != 0 for c in codes[:-1]):
        problems.append(f"survivors' exit codes {codes[:-1]}")
    if len(results) != world - 1:
        problems.append(f"{len(results)} of {world - 1} survivors reported")
    for r in results:
        r["gpu_mate_fault"] = gpu_mate_fault(r, victim_gpu)
        if r["gpu_mate_fault"]:
            if r["seconds"] > bound:
                problems.append(f"rank {r['rank']}: its CUDA error after {r['seconds']} s > bound {bound} s")
            continue
        if not r.get("timeout"):
            problems.append(f"rank {r['rank']}: no TIMEOUT ({r.get('error') or r.get('message')})")
        elif r["seconds"] > bound:
            problems.append(f"rank {r['rank']}: TIMEOUT after {r['seconds']} s > bound {bound} s")
        if not r.get("check_raised"):
            problems.append(f"rank {r['rank']}: heap.check() did not raise")
    left = left_on_gpus(pids)
    if left:
        problems.append(f"nvidia-smi still lists pids {sorted(left)}")
    fresh, fresh_codes, fresh_pids = launch(["fresh"] * world, size, args.timeout_s, args.exit_s, log)
    if fresh_codes != [0] * world or len(fresh) != world:
        problems.append(f"the fresh group failed: exit codes {fresh_codes}")
    if left_on_gpus(fresh_pids):
        problems.append("the fresh group's processes stayed on the GPUs")
    print(f"killed-rank {size}: {survivors_line(results, bound)}, GPUs {'busy' if left else 'free'}, "
          f"fresh group {'OK' if fresh_codes == [0] * world else 'FAILED'}"
          + (f"; problems: {problems}" if problems else ""), flush=True)
    return {"size": size, "bound_s": bound, "survivors": results, "exit_codes": codes, "left_on_gpus": sorted(left),
            "fresh_exit_codes": fresh_codes, "timeout_exercised": timeout_exercised(results), "problems": problems}


def timeout_exercised(results: list[dict[str, Any]]) -> bool:
    """Whether a survivor had to end in TIMEOUT: one not on the victim's GPU. With every rank on one
    GPU under MPS, all survivors end in its CUDA error instead, and the TIMEOUT path goes unproven."""
    return any(not r["gpu_mate_fault"] for r in results)


def survivors_line(results: list[dict[str, Any]], bound: float) -> str:
    """How the survivors ended, for the scenario's line: TIMEOUT (the ranks and seconds), the CUDA
    error of the victim's GPU-mates, or that no survivor could show the TIMEOUT path."""
    timed = [r for r in results if not r["gpu_mate_fault"]]
    mates = [r for r in results if r["gpu_mate_fault"]]
    parts = []
    if timed:
        parts.append(f"TIMEOUT on ranks {[r['rank'] for r in timed]} after {[r.get('seconds') for r in timed]} s "
                     f"(bound {bound} s)")
    if mates:
        parts.append(f"ranks {[r['rank'] for r in mates]}, on the victim's GPU under MPS: its CUDA error after "
                     f"{[r.get('seconds') for r in mates]} s")
    if not timed:
        parts.append("no survivor on another GPU, so the TIMEOUT path was not exercised (run on 2 GPUs or more)")
    return "; ".join(parts)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        role, size, rank, world, store, timeout_s = sys.argv[2:8]
        worker(role, size, int(rank), int(world), store, float(timeout_s))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--timeout-s", type=float, default=2.0, help="the heaps' wait timeout")
    p.add_argument("--slack-s", type=float, default=3.0, help="allowed beyond 2 x timeout for the TIMEOUT to raise")
    p.add_argument("--exit-s", type=float, default=180.0, help="how long a launch may take before its processes are killed")
    p.add_argument("--json", default=os.path.join(os.environ.get("OUT", "build/gpu-out"), "killed-rank.json"))
    args = p.parse_args()
    ngpu, shared = gpu_count(), False
    if ngpu >= 1:  # torch is there (gpu_count): so is what ironlink needs
        sys.path.insert(0, PACKAGE_DIR)
        from ironlink.runtime.distributed import shared_gpu_allowed  # no CUDA: the parent never touches the GPUs

        shared = shared_gpu_allowed()
    if (ngpu < 2 and not (shared and ngpu >= 1)) or args.world < 2:
        print(f"killed-rank: skipped: no GPU (needs 2, found {ngpu})", flush=True)
        return 0
    world = args.world if shared else min(args.world, ngpu)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    # The processes' own output, beside the JSON; not killed-rank.log, which tests/gpu/run.sh
    # makes of this script's stdout (two writers of one file overwrite each other's lines).
    with open(os.path.splitext(args.json)[0] + "-processes.log", "w") as log:
        victim_gpu = (world - 1) % ngpu if world > ngpu else None  # ranks share GPUs: rank r on GPU r % GPUs
        runs = [scenario(size, world, victim_gpu, args, log) for size in SIZES]
    failed = [f"{r['size']}: {q}" for r in runs for q in r["problems"]]
    with open(args.json, "w") as f:
        json.dump({"world": world, "timeout_s": args.timeout_s, "runs": runs, "failed": failed}, f, indent=1)
    unproven = ("" if all(r["timeout_exercised"] for r in runs)
                else " (the TIMEOUT path not exercised: every survivor shared the victim's GPU)")
    print(f"killed-rank world {world}: {'passed' + unproven if not failed else 'FAILED: ' + '; '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
