#!/usr/bin/env bash
# Issue 60's last call of a session: the fan-out probe at world 4 (bench/decode_probe.py), then the
# decode cases (all_reduce_rmsnorm in every mode; the all_reduce op) at world 8 on the 4 GPUs
# (--shared-gpu: correctness only). Logs and JSON under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-build/decode_w8} PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
mkdir -p "$OUT"
( source tests/gpu/setup_native.sh && timeout 75 torchrun --standalone --nproc_per_node=4 bench/decode_probe.py \
    --tokens 1 --modes split --reps 9 --out "$OUT/decode-probe-fanout-w4.json" 2>&1 | grep -E '"contender"' )
timeout ${W8_LIMIT_S:-300} tests/gpu/run.sh fusion ops --shared-gpu --worlds 8 --quick --only all_reduce_rmsnorm \
  > "$OUT/suites-w8.log" 2>&1
echo "w8 shared rc=$?"; grep -E "^== |^FAILED" "$OUT/suites-w8.log" | head -30
