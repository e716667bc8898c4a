"""How long a first call's kernels take to compile as the world grows: a probe, not a benchmark
(issue 62 item 6: at world 8 the ops suite was still compiling the MoE low-latency kernels after
about 7 minutes). No GPU: Triton compiles to cubin against the built bitcode, as the compile
tests do.

    python bench/probes/compile_time.py --worlds 2,4,8 --arch 90 --out compile-time.json

Each kernel of the compile tests' tables that takes WORLD (tests/compile/test_triton_compile.py's
MoE kernels, specialized as a launch is; tests/compile/_fused_compile_cases.py's fused kernels,
all_reduce_rmsnorm's modes among them, as its `prepared` specializes them, once per configuration
but the world) is
compiled once per world with a fresh Triton cache, and timed: `seconds` (the whole compile,
Python frontend to cubin), `ptx_lines` (what the per-peer loops unrolled to).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "python"), str(REPO / "tests"), str(REPO / "tests" / "compile")]

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from _compile import bitcode  # noqa: E402

Kernel = tuple[Any, dict[str, Any], dict[str, Any], dict[Any, Any], dict[str, int]]


def fused_kernels() -> dict[str, Kernel]:
    """The fused compile cases' kernels that take WORLD, as its `prepared` gives them, one per
    configuration but the world (the table names some twice, at worlds 2 and 4)."""
    import _fused_compile_cases as f

    out: dict[str, Kernel] = {}
    seen: set[Any] = set()
    for name, (_, _, given) in f.KERNELS.items():
        if "WORLD" not in given:
            continue
        fn, signature, constexprs, attrs, launch = f.prepared(name)
        key = (fn, tuple(sorted((k, repr(v)) for k, v in {**constexprs, **launch}.items() if k != "WORLD")))
        if key not in seen:
            seen.add(key)
            out[name] = (fn, signature, constexprs, attrs, launch)  # signature in the kernel's order, constexprs marked
    return out


def kernels() -> dict[str, Kernel]:
    """name -> (kernel, signature, constexprs, attrs, warps), WORLD set per world later."""
    import test_triton_compile as t
    from ironlink.language.jit import IronlinkKernel

    out: dict[str, Kernel] = {}
    modules = (t.moe_kernels, t.moe_relay, t.moe_sort, t.moe_direct, t.moe_ll)
    for name, (signature, constexprs) in t.MOE_KERNELS.items():
        if "WORLD" not in constexprs:
            continue
        fn = next(getattr(m, name.split()[0]) for m in modules if hasattr(m, name.split()[0]))
        fn = fn.fn if isinstance(fn, IronlinkKernel) else fn
        full = {**signature, **{c: "constexpr" for c in constexprs}}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(full)
                 if full[n].startswith("*") or n in t.MOE_ALIGNED_SIZES}
        out[name] = (fn, signature, constexprs, attrs, {"num_warps": t.MOE_WARPS.get(name, t.MOE_CONFIG.row_warps)})
    return {**out, **fused_kernels()}


def compile_once(fn: Any, signature: dict[str, Any], constexprs: dict[str, Any], attrs: dict[Any, Any],
                 launch: dict[str, int], cc: int) -> tuple[float, int]:
    full = {**signature, **{c: "constexpr" for c in constexprs}}
    t0 = time.perf_counter()
    k = triton.compile(ASTSource(fn, full, constexprs, attrs), target=GPUTarget("cuda", cc, 32),
                       options={"extern_libs": (("ironlink", bitcode(cc)),), **launch})
    return time.perf_counter() - t0, k.asm["ptx"].count("\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--only", default="", help="kernels whose name contains this")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    table = {n: k for n, k in kernels().items() if args.only in n}
    for world in map(int, args.worlds.split(",")):
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TRITON_CACHE_DIR"] = cache  # cold, as a first call on a new machine
            for name, (fn, signature, constexprs, attrs, launch) in table.items():
                seconds, lines = compile_once(fn, signature, {**constexprs, "WORLD": world}, attrs, launch, args.arch)
                row = {"kernel": name, "world": world, "arch": args.arch, "seconds": round(seconds, 2),
                       "ptx_lines": lines}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.out:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
        Path(args.out).write_text(json.dumps({
            "probe": "compile_time", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_rev": rev.stdout.strip() or "unknown", "cpus": os.cpu_count(), "triton": triton.__version__,
            "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
