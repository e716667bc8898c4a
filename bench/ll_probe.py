"""Scratch probe of the MoE low-latency path's lamport slots (session 34): after every dispatch +
combine, which peer-written slots are left non-empty, and is the combine right and repeatable.
    torchrun --nproc_per_node=2 bench/ll_probe.py --tokens 128 --hidden 7168 --calls 30 [--skewed]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist

import ironlink

E16, E32 = -32768, -2147483648


def routing(g: torch.Generator, tokens: int, hidden: int, experts: int, k: int, skewed: bool):
    x = torch.randn(tokens, hidden, device="cuda", generator=g).to(torch.bfloat16)
    scores = torch.rand(tokens, experts, device="cuda", generator=g)
    if skewed:
        scores[:, 0] += 10
    idx = scores.topk(k, dim=1).indices
    wts = torch.softmax(torch.randn(tokens, k, device="cuda", generator=g), 1)
    return x, idx, wts


def leftovers(moe, rank: int, world: int, copies: list[int]) -> list[dict]:
    """Non-empty elements in the peer-written parts of the lamport buffers (every half, every source but self)."""
    ll = moe.low_latency
    hidden = moe.hidden
    found = []
    land16 = ll.landing.view(torch.int16)
    land32 = ll.landing.view(torch.int32)
    back16 = ll.back.view(torch.int16)
    for h in copies:
        for q in range(world):
            if q == rank:
                continue
            data = land16[h, q, :, :hidden]
            meta = land32[h, q, :, moe.meta_col // 2:]
            back = back16[h, q]
            for name, buf, empty in (("data", data, E16), ("meta", meta, E32), ("back", back, E16)):
                bad = buf != empty
                rows = bad.any(dim=1).nonzero().flatten().tolist()
                for t in rows[:6]:
                    cols = bad[t].nonzero().flatten()
                    found.append(dict(buf=name, half=h, src=q, token=t, n=int(cols.numel()),
                                      first=cols[:4].tolist(), vals=buf[t][cols[:4]].tolist()))
                if len(rows) > 6:
                    found.append(dict(buf=name, half=h, src=q, more_rows=len(rows) - 6))
            for name, words in (("counts", ll.counts), ("back_counts", ll.back_counts)):
                w = words.view(torch.int32).view(2, world, -1, 2)[h, q, :, 0]
                bad = (w != E32).nonzero().flatten().tolist()
                if bad:
                    found.append(dict(buf=name, half=h, src=q, ctas=bad[:8], vals=w[bad[:8]].tolist()))
    return found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--skewed", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    ironlink.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    heap = ironlink.SymmetricHeap(1 << 30)
    moe = ironlink.MoeExchange(heap, a.tokens, a.hidden, a.topk, a.experts, path="low_latency")
    le = moe.local_experts
    log = []
    prev = None
    status = 0
    for i in range(a.calls):
        g = torch.Generator(device="cuda").manual_seed(1000 * (i // 2) + rank)  # each routing twice
        x, idx, wts = routing(g, a.tokens, a.hidden, a.experts, a.topk, a.skewed)
        err = None
        try:
            recv, counts, offsets, handle = moe.dispatch(x, idx, wts, check=False)
            rows = torch.arange(moe.capacity, device="cuda")
            scale = (rank * le + (rows // (world * a.tokens)).clamp(max=le - 1) + 1).to(torch.bfloat16)[:, None]
            out = moe.combine(recv * scale, handle, check=False)
            torch.cuda.synchronize()
            heap.check()
        except Exception as e:  # noqa: BLE001 - a probe: record and stop
            err = f"{type(e).__name__}: {e}"
            out = None
        ref = torch.zeros(a.tokens, a.hidden, dtype=torch.float64, device="cuda")
        for k in range(a.topk):
            ref += wts[:, k:k + 1].double() * (x.double() * (idx[:, k:k + 1].double() + 1))
        rel = None if out is None else float(((out.double() - ref).norm() / ref.norm()).item())
        same = None
        if out is not None and i % 2 == 1 and prev is not None:
            same = bool(torch.equal(out, prev))
        prev = out.clone() if out is not None else None
        left = leftovers(moe, rank, world, [(i + 2) % 3])  # read in call i - 1, emptied in call i
        rec = dict(call=i, rank=rank, rel=rel, repeat_same=same, error=err, left=left)
        bad = err is not None or (rel is not None and rel > 2e-2) or same is False or left
        if bad or i in (0, a.calls - 1):
            print(json.dumps(rec), flush=True)
        log.append(rec)
        if err is not None:
            status = 1
            break
        if bad:
            status = 1
    if a.out:
        with open(f"{a.out}.rank{rank}", "w") as f:
            json.dump(log, f)
    try:
        moe.close()
        heap.close()
    except Exception:  # noqa: BLE001
        pass
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
