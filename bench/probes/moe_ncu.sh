#!/usr/bin/env bash
# A profile, not a benchmark: Nsight Compute's DRAM counters for the MoE direct path's two copy
# kernels (pull_rows: dispatch, reduce_push: combine) at 4096 tokens per rank, both ranks
# profiled, one launch of each per rank. Single-pass metrics (no kernel replay, which would
# leave the peer waiting) and --clock-control none (the clocks stay as they are).
#   OUT=/tmp/r bench/probes/moe_ncu.sh        # writes $OUT/moe-ncu.csv
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/gpu/setup_native.sh || exit 1
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
NCU=${NCU:-/usr/local/cuda/bin/ncu}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
n=${NGPU:-$(nvidia-smi -L | wc -l)}
"$NCU" --target-processes all --clock-control none --cache-control none -k regex:'pull_rows|reduce_push' -c 4 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  --csv --page raw \
  torchrun --standalone --nproc_per_node="$n" bench/moe.py --tokens 4096 --no-nvshmem --no-fp8 --sms 0 \
  > "$OUT/moe-ncu.csv" 2> "$OUT/moe-ncu.err"
