"""docs/moe.md's benchmark table, made from the newest bench/results/moe-*.json.

    python3 bench/report/moe_table.py            # print the block
    python3 bench/report/moe_table.py --write    # rewrite it in docs/moe.md (`make docs` does this)

The block sits between `<!-- moe:begin -->` and `<!-- moe:end -->`; tests/packaging/test_readme_bench.py
checks that docs/moe.md carries exactly this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "report"))  # bench/report/doc_blocks.py, whether run as a script or loaded by path
from doc_blocks import replace_between  # noqa: E402
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "moe.md"
BEGIN, END = "<!-- moe:begin -->\n", "<!-- moe:end -->"

Row = dict[str, Any]


def newest() -> Optional[Path]:
    """The newest moe-*.json (by the date it records)."""
    runs = [(json.loads(p.read_text())["date"], p.name, p) for p in RESULTS.glob("moe-*.json")]
    return max(runs)[2] if runs else None


def block() -> str:
    path = newest()
    if path is None:
        return "No measurement committed yet (`tests/gpu/run.sh moe-bench`).\n"
    doc = json.loads(path.read_text())
    rows: list[Row] = doc["results"]

    def get(op: str, who: str, tokens: int, routing: str, budget: int = 0) -> Optional[Row]:
        """The row; ironlink's with SM budget `budget` (0: every SM; runs before the sweep have none)."""
        return next((r for r in rows if r["op"] == op and r["contender"] == who and r["tokens"] == tokens
                     and r["routing"] == routing and r.get("sms_budget", 0) == budget), None)

    def us(r: Optional[Row]) -> str:
        return "-" if r is None else f"{r['us']:.1f}"

    def ratio(theirs: Optional[Row], ours: Optional[Row]) -> str:
        return f"{theirs['us'] / ours['us']:.2f}" if theirs and ours else "-"

    # torch_nvshmem (PyTorch's NVSHMEM all_to_all_vdev) has columns where the run measured it.
    nv = any(r["contender"] == "torch_nvshmem" for r in rows)
    nv_note = doc.get("torch_nvshmem", {})
    first = rows[0]
    caption = (f"{doc['world_size']} x {doc['gpu']}, {doc['date'][:10]}, git {doc['git_rev']}, bf16, hidden "
               f"{first['hidden']}, top-{first['topk']} of {first['experts']} experts; us per call (median, max over "
               "ranks); ironlink in CUDA graphs, torch.distributed eagerly (it syncs with the host)")
    if doc.get("x") == "heap":
        caption += " (ironlink's x a heap tensor: its rows pulled in place, not staged)"
    if nv:
        caption += f", torch NVSHMEM (all_to_all_vdev, counts on the GPU) {nv_note.get('timed', 'eagerly')}"
    caption += ("; GB/s = dispatch + combine payload (tokens x top-k x hidden x 2 bytes, each way) per second; "
                + ("x, x NVSHMEM = torch.distributed's, torch NVSHMEM's time / ironlink time." if nv else
                   "x = torch time / ironlink time."))
    if not nv and "skipped" in nv_note:
        caption += f" torch NVSHMEM not measured: {nv_note['skipped']}."
    head = ("| tokens / rank | routing | dispatch | combine | dispatch + combine | GB/s | torch dispatch "
            "| torch dispatch + combine | x |")
    if nv:
        head += " NVSHMEM dispatch | NVSHMEM dispatch + combine | x NVSHMEM |"
    fp8 = any(r["contender"] == "ironlink_fp8" for r in rows)  # ironlink with an fp8 dispatch
    if fp8:
        head += " fp8 dispatch | fp8 dispatch + combine |"
        caption += " fp8: ironlink with `dispatch_dtype=torch.float8_e4m3fn`."
    out = [caption, "", head, "|---" * head.count(" | ") + "|---|"]
    for routing in ("uniform", "skewed"):
        for t in sorted({r["tokens"] for r in rows if r["routing"] == routing}):
            both, torch_both = get("dispatch_combine", "ironlink", t, routing), get("dispatch_combine", "torch_a2a", t,
                                                                                    routing)
            gbps = f"{both['GBps']:.0f}" if both else "-"
            line = (f"| {t} | {routing} | {us(get('dispatch', 'ironlink', t, routing))} | "
                    f"{us(get('combine', 'ironlink', t, routing))} | {us(both)} | {gbps} | "
                    f"{us(get('dispatch', 'torch_a2a', t, routing))} | {us(torch_both)} | {ratio(torch_both, both)} |")
            if nv:
                nv_both = get("dispatch_combine", "torch_nvshmem", t, routing)
                line += (f" {us(get('dispatch', 'torch_nvshmem', t, routing))} | {us(nv_both)} | "
                         f"{ratio(nv_both, both)} |")
            if fp8:
                line += (f" {us(get('dispatch', 'ironlink_fp8', t, routing))} | "
                         f"{us(get('dispatch_combine', 'ironlink_fp8', t, routing))} |")
            out.append(line)
    budgets = sorted({r["sms_budget"] for r in rows if r.get("sms_budget")})
    relay = any(r["contender"] == "ironlink_relay" for r in rows)
    if budgets or relay:  # the SM sweep (`--sms`) and the relay path (`--relay`), dispatch + combine
        sms = {b: next(r["sms"] for r in rows if r.get("sms_budget") == b) for b in budgets}
        full = next((r["sms"] for r in rows if r["contender"] == "ironlink" and r.get("sms_budget") == 0), "all")
        head = ("| tokens / rank | routing | " + "".join(f"{sms[b]} SMs | " for b in budgets) + f"{full} SMs (all) |"
                + (" relay path (two all_to_all_v) |" if relay else ""))
        out += ["", "Dispatch + combine (us) against the SM budget (`MoeExchange(..., sms=N)`)"
                + (" and on the relay path (`path=\"relay\"`)" if relay else "") + ":", "", head,
                "|---" * head.count(" | ") + "|---|"]
        for routing in ("uniform", "skewed"):
            for t in sorted({r["tokens"] for r in rows if r["routing"] == routing}):
                cells = [us(get("dispatch_combine", "ironlink", t, routing, b)) for b in [*budgets, 0]]
                if relay:
                    cells.append(us(get("dispatch_combine", "ironlink_relay", t, routing)))
                out.append(f"| {t} | {routing} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def write() -> None:
    DOC.write_text(replace_between(DOC.read_text(), BEGIN, END, block(), "docs/moe.md"))
    print("wrote the MoE block of docs/moe.md")


if __name__ == "__main__":
    write() if "--write" in sys.argv[1:] else print(block(), end="")
