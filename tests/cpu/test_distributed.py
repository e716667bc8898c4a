"""ironlink.runtime.distributed without a GPU: which GPU a rank takes, with and without shared GPUs."""

from __future__ import annotations

import pytest

from ironlink.runtime.distributed import ENV_SHARED_GPU, local_device_index, shared_gpu_allowed


def test_own_gpu_per_rank() -> None:
    assert [local_device_index(r, 4, shared=False) for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="LOCAL_RANK 4 has no GPU of its own"):
        local_device_index(4, 4, shared=False)


def test_one_visible_gpu_per_process() -> None:
    """A launcher that binds one GPU per process (CUDA_VISIBLE_DEVICES) leaves device 0 only."""
    assert [local_device_index(r, 1, shared=False) for r in range(4)] == [0, 0, 0, 0]


def test_shared_gpus_taken_in_turn() -> None:
    assert [local_device_index(r, 2, shared=True) for r in range(5)] == [0, 1, 0, 1, 0]
    assert [local_device_index(r, 1, shared=True) for r in range(3)] == [0, 0, 0]


def test_no_gpu() -> None:
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        local_device_index(0, 0, shared=True)


def test_shared_gpu_needs_the_exact_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SHARED_GPU, raising=False)
    assert not shared_gpu_allowed()
    monkeypatch.setenv(ENV_SHARED_GPU, "yes")
    assert not shared_gpu_allowed()
    monkeypatch.setenv(ENV_SHARED_GPU, "1")
    assert shared_gpu_allowed()
