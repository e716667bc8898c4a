"""docs/fused.md's benchmark tables, made from the newest bench/results/fused-*.json that has the ops.

    python3 bench/report/fused_table.py            # print the block
    python3 bench/report/fused_table.py --write    # rewrite it in docs/fused.md (`make docs` does this)

The tensor-parallel ops' block sits between `<!-- fused:begin -->` and `<!-- fused:end -->`, the
sequence-parallel ops' between `<!-- sp:begin -->` and `<!-- sp:end -->`; tests/packaging/test_readme_bench.py
checks that docs/fused.md carries exactly this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "report"))  # bench/report/doc_blocks.py, whether run as a script or loaded by path
from doc_blocks import replace_between  # noqa: E402
sys.path.insert(0, str(REPO / "python"))  # ironlink.tuning: the methods the docs call the default
from ironlink.runtime import tuning  # noqa: E402
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "fused.md"
BEGIN, END = "<!-- fused:begin -->\n", "<!-- fused:end -->"
OPS = ("allreduce_rmsnorm", "matmul_allreduce")
SP_OPS = ("allgather_matmul", "matmul_reducescatter")
SP_FUNCTIONS = {"allgather_matmul": "all_gather_matmul", "matmul_reducescatter": "matmul_reduce_scatter"}
SP_BEGIN, SP_END = "<!-- sp:begin -->\n", "<!-- sp:end -->"

Row = dict[str, Any]


def newest(ops: tuple[str, ...] = OPS) -> Optional[Path]:
    """The newest fused-*.json with rows of every op in `ops`."""
    runs = []
    for p in RESULTS.glob("fused-*.json"):
        doc = json.loads(p.read_text())
        if all(any(r["op"] == op for r in doc["results"]) for op in ops):
            runs.append((doc["date"], p.name, p))
    return max(runs)[2] if runs else None


def block() -> str:
    path = newest()
    assert path is not None, "no bench/results/fused-*.json with the tensor-parallel ops"
    doc = json.loads(path.read_text())
    rows: list[Row] = doc["results"]

    def us(op: str, who: str, **shape: int) -> Optional[float]:
        for r in rows:
            if r["op"] == op and r["contender"] == who and all(r.get(k) == v for k, v in shape.items()):
                return float(r["us"])
        return None

    def f(v: Optional[float]) -> str:
        return "-" if v is None else f"{v:.1f}"

    out = [f"{doc['world_size']} x {doc['gpu']}, {doc['date'][:10]}, git {doc['git_rev']}, bf16, CUDA graphs, "
           "us per call (median, max over ranks); x = NCCL + torch time / fused time.", "",
           "all-reduce + residual add + RMSNorm, hidden 8192:", "",
           "| tokens | fused (mode) | rows | rows + PDL | whole | whole + PDL | push | push + PDL | split | split + PDL "
           "| split over LL + PDL | lamport | lamport + PDL "
           "| fused, FP8 out | NCCL + torch | symm_mem + torch | ironlink + torch | torch ops alone | x |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in sorted({r["tokens"] for r in rows if r["op"] == OPS[0]}):
        fused = next(r for r in rows if r["op"] == OPS[0] and r["contender"] == "ironlink_fused" and r["tokens"] == t)
        nccl = us(OPS[0], "nccl_torch", tokens=t)
        how = fused.get("mode", "") + (", PDL" if fused.get("pdl") else "")
        each = " | ".join(f(us(OPS[0], f"ironlink_fused[{c}]", tokens=t))
                          for c in ("rows", "rows,pdl", "whole", "whole,pdl", "push", "push,pdl", "split", "split,pdl",
                                    "split,ll,pdl", "lamport", "lamport,pdl"))
        fp8 = us(OPS[0], f"ironlink_fused[{fused.get('mode', '')},fp8]", tokens=t)
        others = " | ".join(f(us(OPS[0], c, tokens=t)) for c in ("torch_symm_torch", "ironlink_torch", "torch_ops"))
        out.append(f"| {t} | {fused['us']:.1f} ({how}) | {each} | {f(fp8)} | {f(nccl)} | {others} | "
                   f"{(nccl or 0) / fused['us']:.2f} |")
    out += ["", "matmul + all-reduce ([M, K] x [K, N] per rank, N = 8192, K = 8192 / world); x = the other's time / "
            "fused time:", "",
            "| M | fused (method) | push | lamport | tile | NCCL + torch | ironlink + torch | torch.matmul alone "
            "| push's GEMM alone | x NCCL + torch | x ironlink + torch |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in sorted({r["M"] for r in rows if r["op"] == OPS[1]}):
        row = next(r for r in rows if r["op"] == OPS[1] and r["contender"] == "ironlink_fused" and r["M"] == m)
        method, fused_us = matmul_default(doc, row)
        nccl, unfused = us(OPS[1], "nccl_torch", M=m), us(OPS[1], "ironlink_torch", M=m)
        gemm = us(OPS[1], "triton_gemm[push]", M=m) or us(OPS[1], "triton_gemm", M=m)
        push = us(OPS[1], 'ironlink_fused[push]', M=m)
        out.append(f"| {m} | {fused_us:.1f} ({method}) | {f(push)} | {f(us(OPS[1], 'ironlink_fused[lamport]', M=m))} | "
                   f"{f(us(OPS[1], 'ironlink_fused[tile]', M=m))} | {f(nccl)} | {f(unfused)} | "
                   f"{f(us(OPS[1], 'torch_matmul', M=m))} | {f(gemm)} | {(nccl or 0) / fused_us:.2f} | "
                   f"{(unfused or 0) / fused_us:.2f} |")
    return "\n".join(out) + "\n"


def matmul_default(doc: dict[str, Any], row: Row) -> tuple[str, float]:
    """(method, us) of matmul_all_reduce's default today for the shape of `row` (its
    "ironlink_fused" row): the per-method row of the method `ironlink.tuning.matmul_method` picks
    now, where the run recorded its SM count; else what the run's default was."""
    if "sms" in doc and row.get("config"):
        tiles = tuning.MatmulConfig(*row["config"]).tiles(row["M"], row["N"])
        method = tuning.matmul_method(tiles, min(tiles, int(doc["sms"])), int(doc["world_size"]),
                                      row["M"] * row["N"] * 2)  # bf16 out
        for r in doc["results"]:
            if r["op"] == OPS[1] and r["contender"] == f"ironlink_fused[{method}]" and r["M"] == row["M"]:
                return method, float(r["us"])
    return str(row.get("method", "")), float(row["us"])


def sp_block() -> str:
    """The sequence-parallel ops against NCCL + torch.matmul and PyTorch's fused ops."""
    path = newest(SP_OPS)
    if path is None:
        return "No measurement committed yet (`tests/gpu/run.sh fused-bench`).\n"
    doc = json.loads(path.read_text())
    rows: list[Row] = doc["results"]

    def us(op: str, who: str, m: int) -> Optional[float]:
        return next((float(r["us"]) for r in rows if r["op"] == op and r["contender"] == who and r["M"] == m), None)

    def f(v: Optional[float]) -> str:
        return "-" if v is None else f"{v:.1f}"

    out = [f"{doc['world_size']} x {doc['gpu']}, {doc['date'][:10]}, git {doc['git_rev']}, bf16, CUDA graphs, "
           "us per call (median, max over ranks), K = N = 8192; fused = the method `ironlink.tuning.sp_method` "
           "picks; x = the other's time / fused time."]
    for op, title in zip(SP_OPS, ("all-gather + matmul", "matmul + reduce-scatter")):
        out += ["", f"{title}:", "", "| M | fused (method) | kernel | collective | overlap | NCCL + torch | PyTorch fused "
                "| x NCCL + torch | x PyTorch fused |", "|---|---|---|---|---|---|---|---|---|"]
        for m in sorted({r["M"] for r in rows if r["op"] == op}):
            # "fused" is the method ironlink.tuning picks today, from the per-method rows.
            method = tuning.sp_method(SP_FUNCTIONS[op], m, int(doc["world_size"]))
            fused = us(op, f"ironlink_fused[{method}]", m) or us(op, "ironlink_fused", m)
            nccl, symm = us(op, "nccl_torch", m), us(op, "torch_symm_fused", m)
            each = " | ".join(f(us(op, f"ironlink_fused[{x}]", m)) for x in ("kernel", "collective", "overlap"))
            ratio = lambda other: f"{other / fused:.2f}" if other and fused else "-"  # noqa: E731
            label = f"{f(fused)} ({method})" if method else f(fused)
            out.append(f"| {m} | {label} | {each} | {f(nccl)} | {f(symm)} | {ratio(nccl)} | {ratio(symm)} |")
    return "\n".join(out) + "\n"


def newest_rmsnorm_per_world() -> dict[int, Path]:
    """The newest fused-*.json with all_reduce_rmsnorm rows at each world size measured."""
    best: dict[int, tuple[str, str, Path]] = {}
    for p in RESULTS.glob("fused-*.json"):
        doc = json.loads(p.read_text())
        if any(r["op"] == OPS[0] for r in doc["results"]):
            world, key = int(doc["world_size"]), (doc["date"], p.name, p)
            if world not in best or key[:2] > best[world][:2]:
                best[world] = key
    return {w: best[w][2] for w in sorted(best)}


def decode_block() -> str:
    """all_reduce_rmsnorm's default against NCCL + torch at every world size measured, side by
    side (README.md and docs/fused.md: the decode path as the world grows)."""
    runs = {w: json.loads(p.read_text()) for w, p in newest_rmsnorm_per_world().items()}
    if not runs:
        return "No measurement committed yet (`bench/run.sh fused --ops allreduce_rmsnorm`).\n"
    started = ("every rank's replay started together on the device" if all("started on every rank" in d["method"]
                                                                          for d in runs.values())
               else "started after a host barrier")
    out = [f"all_reduce_rmsnorm (hidden 8192, bf16, CUDA graphs of 20 calls, {started}, us per call, median, max "
           "over ranks): "
           "ironlink's default (its mode) against NCCL's all-reduce + torch's add and RMSNorm; x = NCCL + torch / "
           "ironlink. Runs: " + "; ".join(f"{w} x {d['gpu']}, {d['date'][:10]}, git {d['git_rev']}"
                                         for w, d in runs.items()) + ".", "",
           "| tokens | " + " | ".join(f"world {w}: ironlink (mode) | NCCL + torch | x" for w in runs) + " |",
           "|---|" + "---|---|---|" * len(runs)]
    tokens = sorted({r["tokens"] for d in runs.values() for r in d["results"] if r["op"] == OPS[0]})
    for t in tokens:
        cells = []
        for d in runs.values():
            at = {r["contender"]: r for r in d["results"] if r["op"] == OPS[0] and r["tokens"] == t}
            if "ironlink_fused" not in at or "nccl_torch" not in at:
                cells.append("- | - | -")
                continue
            fused, nccl = at["ironlink_fused"], float(at["nccl_torch"]["us"])
            cells.append(f"{fused['us']:.1f} ({fused.get('mode', '')}) | {nccl:.1f} | {nccl / fused['us']:.2f}")
        out.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


DECODE_BEGIN, DECODE_END = "<!-- decode:begin -->\n", "<!-- decode:end -->"
README = REPO / "README.md"


def write() -> None:
    text = replace_between(DOC.read_text(), BEGIN, END, block(), "docs/fused.md")
    text = replace_between(text, SP_BEGIN, SP_END, sp_block(), "docs/fused.md")
    DOC.write_text(replace_between(text, DECODE_BEGIN, DECODE_END, decode_block(), "docs/fused.md"))
    README.write_text(replace_between(README.read_text(), DECODE_BEGIN, DECODE_END, decode_block(), "README.md"))
    print("wrote the fused blocks of docs/fused.md and the decode block of README.md")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.stdout.write(block() + "\n" + sp_block() + "\n" + decode_block())
