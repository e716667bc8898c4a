"""A stand-in for torch.distributed's key-value store (a helper, no tests of its own): the reports
that ranks exchange through it (`runtime.store_exchange`) meet in a dict, across threads."""

from __future__ import annotations

import threading
from datetime import timedelta


class FakeStore:
    """torch.distributed.Store's set / get / check / wait over a dict, shared by threads."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self.cond:
            self.data[key] = value
            self.cond.notify_all()

    def get(self, key: str) -> bytes:
        with self.cond:
            return self.data[key]

    def check(self, keys: list[str]) -> bool:
        with self.cond:
            return all(k in self.data for k in keys)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: all(k in self.data for k in keys), timeout.total_seconds()):
                raise RuntimeError("Socket Timeout")

    def delete_key(self, key: str) -> bool:
        with self.cond:
            return self.data.pop(key, None) is not None
