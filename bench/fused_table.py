"""docs/fused.md's benchmark tables, made from the newest bench/results/fused-*.json that has both ops.

    python3 bench/fused_table.py            # print the block
    python3 bench/fused_table.py --write    # rewrite it in docs/fused.md (`make docs` does this)

The block sits between `<!-- fused:begin -->` and `<!-- fused:end -->`; tests/test_readme_bench.py
checks that docs/fused.md carries exactly this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "fused.md"
BEGIN, END = "<!-- fused:begin -->\n", "<!-- fused:end -->"
OPS = ("allreduce_rmsnorm", "matmul_allreduce")

Row = dict[str, Any]


def newest() -> Path:
    runs = []
    for p in RESULTS.glob("fused-*.json"):
        doc = json.loads(p.read_text())
        if all(any(r["op"] == op for r in doc["results"]) for op in OPS):
            runs.append((doc["date"], p.name, p))
    return max(runs)[2]


def block() -> str:
    doc = json.loads(newest().read_text())
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
           "| tokens | fused (mode) | rows | whole | NCCL + torch | ironlink + torch | torch ops alone | x |",
           "|---|---|---|---|---|---|---|---|"]
    for t in sorted({r["tokens"] for r in rows if r["op"] == OPS[0]}):
        fused = next(r for r in rows if r["op"] == OPS[0] and r["contender"] == "ironlink_fused" and r["tokens"] == t)
        nccl = us(OPS[0], "nccl_torch", tokens=t)
        out.append(f"| {t} | {fused['us']:.1f} ({fused.get('mode', '')}) | {f(us(OPS[0], 'ironlink_fused[rows]', tokens=t))} | "
                   f"{f(us(OPS[0], 'ironlink_fused[whole]', tokens=t))} | {f(nccl)} | "
                   f"{f(us(OPS[0], 'ironlink_torch', tokens=t))} | {f(us(OPS[0], 'torch_ops', tokens=t))} | "
                   f"{(nccl or 0) / fused['us']:.2f} |")
    out += ["", "matmul + all-reduce ([M, K] x [K, N] per rank, N = 8192, K = 8192 / world):", "",
            "| M | fused | NCCL + torch | ironlink + torch | torch.matmul alone | fused kernel's GEMM alone | x |",
            "|---|---|---|---|---|---|---|"]
    for m in sorted({r["M"] for r in rows if r["op"] == OPS[1]}):
        fused, nccl = us(OPS[1], "ironlink_fused", M=m), us(OPS[1], "nccl_torch", M=m)
        out.append(f"| {m} | {f(fused)} | {f(nccl)} | {f(us(OPS[1], 'ironlink_torch', M=m))} | "
                   f"{f(us(OPS[1], 'torch_matmul', M=m))} | {f(us(OPS[1], 'triton_gemm', M=m))} | "
                   f"{(nccl or 0) / (fused or 1):.2f} |")
    return "\n".join(out) + "\n"


def write() -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"docs/fused.md lacks the {BEGIN.strip()} / {END} markers")
    before, rest = text.split(BEGIN, 1)
    DOC.write_text(before + BEGIN + block() + END + rest.split(END, 1)[1])
    print("wrote the fused block of docs/fused.md")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.stdout.write(block())
