"""A run's Triton kernels compiled ahead, in parallel, from a record of an earlier run.

A first call compiles each kernel it launches, one after another, each in seconds (the ironlink
bitcode is linked and optimized into every kernel): a GPU suite from a cold Triton cache spends
most of its time there, at world 8 longer than a 600 s call (docs/gpu-testing.md). What a run
compiled is known once it ran: Triton hands each compile's specialization to
`knobs.runtime.jit_post_compile_hook` (the kernel, its argument types and alignments, its
constexprs and options), and `JITFunction.preload` compiles that specialization again. So:

- `Recorder` keeps the specializations this process compiles (`start` / `stop`; `write` puts them
  in a gzipped JSON-lines file, one kernel a line, `append` adds to one as a run goes on);
- `compile_ahead(entries, arch, processes)` compiles them in worker processes into Triton's
  on-disk cache. Those processes touch no GPU: Triton's driver is replaced by one that only names
  the target. A later launch of the same kernel with the same specialization finds it there (the
  cache key is the kernel's source, specialization, options and the bitcode's hash, not the
  process) and loads it instead of compiling.

A record only saves time: a kernel it lacks, or whose specialization changed, compiles at its
launch as before, and an entry that no longer compiles (a kernel renamed or removed) is reported
and passed over. A record names the extern libraries' files where the recording run found them;
where such a file is missing here (another checkout or environment), the file of the same name
where this installation finds that library is compiled instead: the cache key holds a library's
contents, not its path (nor the module: a script's kernels, compiled as ``__main__``'s, are
recorded and compiled ahead under the script's module name). Kernels made inside a function (a
qualname with ``<locals>``) or in a module of no file cannot be found again by name and are not
recorded. Triton turns a compile's
specialization into JSON before it calls the hook, so while a recorder runs, a launch with a
Triton function as a constexpr argument raises TypeError in Triton (no kernel of ironlink or of
its GPU workers takes one).
"""

from __future__ import annotations

import functools
import gzip
import importlib
import importlib.util
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import IO, Any, Iterable, NamedTuple, Optional, Sequence

from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from ..language import _lib, _nvshmem


class Entry(NamedTuple):
    """One compiled kernel: where its JITFunction lives, and Triton's specialization data for it."""

    module: str
    qualname: str
    specialization: str  # triton.runtime.jit.serialize_specialization_data's JSON
    case: str = ""  # what the recording process was doing when it compiled it ("" if unknown)

    @property
    def key(self) -> tuple[str, str, str]:
        """What makes an entry another compile: the kernel and its specialization, not the case."""
        return self.module, self.qualname, self.specialization


def unique(entries: Iterable[Entry]) -> list[Entry]:
    """`entries`, each kernel and specialization once (the first), in the order first seen."""
    first: dict[tuple[str, str, str], Entry] = {}
    for e in entries:
        first.setdefault(e.key, e)
    return list(first.values())


def _add_lines(f: IO[str], entries: Iterable[Entry]) -> None:
    for e in entries:
        f.write(json.dumps(e._asdict(), sort_keys=True) + "\n")


class Summary(NamedTuple):
    compiled: int
    seconds: float
    failures: list[str]


def _importable_module(module: str) -> str:
    """The name a worker process imports `module` by: a script run as __main__ by its file's stem
    (its folder is sys.path[0], which the workers inherit)."""
    if module != "__main__":
        return module
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    return Path(main_file).stem if main_file else module


@functools.lru_cache(maxsize=None)
def _findable(module: str) -> bool:
    """Whether a worker process can import `module` (not, e.g., code generated into a module
    of no file)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None and Path(spec.origin).is_file()


class Recorder:
    """The specializations this process compiles while started, in the order first compiled; with
    `path` (settable), each new one is also appended to that file as it is compiled, so a run
    stopped by a time limit still leaves its record."""

    def __init__(self, path: Optional[Path] = None) -> None:
        self.path = path
        self.entries: dict[tuple[str, str, str], Entry] = {}
        self.case = ""  # set by the caller: the case each new entry is filed under
        self._previous: Any = None
        self.started = False

    def _hook(self, *, key: Any, repr: Any, fn: Any, compile: Any, is_manual_warmup: bool,
              already_compiled: bool) -> Optional[bool]:
        # A JITHook (triton.knobs.JITHook); `fn.module` is the module's name, `fn.name` the qualname.
        try:
            module = _importable_module(fn.module)
            if "<locals>" not in fn.name and _findable(module):
                entry = Entry(module, fn.name, compile["specialization_data"], self.case)
                if entry.key not in self.entries:
                    self.entries[entry.key] = entry
                    if self.path is not None:
                        self._save(self.path, entry)
        except Exception:  # noqa: BLE001 - a record only saves time: never fail the launch it watches
            pass
        if self._previous is not None:
            return self._previous(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                                  already_compiled=already_compiled)
        return None

    @staticmethod
    def _save(path: Path, entry: Entry) -> None:
        try:
            append(path, [entry])
        except Exception as e:  # noqa: BLE001 - a record only saves time
            print(f"ironlink: the compile record {path} was not written: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)

    def start(self) -> None:
        if not self.started:
            self._previous, self.started = knobs.runtime.jit_post_compile_hook, True
            knobs.runtime.jit_post_compile_hook = self._hook

    def stop(self) -> None:
        if self.started:
            knobs.runtime.jit_post_compile_hook, self.started = self._previous, False


def write(path: Path, entries: Sequence[Entry]) -> None:
    """`entries` to `path` (gzipped JSON lines), without repeats, in a stable order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        _add_lines(f, sorted(unique(entries)))


def append(path: Path, entries: Sequence[Entry]) -> None:
    """`entries` added to `path` as they come (a gzip member more: `read` reads them all), for a
    record kept up to date while a run goes on; `write` puts it in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "at", encoding="utf-8") as f:
        _add_lines(f, entries)


def read(path: Path) -> list[Entry]:
    """The entries of a file `write` wrote (and `append` added to), each kernel and
    specialization once (the first); a missing file has none."""
    if not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return unique(Entry(**json.loads(line)) for line in f if line.strip())


class _TargetOnly:
    """The part of Triton's driver that `JITFunction.preload` reads, without a GPU: a worker
    process compiles for `arch` and never creates a CUDA context."""

    def __init__(self, arch: int) -> None:
        self.arch = arch

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Optional[int] = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", self.arch, 32)


def _init_worker(path: list[str], arch: int) -> None:
    sys.path[:] = path
    driver.set_active(_TargetOnly(arch))


def _jit_function(module: str, qualname: str) -> JITFunction:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):  # @ironlink.jit, autotuners
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise TypeError(f"{module}.{qualname} is not a Triton kernel")
    return obj


def _library_here(name: str, recorded: str, arch: int) -> str:
    """Extern library `name`'s file in this installation: `recorded` if it is a file here, else the
    file of the same name where a launch here finds that library (else `recorded`: the compile fails
    and is reported)."""
    if Path(recorded).is_file():
        return recorded
    file = Path(recorded).name
    if name == "libdevice":  # Triton's own, beside its NVIDIA backend
        candidates = [Path(p) / "lib" / file for p in importlib.import_module("triton.backends.nvidia").__path__]
    elif name == _nvshmem.LIB_NAME:
        try:
            candidates = [Path(_nvshmem.device_bitcode_path(arch))]
        except Exception:  # noqa: BLE001 - no NVSHMEM here: the compile fails and is reported
            candidates = []
    else:  # ironlink's bitcode, under any of its library names
        candidates = [d / file for d in _lib.search_dirs()]
    return next((str(p) for p in candidates if p.is_file()), recorded)


def _for_here(specialization: str, kernel: JITFunction, arch: int) -> str:
    """`specialization` as `kernel.preload` takes it in this process: under the kernel's name here
    (a script's kernels were recorded as __main__'s; the cache key holds the source, not the
    module), with each extern library's path as `_library_here` finds it."""
    data = json.loads(specialization)
    data["name"] = f"{kernel.fn.__module__}.{kernel.fn.__qualname__}"  # Triton's own spelling of it
    libs = data["options"].get("extern_libs") or []
    data["options"]["extern_libs"] = [[name, _library_here(name, path, arch)] for name, path in libs]
    return json.dumps(data)


def _compile_one(entry: Entry, arch: int) -> str:
    """Compiles one entry into the Triton cache (in a worker process): '' or why not."""
    try:
        kernel = _jit_function(entry.module, entry.qualname)
        kernel.preload(_for_here(entry.specialization, kernel, arch))
        return ""
    except Exception as e:  # noqa: BLE001 - compiling ahead only saves time; the launch compiles it anyway
        return f"{entry.module}.{entry.qualname}: {type(e).__name__}: {e}"


def compile_ahead(entries: Sequence[Entry], arch: int, processes: int) -> Summary:
    """Compiles `entries` for sm_`arch` into Triton's cache ($TRITON_CACHE_DIR, as the launches
    read it) over `processes` worker processes (spawned: this process may hold a CUDA context)."""
    started = time.time()
    if not entries:
        return Summary(0, 0.0, [])
    workers = max(1, min(processes, len(entries)))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                             initargs=(list(sys.path), arch)) as pool:
        failures = [f for f in pool.map(functools.partial(_compile_one, arch=arch), entries) if f]
    return Summary(len(entries) - len(failures), time.time() - started, failures)


def processes_for(ranks_on_node: int) -> int:
    """Worker processes for one of `ranks_on_node` ranks compiling at once: the cores this
    process may run on, shared out, at most 8 a rank (each process imports torch and Triton: about
    a second's start)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(1, min(8, cores // max(1, ranks_on_node)))


__all__ = ["Entry", "Recorder", "Summary", "append", "compile_ahead", "processes_for", "read", "unique", "write"]
