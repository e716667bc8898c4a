"""The decode paths' choices by world size, as tables a user's node can re-measure (issue 60).

A `DecodeTable` says, by message bytes, which path `ironlink.all_reduce` takes ("lamport": its
lamport-slot kernel; "library": the device library's all-reduce), which mode
`ironlink.all_reduce_rmsnorm` runs (a name of `RMSNORM_MODES`, by the bytes of x) and, where the
node measured it, which method `ironlink.matmul_all_reduce` runs (a name of `MATMUL_METHODS`, by
the bytes of out; past its entries, or in a table without them, `tuning.matmul_method`'s rule).
`tuning.all_reduce_takes_lamport`, `tuning.rmsnorm_mode` and `tuning.matmul_method` read it when
an op plans a call, so a CUDA graph keeps what its capture chose.

Where the table of a world size comes from, looked up once per world and kept (`in_use`):
1. the user's tuning file, `decode-w{world}.json` in `tuning_dir()` ($IRONLINK_TUNING_DIR, else
   $XDG_CACHE_HOME/ironlink, else ~/.cache/ironlink), as `python -m ironlink.tune` writes it on
   their node;
2. the committed one shipped in the package (`runtime/tuning/tables/decode-w{world}.json`, the same
   format);
3. else one derived from the nearest world that has either (`derive`).
Of the user's file and the committed one, the first measured on this process's GPU (its name, as
the tuner records it under "gpu") is used; where neither was, the first that exists, with a
warning naming both GPUs (a home folder shared by nodes of several GPUs, or a GPU the project has
not measured: run the tuner there).
A file that exists but is malformed, of another format version or of another world raises
ValueError naming it: a tuning file is never silently passed over. Every rank of a job must read
the same table (the ranks' kernels meet their peers'): on several machines, the same file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

from .lookup import by_size, covering, nearest_world

# The version of the file format; a file of another is refused (re-run the tuner).
FORMAT = 1
ALL_REDUCE_PATHS = ("lamport", "library")
# all_reduce_rmsnorm's modes (fused/all_reduce_rmsnorm.py's MODES is this tuple; its docs say what
# each does): the names a table may hold, in the order of preference on a tie.
RMSNORM_MODES = ("rows", "whole", "push", "split", "lamport", "two_shot", "push_two_shot")
# matmul_all_reduce's methods (fused/matmul_all_reduce.py's METHODS is this tuple), in the order of
# preference on a tie. An optional part of a table: files without it are read as before.
MATMUL_METHODS = ("push", "lamport", "tile")
# "No limit" as the tables write it (an int, as JSON has no infinity).
NO_LIMIT = 1 << 62
# The one-shot paths: each rank sends every peer a copy of its data (all_reduce "lamport";
# all_reduce_rmsnorm "split", "lamport", "push"), so their bytes on the links grow with world - 1.
ONE_SHOT = frozenset({"lamport", "split", "push"})
TUNING_DIR_ENV = "IRONLINK_TUNING_DIR"
COMMITTED_DIR = Path(__file__).resolve().with_name("tables")

Entries = tuple[tuple[int, str], ...]


class DecodeTable(NamedTuple):
    """One world size's choices: ascending (max_bytes, name) entries, an entry covering the bytes
    above the one before it up to its max_bytes."""

    # Past the last entry, "library".
    all_reduce: Entries = ()
    # Past the last entry, the last mode.
    all_reduce_rmsnorm: Entries = ((NO_LIMIT, "rows"),)
    # Past the last entry (none: not measured), `tuning.matmul_method`'s rule.
    matmul_all_reduce: Entries = ()

    def all_reduce_path(self, nbytes: int) -> str:
        """The path of an all_reduce of `nbytes`."""
        entry = covering(self.all_reduce, nbytes)
        return entry[1] if entry else "library"

    def rmsnorm_modes(self, nbytes: int) -> tuple[str, ...]:
        """The modes for an x of `nbytes`, in order of preference: its entry's, then each later
        entry's (a mode that cannot run for a shape falls to the next one that can)."""
        entries = self.all_reduce_rmsnorm
        first = entries.index(by_size(entries, nbytes))
        return tuple(mode for _, mode in entries[first:])

    def matmul_method(self, nbytes: int) -> str | None:
        """The measured method of a matmul_all_reduce whose out has `nbytes`, or None past the
        entries (the rule applies there)."""
        entry = covering(self.matmul_all_reduce, nbytes)
        return entry[1] if entry else None


class InUse(NamedTuple):
    """A world's table and where it came from: a file's path, "derived from <path> (world N)", or
    "substituted" (`substituted`); and, where the table was measured on another GPU than this one,
    the warning that says so (`in_use` issues it once)."""

    table: DecodeTable
    source: str
    warning: str = ""


def _entries(doc: Mapping[str, Any], key: str, names: Sequence[str], bad: Callable[[str], ValueError]) -> Entries:
    raw = doc.get(key)
    if not isinstance(raw, list):
        raise bad(f"{key!r} must be a list of [max_bytes, name], got {raw!r}")
    entries: list[tuple[int, str]] = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and type(item[0]) is int and isinstance(item[1], str)):
            raise bad(f"{key!r}: {item!r} is not [max_bytes, name]")
        limit, name = item
        if name not in names:
            raise bad(f"{key!r}: {name!r} is not one of {tuple(names)}")
        if limit <= (entries[-1][0] if entries else 0):
            raise bad(f"{key!r}: max_bytes must be positive and ascending, got {limit} after "
                      f"{entries[-1][0] if entries else 0}")
        entries.append((limit, name))
    return tuple(entries)


def from_document(doc: Any, world: int, where: str) -> DecodeTable:
    """The table in `doc` (a parsed file, named `where` in errors) for `world`; ValueError if it is
    not a table of this format and world."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{where}: {what}: not a decode table of format {FORMAT} for world {world} "
                          f"(re-run `python -m ironlink.tune`, or remove the file)")

    if not isinstance(doc, dict):
        raise bad("not a JSON object")
    if doc.get("format") != FORMAT:
        raise bad(f"format {doc.get('format')!r}, this ironlink reads format {FORMAT}")
    if doc.get("world") != world:
        raise bad(f"world {doc.get('world')!r}")
    rmsnorm = _entries(doc, "all_reduce_rmsnorm", RMSNORM_MODES, bad)
    if not rmsnorm:
        raise bad("'all_reduce_rmsnorm' is empty")
    matmul = _entries(doc, "matmul_all_reduce", MATMUL_METHODS, bad) if "matmul_all_reduce" in doc else ()
    return DecodeTable(_entries(doc, "all_reduce", ALL_REDUCE_PATHS, bad), rmsnorm, matmul)


def document(world: int, table: DecodeTable, info: Mapping[str, Any],
             timings: Mapping[str, Mapping[int, Mapping[str, float]]]) -> dict[str, Any]:
    """The JSON object of a tuning file: format, world, `info` (gpu, hidden, dtype, ironlink_git,
    date), the entries (matmul_all_reduce's where measured), and `timings` (op -> bytes ->
    candidate -> us) behind them."""
    matmul = {"matmul_all_reduce": [list(e) for e in table.matmul_all_reduce]} if table.matmul_all_reduce else {}
    return {"format": FORMAT, "world": world, **info,
            "all_reduce": [list(e) for e in table.all_reduce],
            "all_reduce_rmsnorm": [list(e) for e in table.all_reduce_rmsnorm], **matmul,
            "timings": {op: {str(n): dict(t) for n, t in sorted(by.items())} for op, by in timings.items()}}


def read_file(path: Path, world: int) -> DecodeTable:
    """The table of the tuning file `path` for `world` (ValueError naming the file if it is not one)."""
    return _read_measured(path, world)[0]


def measured_on(path: Path) -> str | None:
    """The GPU that the tuning file `path` says it was measured on; None where there is no such
    file, or it names none (nothing is checked: the tuner asks before it writes over a file)."""
    try:
        return _gpu_of(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _gpu_of(doc: Any) -> str | None:
    """The "gpu" of a parsed tuning file, None where it names none."""
    gpu = doc.get("gpu") if isinstance(doc, dict) else None
    return gpu if isinstance(gpu, str) else None


def _read_measured(path: Path, world: int) -> tuple[DecodeTable, str | None]:
    """`read_file`'s table and the GPU the file says it was measured on (None if it does not say)."""
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON decode table ({e}); re-run `python -m ironlink.tune`, or remove "
                         f"the file") from None
    return from_document(doc, world, str(path)), _gpu_of(doc)


def write_file(path: Path, doc: Mapping[str, Any]) -> None:
    """Writes `doc` to `path` (its folder made): to a temporary file first, then renamed over
    `path`, so that an op reading it meanwhile sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # One line an entry: [max_bytes, name].
    text = re.sub(r'\[\s+(\d+),\s+("[^"]*")\s+\]', r"[\1, \2]", json.dumps(doc, indent=1))
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def tuning_dir() -> Path:
    """Where the tuner writes and the ops look first: $IRONLINK_TUNING_DIR, else
    $XDG_CACHE_HOME/ironlink, else ~/.cache/ironlink."""
    if os.environ.get(TUNING_DIR_ENV):
        return Path(os.environ[TUNING_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else Path.home() / ".cache") / "ironlink"


def table_path(directory: Path, world: int) -> Path:
    """The file of `world`'s table in `directory`."""
    return directory / f"decode-w{world}.json"


def _worlds(directory: Path) -> set[int]:
    """The world sizes with a table file in `directory`."""
    if not directory.is_dir():
        return set()
    names = (re.fullmatch(r"decode-w(\d+)\.json", p.name) for p in directory.iterdir())
    return {int(m.group(1)) for m in names if m}


def derive(table: DecodeTable, measured: int, world: int) -> DecodeTable:
    """`table`, measured at world `measured`, made for `world`. A one-shot entry (`ONE_SHOT`)
    sends world - 1 copies of the data, so its max_bytes scales by (measured - 1) / (world - 1)
    for a larger world (the same bytes on each link as where it was measured); for a smaller one it
    is kept (fewer copies: it would win further up, but that is not measured). "rows" and "whole"
    entries keep theirs. An entry that no longer reaches past the one before it covers no size and
    is dropped. At world 1 (no peers: a one-shot path exchanges nothing) the one-shot entries go.
    matmul_all_reduce's one-shot method is "lamport" alone (its "push" is two-shot past world 2's
    first waves)."""
    def scaled(entries: Entries, one_shot: frozenset[str] = ONE_SHOT) -> Entries:
        kept: list[tuple[int, str]] = []
        for limit, name in entries:
            if name in one_shot and world < 2:
                continue
            if name in one_shot and world > measured:
                limit = limit * (measured - 1) // (world - 1)
            if not kept or limit > kept[-1][0]:
                kept.append((limit, name))
        return tuple(kept)

    return DecodeTable(scaled(table.all_reduce), scaled(table.all_reduce_rmsnorm) or DecodeTable().all_reduce_rmsnorm,
                       scaled(table.matmul_all_reduce, frozenset({"lamport"})))


def find(world: int, user_dir: Path, committed_dir: Path = COMMITTED_DIR, gpu: str | None = None) -> InUse:
    """`world`'s table: of the files in `user_dir` and `committed_dir`, the first measured on `gpu`
    (a file that names no GPU, or `gpu` None, matches), else the first that exists, with a warning;
    else derived from the nearest world with a file in either (the nearest smaller one first: its
    one-shot limits shrink rather than grow, `derive`), that world's table found the same way.
    Every file that exists is read, so a malformed one raises even where another is used."""
    files = [(p, *_read_measured(p, world)) for p in (table_path(d, world) for d in (user_dir, committed_dir))
             if p.is_file()]
    if files:
        matching = [f for f in files if gpu is None or f[2] in (None, gpu)]
        chosen = (matching or files)[0]
        path, table, its_gpu = chosen
        passed_over = [f"{p} (measured on {g})" for p, _, g in files[:files.index(chosen)]]
        warning = ""
        if not matching:
            warning = (f"ironlink: world {world}'s decode table {path} was measured on {its_gpu}, this GPU is "
                       f"{gpu}: the ops choose their paths from it until `torchrun --nproc_per_node={world} -m "
                       f"ironlink.tune` measures this node")
        elif passed_over:
            warning = (f"ironlink: world {world}'s decode table is {path}, measured on this GPU ({gpu}); passed "
                       f"over another GPU's: {', '.join(passed_over)}")
        return InUse(table, str(path), warning)
    measured = (_worlds(user_dir) | _worlds(committed_dir)) - {world}
    if not measured:
        raise ValueError(f"no decode table for world {world} in {user_dir} or {committed_dir}, nor any to derive "
                         f"one from")
    nearest = nearest_world(measured, world)
    base = find(nearest, user_dir, committed_dir, gpu)
    return InUse(derive(base.table, nearest, world), f"derived from {base.source} (world {nearest})", base.warning)


def this_gpu() -> str | None:
    """The name of this process's current CUDA device, as the tuner records it; None where torch
    or an initialized GPU is not at hand (planning without a GPU: no table is passed over)."""
    try:
        import torch

        return str(torch.cuda.get_device_name()) if torch.cuda.is_initialized() else None
    except (ImportError, AttributeError, RuntimeError):
        return None


# The tables found so far, by world (`in_use`), and those substituted (`substituted`).
_found: dict[int, InUse] = {}
_substitutes: dict[int, DecodeTable] = {}


def in_use(world: int) -> InUse:
    """The table the ops use at `world` and where it came from: found (`find`, in `tuning_dir()`
    and the committed tables) at the first lookup of the world and kept; a substituted one while
    `substituted` holds it."""
    if world in _substitutes:
        return InUse(_substitutes[world], "substituted")
    if world not in _found:
        _found[world] = find(world, tuning_dir(), gpu=this_gpu())
        if _found[world].warning:
            warnings.warn(_found[world].warning, stacklevel=2)
    return _found[world]


def table_for(world: int) -> DecodeTable:
    """The table the ops use at `world` (`in_use`)."""
    return in_use(world).table


def forget() -> None:
    """Drops the tables found, so that the next lookup reads the files again (after the tuner
    wrote one in this process, or $IRONLINK_TUNING_DIR changed)."""
    _found.clear()


@contextlib.contextmanager
def substituted(world: int, table: DecodeTable) -> Iterator[None]:
    """Makes `table` the one the ops use at `world` for the block: for benchmarks, tests and the
    tuner, to time or check a choice the table in use does not make. The ops plan a call when it
    is made, so a CUDA graph captured inside the block keeps the substitute's choice."""
    saved = _substitutes.get(world)
    _substitutes[world] = table
    try:
        yield
    finally:
        if saved is None:
            del _substitutes[world]
        else:
            _substitutes[world] = saved


__all__ = ["ALL_REDUCE_PATHS", "COMMITTED_DIR", "DecodeTable", "FORMAT", "InUse", "MATMUL_METHODS", "NO_LIMIT",
           "ONE_SHOT", "RMSNORM_MODES", "TUNING_DIR_ENV", "derive", "document", "find", "forget", "from_document",
           "in_use", "measured_on", "read_file", "substituted", "table_for", "table_path", "this_gpu", "tuning_dir",
           "write_file"]
