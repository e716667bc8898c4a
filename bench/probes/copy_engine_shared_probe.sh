#!/usr/bin/env bash
# bench/probes/copy_engine_shared_probe.py at world 2 on one GPU under CUDA MPS (the ranks share
# it as tests/gpu/run.sh --shared-gpu has them do), stopped after $1 seconds (default 130), then
# whatever it left stopped; output to stdout.
limit=${1:-130}
here=$(dirname "$0")
source "$here/../../tests/gpu/mps.sh"
start_mps || exit 1
timeout -s KILL "$limit" torchrun --standalone --nproc_per_node=2 "$here/copy_engine_shared_probe.py"
echo "probe exit: $?"
"$here/../../tests/gpu/stop_leftovers.sh"
