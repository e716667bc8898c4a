#!/usr/bin/env bash
# bench/probes/mps_sm_sets_probe.py on GPU 0 under CUDA MPS, $1 clients (default 4) confined as
# tests/gpu/run.sh --shared-gpu confines them (mps_confine), each run stopped after 120 s; then
# the same unconfined. Grids of the reported SMs: 16 and 32 warps a CTA of few registers, and 16
# warps of 128 registers a thread (one CTA an SM, as the fused kernels of 16 warps). Output to stdout.
clients=${1:-4}
here=$(dirname "$0")
source "$here/../../tests/gpu/mps.sh"
start_mps || exit 1
py=$(command -v python3)
for confined in yes no; do
  if [ $confined = yes ]; then mps_confine "$clients"; else unset CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; fi
  for shape in 16:0 32:0 16:65536; do
    warps=${shape%:*} heavy=${shape#*:}
    echo "## $clients clients, confined: $confined (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-unset}), $warps warps, $heavy values held"
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout -s KILL 120 "$py" "$here/mps_sm_sets_probe.py" \
      --clients "$clients" --warps "$warps" --heavy "$heavy"
    echo "probe exit: $?"
  done
done
stop_mps
"$here/../../tests/gpu/stop_leftovers.sh" > /dev/null 2>&1
