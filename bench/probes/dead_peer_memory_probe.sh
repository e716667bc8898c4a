#!/usr/bin/env bash
# bench/probes/dead_peer_memory_probe.py twice: both ranks on GPU 0 under CUDA MPS (as
# tests/gpu/run.sh --shared-gpu places GPU-mates), then on GPUs 0 and 1 without MPS; each run
# stopped after $1 seconds (default 150), whatever it left stopped. JSON under $OUT.
limit=${1:-150}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../../tests/gpu/setup_native.sh" || exit 1  # the wheel's extension, PYTHONPATH, multicast off
source "$here/../../tests/gpu/mps.sh"
start_mps || exit 1
timeout -s KILL "$limit" python3 "$here/dead_peer_memory_probe.py"
echo "one GPU under MPS: exit $?"
stop_mps
"$here/../../tests/gpu/stop_leftovers.sh"
unset IRONLINK_SHARED_GPU CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
timeout -s KILL "$limit" python3 "$here/dead_peer_memory_probe.py"
echo "two GPUs: exit $?"
"$here/../../tests/gpu/stop_leftovers.sh"
