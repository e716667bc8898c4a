#!/usr/bin/env bash
# bench/probes/copy_engine_shared_probe.py at world 2 on one GPU under CUDA MPS (the ranks share
# it as tests/gpu/run.sh --shared-gpu has them do), stopped after $1 seconds (default 130), then
# whatever it left stopped; output to stdout. Each rank confined to half the SMs (mps_confine),
# as run.sh does, unless $2 is "unconfined" (as every run before session 60 was).
limit=${1:-130}
here=$(dirname "$0")
source "$here/../../tests/gpu/mps.sh"
start_mps || exit 1
[ "${2:-}" = unconfined ] || mps_confine 2
# Both ranks on GPU 0 (on a machine of several GPUs they would each take one).
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout -s KILL "$limit" torchrun --standalone --nproc_per_node=2 \
  "$here/copy_engine_shared_probe.py"
echo "probe exit: $?"
"$here/../../tests/gpu/stop_leftovers.sh"
