"""Shared by the torchrun GPU workers: run named cases, count a case as passed only when it
passed on every rank, and keep going after a failure so one run reports everything."""

from __future__ import annotations

import traceback
from typing import Callable

import torch
import torch.distributed as dist


class Cases:
    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.passed = 0
        self.failed: list[str] = []

    def run(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
            ok = torch.tensor([1], device="cuda")
        except Exception as e:  # noqa: BLE001 - a failed case is reported, the suite goes on
            ok = torch.tensor([0], device="cuda")
            if not isinstance(e, AssertionError):
                traceback.print_exc()
            print(f"[rank {self.rank}] FAILED {name}: {e}", flush=True)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)  # a case passes only if it passed on every rank
        if ok.item():
            self.passed += 1
        else:
            self.failed.append(name)
