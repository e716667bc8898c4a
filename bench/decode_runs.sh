#!/usr/bin/env bash
# Issue 60's checks and committed runs with the decode tables in place, one GPU call: the GPU
# suites' all-reduce cases (fusion: all_reduce_rmsnorm in every mode; ops: ironlink.all_reduce,
# its lamport path forced too) at worlds 4 and 2, bench/fused.py's all_reduce_rmsnorm at 4 and at
# 2 (first two GPUs), then bench/decode_probe.py's fan-out probe. JSON and logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-build/decode_runs} PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
mkdir -p "$OUT"
tests/gpu/run.sh fusion ops --worlds "4 2" --quick --only all_reduce > "$OUT/suites.log" 2>&1
echo "suites rc=$?"; grep -E "^== |^FAILED" "$OUT/suites.log" | head -30
NGPU=4 bench/run_py.sh fused --ops allreduce_rmsnorm 2>&1 | grep -E "ironlink_fused |nccl_torch" | cut -c1-110
CUDA_VISIBLE_DEVICES=0,1 NGPU=2 bench/run_py.sh fused --ops allreduce_rmsnorm 2>&1 | grep -E "ironlink_fused |nccl_torch" | cut -c1-110
source tests/gpu/setup_native.sh
for w in 4 2; do
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((w - 1))) timeout 90 torchrun --standalone --nproc_per_node=$w bench/decode_probe.py \
    --tokens 1 --modes split --out "$OUT/decode-probe-fanout-w$w.json" 2>&1 | grep -E '"contender": "(fanout|ironlink_op|ironlink_fused)'
done
