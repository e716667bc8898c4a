"""`init_distributed()`: the start of a torchrun worker that uses ironlink.

Every example, test worker and benchmark starts the same way: this rank's GPU becomes the
current device, then the default process group starts on NCCL, bound to that device (PyTorch's
NVSHMEM team manager keeps the first device it sees, so the order matters).

With $IRONLINK_SHARED_GPU=1 (``ENV_SHARED_GPU``) ranks may outnumber the GPUs: they
take the GPUs in turn (LOCAL_RANK modulo the GPU count) and the group runs on gloo, since NCCL
refuses two ranks on one GPU. That serves multi-rank tests on a machine with fewer GPUs, under
CUDA MPS so that every rank's kernels run at once, each rank confined to its share of the SMs
(``mps_confined``; ``tests/gpu/run.sh --shared-gpu``, docs/gpu-testing.md): results are checked
the same, times mean nothing.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from typing import Any, Optional

from ..language._abi import MAX_CTAS

# Set to 1, lets ranks share a GPU: for running multi-rank tests on fewer GPUs under CUDA MPS
# (`tests/gpu/run.sh --shared-gpu`; docs/gpu-testing.md). Results are checked the same; times mean
# nothing there. Without it, two ranks on one GPU is an error (it is a launcher mistake).
ENV_SHARED_GPU = "IRONLINK_SHARED_GPU"


def shared_gpu_allowed() -> bool:
    """Whether $IRONLINK_SHARED_GPU lets ranks share a GPU."""
    return os.environ.get(ENV_SHARED_GPU, "0") == "1"


def local_device_index(local_rank: int, gpus: int, shared: bool) -> int:
    """The GPU a rank uses: its own (GPU `local_rank`, or the only one a launcher that binds a GPU
    per process, such as Slurm's --gpus-per-task=1, left visible), or, when ranks share GPUs,
    the GPUs in turn. (Two ranks that end up on one GPU without the shared setting are refused
    when they make a heap.)"""
    if gpus < 1:
        raise RuntimeError("ironlink needs a CUDA GPU (torch.cuda.device_count() is 0)")
    if shared:
        return local_rank % gpus
    if gpus == 1:
        return 0
    if local_rank >= gpus:
        raise RuntimeError(
            f"LOCAL_RANK {local_rank} has no GPU of its own ({gpus} visible); start at most {gpus} "
            "ranks per node (or set IRONLINK_SHARED_GPU=1 to test several ranks per GPU under MPS)"
        )
    return local_rank


def init_distributed(timeout: Optional[timedelta] = None, local_rank: Optional[int] = None, **group: Any) -> Any:
    """Selects this rank's GPU (`local_rank`, default $LOCAL_RANK, else 0) and starts the default
    process group on it; returns the ``torch.device``. `group`: more arguments for
    ``torch.distributed.init_process_group`` (a store, rank and world size where no launcher set
    the environment). A group that already exists is kept. Then, where $IRONLINK_COMPILE_AHEAD
    or $IRONLINK_COMPILE_RECORD name folders, the program's recorded kernels compile ahead and
    its compiles are recorded (`compile_records`)."""
    import torch
    import torch.distributed as dist

    warn_unless_confined()
    shared = shared_gpu_allowed()
    local = int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank
    device = torch.device("cuda", local_device_index(local, torch.cuda.device_count(), shared))
    torch.cuda.set_device(device)
    if not dist.is_initialized():
        kwargs: dict[str, Any] = dict(group) if timeout is None else dict(group, timeout=timeout)
        if shared:
            dist.init_process_group("gloo", **kwargs)
        else:
            dist.init_process_group("nccl", device_id=device, **kwargs)
    from . import compile_records  # Triton is imported there: only when a worker starts

    major, minor = torch.cuda.get_device_capability(device)
    compile_records.start_program(dist.get_rank(), dist.get_world_size(),
                                  int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())), shared,
                                  major * 10 + minor)
    return device


def ranks_per_gpu() -> int:
    """How many of this node's ranks share each GPU: 1, or with $IRONLINK_SHARED_GPU=1 the node's
    ranks ($LOCAL_WORLD_SIZE, set by torchrun) over its GPUs, rounded up."""
    if not shared_gpu_allowed():
        return 1
    import torch

    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(1, -(-local_world // max(1, torch.cuda.device_count())))


# CUDA MPS's limit on the share of a GPU's SMs one client's kernels may occupy at once (a
# percentage, read when the client's context is made; the GPU then reports that many SMs).
ENV_MPS_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def mps_confined(ranks: int) -> bool:
    """Whether MPS confines each of `ranks` ranks sharing a GPU to its own share of the SMs:
    $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE at most 100 / ranks, so that the shares add up to at
    most the GPU (NVSHMEM asks the same of PEs sharing a GPU). Unconfined, eight ranks on two
    H200s, each rank's grids within a quarter of the SMs, stalled in matmul_all_reduce while
    GPU-mates ran MoE kernels; confined to 25 % each they passed (docs/record.md, session 60)."""
    try:
        percentage = float(os.environ.get(ENV_MPS_PERCENTAGE, ""))
    except ValueError:
        return False
    return 0 < percentage * ranks <= 100


def unconfined_sharing() -> Optional[str]:
    """What is wrong where ranks share a GPU that MPS does not confine them on (`mps_confined`),
    else None: the warning of `init_distributed`, and the end of a TIMEOUT's message."""
    ranks = ranks_per_gpu()
    if ranks == 1 or mps_confined(ranks):
        return None
    return (f"{ranks} ranks share each GPU but MPS does not confine them to their share of its SMs: set "
            f"{ENV_MPS_PERCENTAGE}={100 // ranks} (at most 100 / ranks) for every rank before it starts, "
            "or waits on peers can time out (eight ranks on two H200s stalled unconfined; docs/gpu-testing.md)")


def warn_unless_confined() -> None:
    """A warning where ranks share a GPU that MPS does not confine them on (`unconfined_sharing`)."""
    why = unconfined_sharing()
    if why is not None:
        warnings.warn(why, stacklevel=3)


# Where ranks share a GPU, a rank's grids are its share of the SMs over this: GPU-mates' CTAs do
# not pack into disjoint SMs even under MPS's confinement (a limit, not a reservation). Measured
# with CTAs of one an SM (16 warps, 128 registers a thread, as the fused kernels): 4 clients
# confined to 25 % of an H200 (32 SMs reported) each started a grid of 16 or 24 CTAs at once
# 3 times of 3, but one client's grid of 28 or 32 had CTAs wait 200 ms for an SM every time
# (bench/probes/mps_sm_sets_probe.py, docs/record.md session 62). Half leaves room for that and for
# the CTAs of GPU-mates' NCCL kernels.
SHARED_GPU_SM_DIVISOR = 2


def sm_share(device: Any) -> int:
    """The SMs one rank's kernels may count on: the GPU's, or a part of its share when ranks share
    it. A kernel whose CTAs wait for each other or for a peer's CTAs (a grid barrier, a
    collective) launches at most this many CTAs, so that every rank's CTAs are resident at once:
    one CTA per SM fits any kernel that launches, and a CTA waiting for one that cannot be
    scheduled would time out. A rank's share is what the GPU reports where MPS confines the rank
    (`mps_confined`), else the GPU's SMs over the ranks on it; its grids take that share over
    SHARED_GPU_SM_DIVISOR."""
    import torch

    sms = int(torch.cuda.get_device_properties(device).multi_processor_count)
    ranks = ranks_per_gpu()
    if ranks == 1:
        return sms
    share = sms if mps_confined(ranks) else sms // ranks
    return max(1, share // SHARED_GPU_SM_DIVISOR)


def grid_cap(device: Any) -> int:
    """The most CTAs a collective of this rank may launch: MAX_CTAS, or with ranks sharing a GPU
    their share of its SMs (`sm_share`)."""
    return sm_share(device) if ranks_per_gpu() > 1 else MAX_CTAS
