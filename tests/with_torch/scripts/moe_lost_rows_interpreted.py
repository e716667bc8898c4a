"""MoeExchange's low-latency receive when a peer's count words arrive but its rows never do (a rank
that died mid-send): every CTA that waits for rows records TIMEOUT, the context names it, and a
CTA waits no more after its first timeout, so the call ends after about one timeout a CTA, not
one a row. Triton's interpreter on the CPU (TRITON_INTERPRET=1, set by
tests/with_torch/test_interpreted.py); its clock (`_interpreter_shims`) advances 1 us a reading,
so the readings the receive took count its polls. Exits non-zero with a message on a failure."""

from __future__ import annotations

import sys

import torch

import _interpreter_shims  # tests/with_torch/scripts/, beside this file
from _moe_sim import SimHeap, sim_heaps  # installs the shims

from ironlink.language import _abi
from ironlink.moe import MoeExchange
from ironlink.moe import exchange as exchange_mod
from ironlink.moe.low_latency import SIM_TIMEOUT_NS


def lost_rows(tokens: int, hidden: int) -> None:
    world, k, experts = 2, 2, 4
    heaps = sim_heaps(world, exchange_mod._heap_bytes(world, tokens, hidden, k, False, SimHeap.ALIGN,
                                                      path="low_latency"))
    ms = [MoeExchange(sh, tokens, hidden, k, experts, path="low_latency") for sh in heaps]
    g = torch.Generator().manual_seed(11)
    xs = [torch.randn(tokens, hidden, generator=g).to(torch.bfloat16) for _ in range(world)]
    ids = torch.tensor([[0, 1]] * tokens)  # every token to both of rank 0's experts
    w = torch.full((tokens, k), 0.5)
    for m, x in zip(ms, xs):
        m.low_latency.dispatch(x, ids, w, tokens, False, phase=1)
    ll = ms[0].low_latency
    # Rank 1's rows at rank 0 lost: every landing row empty again (rank 0's own are read without
    # a wait), the count words kept.
    counts = ll.counts.clone()
    ll._make_empty()
    ll.counts.copy_(counts)
    clock = _interpreter_shims._CLOCK[0]
    ll.dispatch(xs[0], ids, w, tokens, False, phase=2)
    readings = (_interpreter_shims._CLOCK[0] - clock) // 1000
    timeout = _abi.STATUS["TIMEOUT"]
    ctas = ll.ctas
    waiting = min(ctas, tokens)  # the CTAs with a row of rank 1's to wait for
    status = ll.sim_status[:ctas].tolist()
    assert status[:waiting] == [timeout] * waiting, f"CTA statuses {status}"
    error = ll.sim_ctx.view(torch.int32)[_abi.CONTEXT_FIELDS["error"][0] // 4]
    assert int(error) == timeout, f"context error {int(error)}, not TIMEOUT"
    # One timeout a waiting CTA (SIM_TIMEOUT_NS / 1 us readings), and a reading or two for each
    # other wait. Waiting on after a timeout took (2 + chunks) timeouts a row: 626 readings for
    # the 6 tokens below.
    per_timeout = SIM_TIMEOUT_NS // 1000
    rows_per_cta = -(-tokens // ctas)
    bound = waiting * (per_timeout + 2) + ctas * world * 4 + tokens * 8
    assert readings <= bound, (f"the receive took {readings} clock readings for {waiting} CTAs of {rows_per_cta} "
                               f"row(s) each (at most {bound}: one timeout a CTA)")
    print(f"ok: lost rows, {tokens} tokens on {ctas} CTAs: TIMEOUT on every waiting CTA, {readings} clock readings "
          f"(one timeout a CTA: {per_timeout} each)")


def main() -> int:
    lost_rows(tokens=6, hidden=40)  # the simulation's 2 CTAs: three rows each
    lost_rows(tokens=24, hidden=300)  # twelve rows each
    print("done: lost rows end in one timeout a CTA")
    return 0


if __name__ == "__main__":
    sys.exit(main())
