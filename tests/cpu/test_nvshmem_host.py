"""ironlink._native opens NVSHMEM's host library at run time (libloading; nothing from NVSHMEM at
build time): here the PINNED 3.4.5 release's ``libnvshmem_host.so.3``, from the wheel that
tests/_nvshmem_wheel.py downloads and caches (skipped, saying so, when it cannot)."""

from __future__ import annotations

import pytest
from _native import load_native  # the same extension as the heap's CPU tests
from _nvshmem_wheel import extract


def test_native_loader_opens_the_pinned_host_library(tmp_path_factory: pytest.TempPathFactory) -> None:
    # ironlink._native opens libnvshmem_host.so.3 with libloading (no NVSHMEM at build time) and
    # finds the host API it calls; before nvshmem_init the library says "not initialized" (0), which
    # is what makes a module init outside an NVSHMEM job fail with a message instead of a crash.
    native = load_native(tmp_path_factory.mktemp("native"))
    host = extract("libnvshmem_host.so.3")
    assert native.nvshmem_init_status(str(host)) == 0
