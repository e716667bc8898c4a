"""Shared by the torchrun GPU workers: run named cases, count a case as passed only when it
passed on every rank, and keep going after a failure so one run reports everything.
$IRONLINK_GPU_ONLY (substrings of case names, separated by "|") runs only the matching cases,
$IRONLINK_GPU_SKIP (the same) all but those (`tests/gpu/run.sh --only`, `--skip`).
$IRONLINK_GPU_SMALL=1 (`tests/gpu/run.sh sanitize`) makes the workers run a short list of small cases (`small(...)`):
every collective, primitive, fused op and MoE op still runs, at sizes that compute-sanitizer
finishes in minutes. $IRONLINK_GPU_HEAP_TIMEOUT_S sets the wait timeout of the workers' heaps (a
sanitized peer runs many times slower). Rank 0 prints each case's name as it starts ("case ...:
started"), so the log names a case that never ends; $IRONLINK_GPU_VERBOSE=1 also prints its
seconds as it ends (to find a slow case). A worker stopped by SIGTERM (a time limit) prints every
thread's stack first: appended to $IRONLINK_GPU_STACKS_DIR/rank<R>.txt under a line naming the
worker, where that is set (tests/gpu/run.sh sets it to $OUT/stacks; eight ranks' stacks
interleaved on one stream cannot be read), else to stderr; with $IRONLINK_GPU_VERBOSE=1 also once a
minute while a case lasts. A case's pass/fail vote runs on the CPU (gloo), and a check that needs
every rank (`same_on_all_ranks`) first votes with the peers (`peers_still_in`), so a rank never
waits in a collective that a peer which failed the case will not join.
Compiling ahead (`ironlink.runtime.compile_ahead`): where $IRONLINK_GPU_COMPILE_AHEAD names a
folder with this worker's record for its world (`record_name`), the ranks first compile the
recorded kernels of the cases they will run, each rank a share over worker processes, into the
Triton cache the launches read; where $IRONLINK_GPU_COMPILE_RECORD names a folder, rank 0 writes
there what every rank compiled, each kernel under the case that first launched it."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist

from ironlink.runtime import compile_ahead, compile_records
from ironlink.runtime.distributed import shared_gpu_allowed


T = TypeVar("T")
SMALL = os.environ.get("IRONLINK_GPU_SMALL", "0") == "1"
VERBOSE = os.environ.get("IRONLINK_GPU_VERBOSE", "0") == "1"


def _stacks_file() -> Any:
    """Where this worker's stacks go at SIGTERM (module docs). faulthandler writes to the file's
    descriptor when the signal comes, so the file stays open for the worker's life."""
    where = os.environ.get("IRONLINK_GPU_STACKS_DIR")
    if not where:
        return sys.stderr
    os.makedirs(where, exist_ok=True)
    f = open(os.path.join(where, f"rank{os.environ.get('RANK', '0')}.txt"), "a")  # noqa: SIM115
    f.write(f"# {time.strftime('%H:%M:%S')} {os.path.basename(sys.argv[0])} (pid {os.getpid()}): "
            "started; its stacks at SIGTERM follow, if it got one\n")
    f.flush()
    return f


# A worker stopped from outside (run.sh's time limit makes torchrun send SIGTERM) prints every
# thread's Python stack first: where a stuck rank was.
STACKS = _stacks_file()
faulthandler.register(signal.SIGTERM, file=STACKS, all_threads=True, chain=True)
# With $IRONLINK_GPU_VERBOSE=1 a case that lasts longer than this also prints every thread's
# stack there, once a STUCK_DUMP_S while it lasts: where each rank was (compiling, waiting on the
# GPU, in a collective of torch.distributed) while a peer's wait ran out.
STUCK_DUMP_S = 60


def small(full: Sequence[T], few: Sequence[T]) -> Sequence[T]:
    """`few` in small-case mode, else `full`."""
    return few if SMALL else full


# Back-to-back replays in small-case mode: every rotation of the ops' slots (halves: 2, lamport
# buffers: 3) comes round more than once. A sanitizer checks each launch alone, so the thousands of
# the full cases add time there, not coverage (racecheck at world 4 on one H200, 2026-12-01: 68 s
# for 500 replays of a 32-token all_reduce_rmsnorm; 132 s for 12 of a 2048-token two_shot one).
SMALL_REPLAYS = 6


def replays(full: int) -> int:
    """The replay count of a back-to-back case: `full`, or at most SMALL_REPLAYS in small-case mode."""
    return min(full, SMALL_REPLAYS) if SMALL else full


def close_to(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "result") -> None:
    """Asserts `got` is within the dtype's tolerance of the float64 reference `ref`, relative to
    its largest magnitude (bf16 2e-2, else 4e-3)."""
    err = ((got.double() - ref).abs() / (ref.abs().amax() + 1e-30)).amax().item()
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol}"


class PeerFailed(AssertionError):
    """A peer failed the running case before a check that needs every rank (`peers_still_in`)."""


# The CPU (gloo) group of the running case's vote (`Cases.run`), None outside a case.
_vote_group: Optional[Any] = None


def peers_still_in() -> None:
    """Called before a check that needs every rank (an NCCL collective): one vote with the peers
    on the CPU. A peer that failed the case went straight to the case's final vote, which
    meets this one, so this rank raises `PeerFailed` instead of waiting in a collective that
    peer never joins (it would wait for NCCL's 10 min timeout: a hang to a bounded run)."""
    if _vote_group is None:
        return
    flag = torch.tensor([1])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=_vote_group)
    if not flag.item():
        raise PeerFailed("a peer failed this case before this check")


def same_on_all_ranks(t: torch.Tensor, what: str = "result") -> None:
    """Asserts `t` (named `what` in the message) is bitwise the same on every rank (gathered to
    every rank, compared there)."""
    peers_still_in()
    b = t.contiguous().view(torch.uint8).flatten()
    gathered = [torch.empty_like(b) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, b)
    for r, g in enumerate(gathered):
        assert torch.equal(g, b), f"rank {r}'s {what} differs bitwise from this rank's"


def lamport_slots_empty(heap: Any, name: str, dtypes: Sequence[torch.dtype]) -> None:
    """Asserts that every lamport slot of op `name` (each of its workspaces for these dtypes,
    `ironlink.runtime.workspaces.lamport_workspace_name`) holds -0.0: the invariant between calls (each
    call empties what it read), without which a later call could take a stale row for a new one."""
    from ironlink.runtime.workspaces import lamport_bits, lamport_workspace_name

    torch.cuda.synchronize()
    for dtype in dtypes:
        ws_name = lamport_workspace_name(name, dtype)
        for ws in heap._workspaces.get(ws_name, []):
            v = lamport_bits(ws.view(dtype))
            full = int((v != torch.iinfo(v.dtype).min).sum())
            assert full == 0, f"{ws_name}: {full} of {v.numel()} slots not empty after the calls"


def moe_routing(g: torch.Generator, tokens: int, hidden: int, experts: int, k: int,
                skewed: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x bf16 [tokens, hidden], top-k expert ids, softmaxed weights [tokens, k]) drawn from `g`, in
    that order; `skewed`: expert 0 (on rank 0) is every token's first choice."""
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16)
    scores = torch.rand(tokens, experts, device="cuda", generator=g)
    if skewed:
        scores[:, 0] += 10
    idx = scores.topk(k, dim=1).indices
    wts = torch.softmax(torch.randn(tokens, k, device="cuda", generator=g), 1)
    return x, idx, wts


def expert_scales(moe: Any, counts: torch.Tensor) -> torch.Tensor:
    """bf16 [capacity, 1]: for each recv_x row of MoeExchange `moe` (laid out by the expert
    `counts` its dispatch returned), its expert's global id + 1, the factor the MoE cases' experts
    scale their rows by (so combine's result depends on which expert each row reached)."""
    le = moe.local_experts
    rows = torch.arange(moe.capacity, device="cuda")
    if moe.path == "low_latency":  # a block of world * max_tokens rows per expert
        e_of_row = rows // (moe.world * moe.max_tokens)
    else:
        e_of_row = torch.searchsorted(torch.cumsum(counts, 0), rows, right=True)
    return (moe.rank * le + e_of_row.clamp(max=le - 1) + 1).to(torch.bfloat16)[:, None]


def expert_rows(recv_x: torch.Tensor, counts: torch.Tensor, offsets: torch.Tensor) -> list[torch.Tensor]:
    """Each expert's rows of recv_x (rows `offsets[e]`.. of `counts[e]`), sorted by their bits:
    comparable between layouts whose order within an expert differs (the low-latency path fills
    an expert's block in arrival order)."""
    out = []
    for off, n in zip(offsets.tolist(), counts.tolist()):
        rows = recv_x[off:off + n]
        bits = rows.contiguous().view(torch.int16).to(torch.int64)
        key = (bits * torch.arange(1, bits.shape[1] + 1, device=bits.device) ** 2).sum(1)
        out.append(rows[torch.argsort(key, stable=True)])
    return out


def moe_scaled_layer(moe: Any, x: torch.Tensor, idx: torch.Tensor, wts: torch.Tensor) -> list[torch.Tensor]:
    """One dispatch + combine on `moe` (check=True, then moe.check()), each expert scaling its
    rows by `expert_scales` in between (an fp8 dispatch's rows dequantized first): clones of
    recv_x (and the fp8 scales), the expert counts and offsets, and combine's output."""
    from ironlink.moe import fp8_dequantize

    recv, counts, offsets, handle = moe.dispatch(x, idx, wts, check=True)
    rows = fp8_dequantize(*recv, torch.bfloat16) if moe.fp8 else recv
    out = moe.combine(rows * expert_scales(moe, counts), handle, check=True)
    torch.cuda.synchronize()
    moe.check()
    got = list(recv) if moe.fp8 else [recv]
    return [t.clone() for t in got + [counts, offsets, out]]


def heap_timeout_s() -> float:
    """The wait timeout for a worker's heaps: $IRONLINK_GPU_HEAP_TIMEOUT_S, else ironlink's default."""
    from ironlink.runtime.heap import DEFAULT_TIMEOUT_S

    return float(os.environ.get("IRONLINK_GPU_HEAP_TIMEOUT_S", DEFAULT_TIMEOUT_S))


def renewed(heap: Any) -> Any:
    """Closes `heap` (collective) and returns a new one of its size with the workers' wait
    timeout: what `Cases(renew=...)` gives the cases after one that failed on some rank."""
    import ironlink

    size = heap.nbytes
    heap.close()
    return ironlink.SymmetricHeap(size, timeout_s=heap_timeout_s())


# What this process compiled (module docs): one recorder for every Cases of the worker, so each
# report writes all of it; on rank 0 it also appends each kernel to the record as it compiles.
RECORDER = compile_ahead.Recorder()
_compiled_ahead = False


def _arch() -> int:
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def record_name() -> str:
    """This worker's record of compiled kernels: its script, world, whether ranks share GPUs
    (then PDL is off, so some kernels differ) and the GPU's arch."""
    return compile_records.record_name(compile_records.program_name(), dist.get_world_size(), shared_gpu_allowed(),
                                       _arch())


class Cases:
    def __init__(self, before: Optional[Callable[[], None]] = None,
                 renew: Optional[Callable[[], None]] = None) -> None:
        self.before = before  # run before every case, on every rank
        # Run on every rank after a case that failed on any rank: after a timeout the ranks' call
        # counters disagree and late peer writes may still land (docs/device-api.md: close the
        # heap), and a rank whose check failed skipped the case's frees while its peers made them
        # (its next allocations land at other offsets: HEAP_ASYMMETRIC in every case after it, as
        # collectives at world 8 showed, 2026-11-30). The cases after it get a new heap.
        self.renew = renew
        # The pass/fail vote on the CPU (gloo), not in a GPU kernel: after a failure, a rank's NCCL
        # kernel spins (no timeout) until every peer joins, and where ranks share a GPU its CTAs can
        # hold SMs a GPU-mate's ironlink kernel still needs to finish (MPS's thread percentage
        # limits a client's SMs, it reserves none; docs/gpu-testing.md).
        self.vote_group = dist.new_group(backend="gloo")
        self.rank = dist.get_rank()
        self.passed = 0
        self.failed: list[str] = []
        self.only = os.environ.get("IRONLINK_GPU_ONLY", "").split("|")
        self.skip = [part for part in os.environ.get("IRONLINK_GPU_SKIP", "").split("|") if part]
        self.verbose = VERBOSE
        self._compile_ahead()
        self._start_record()

    def selected(self, name: str) -> bool:
        return any(part in name for part in self.only) and not any(part in name for part in self.skip)

    def _compile_ahead(self) -> None:
        """The recorded kernels of the selected cases, this rank's share, then every rank waits
        for the others' (a kernel a peer is still compiling would be compiled again here). Once a
        process: a worker's second Cases finds them compiled."""
        global _compiled_ahead
        folder = os.environ.get("IRONLINK_GPU_COMPILE_AHEAD")
        if not folder or _compiled_ahead:
            return
        _compiled_ahead = True
        world, arch = dist.get_world_size(), _arch()
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        # Else the record of the other setting: most of its kernels are these (PDL aside).
        name = compile_records.nearest_record(Path(folder), compile_records.program_name(), world,
                                              shared_gpu_allowed(), arch)
        entries, done = compile_records.compile_share(
            lambda: [e for e in compile_records.records_of(Path(folder), name) if not e.case or self.selected(e.case)],
            self.rank, world, local_world, arch)
        dist.barrier(group=self.vote_group)
        if self.rank == 0:
            print(f"compile ahead: {len(entries)} kernels of {name} over {world} ranks x "
                  f"{compile_ahead.processes_for(local_world)} processes; rank 0's share ({done.compiled} compiled, "
                  f"{len(done.failures)} not) in {done.seconds:.1f} s", flush=True)

    # The record (module docs) is kept up to date by rank 0 as the cases run, so a run stopped by
    # a time limit (a cold cache's) still leaves one; the report rewrites it with every rank's.

    def _record_file(self) -> Optional[Path]:
        folder = os.environ.get("IRONLINK_GPU_COMPILE_RECORD")
        return Path(folder) / record_name() if folder else None

    def _left_out(self, record: Path) -> list[compile_ahead.Entry]:
        """The committed record's entries of the cases this run leaves out (`--only`, `--skip`):
        a suite run in halves ends with one whole record."""
        committed = Path(os.environ.get("IRONLINK_GPU_COMPILE_AHEAD") or record.parent) / record.name
        return [e for e in compile_ahead.read(committed) if e.case and not self.selected(e.case)]

    def _start_record(self) -> None:
        record = self._record_file()
        if record is None or RECORDER.started:  # a worker's second Cases keeps the first's record
            return
        if self.rank == 0:
            self._saving_record(lambda: compile_ahead.write(record, self._left_out(record)))
            RECORDER.path = record
        RECORDER.start()

    def _saving_record(self, save: Callable[[], None]) -> None:
        """Rank 0 saves the record; a record only saves time, so a failure is reported, no more."""
        try:
            save()
        except Exception as e:  # noqa: BLE001
            print(f"compile ahead: the record was not written: {type(e).__name__}: {e}", flush=True)

    def _write_record(self) -> None:
        """Rank 0 rewrites the record with what every rank compiled so far in this process (every
        rank takes part: a collective) and the committed entries of the cases left out."""
        record = self._record_file()
        if record is None:
            return
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, list(RECORDER.entries.values()), group=self.vote_group)
        if self.rank == 0:
            ran = [e for mine in everyone for e in mine]  # first: where a kernel is in both, its case now
            self._saving_record(lambda: compile_ahead.write(record, ran + self._left_out(record)))

    def run(self, name: str, fn: Callable[[], None]) -> None:
        if not self.selected(name):
            return
        started = time.time()
        RECORDER.case = name
        if self.verbose:
            faulthandler.dump_traceback_later(STUCK_DUMP_S, repeat=True, file=STACKS)
        if self.rank == 0:  # a case that never ends is named by the last of these in the log
            print(f"case {name}: started", flush=True)

        global _vote_group
        _vote_group, voted = self.vote_group, False
        try:
            if self.before:
                self.before()
            fn()
            ok = 1
        except PeerFailed as e:  # the vote it took was this case's: the failed peer's final one
            ok, voted = 0, True
            print(f"[rank {self.rank}] FAILED {name}: {e}", flush=True)
        except Exception as e:  # noqa: BLE001 - a failed case is reported, the suite goes on
            ok = 0
            if not isinstance(e, AssertionError):
                traceback.print_exc()
            print(f"[rank {self.rank}] FAILED {name}: {e}", flush=True)
        finally:
            _vote_group = None
        # A case passes only if it passed on every rank; else every rank renews its heap.
        passed = False
        if not voted:
            flag = torch.tensor([ok])
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.vote_group)
            passed = bool(flag.item())
        faulthandler.cancel_dump_traceback_later()  # after the vote: a rank stuck before it is dumped too
        if self.verbose and self.rank == 0:
            print(f"case {name}: {'ok' if passed else 'FAILED'} in {time.time() - started:.2f} s", flush=True)
        if passed:
            self.passed += 1
        else:
            self.failed.append(name)
        if not passed and self.renew:
            if self.rank == 0:
                print(f"case {name}: failed on some rank: the cases after it run on a new heap", flush=True)
            self.renew()

    def report(self, suite: str, world: int, started: float) -> int:
        """Rank 0 prints the failed cases and the summary line tests/gpu/run.sh greps
        ("== <suite> world <N>: P passed, F failed in T s =="); the worker's exit status. A
        collective: the record of what was compiled (module docs) is gathered first."""
        self._write_record()
        if self.rank == 0:
            for f in self.failed:
                print(f"FAILED {f}")
            print(f"== {suite} world {world}: {self.passed} passed, {len(self.failed)} failed in "
                  f"{time.time() - started:.1f}s ==", flush=True)
        return 1 if self.failed else 0

