#!/usr/bin/env bash
# bench/probes/copy_engine_shared_probe.py at world 2 on one GPU under CUDA MPS (the ranks share
# it as --shared-gpu does), stopped after $1 seconds (default 130); output to stdout.
limit=${1:-130}
export IRONLINK_SHARED_GPU=1 CUDA_MPS_PIPE_DIRECTORY=/tmp/ironlink-mps CUDA_MPS_LOG_DIRECTORY=/tmp/ironlink-mps-log \
  NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
timeout -s KILL "$limit" torchrun --standalone --nproc_per_node=2 "$(dirname "$0")/copy_engine_shared_probe.py"
echo "probe exit: $?"
"$(dirname "$0")/../../tests/gpu/stop_leftovers.sh"
