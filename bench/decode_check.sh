#!/usr/bin/env bash
# Issue 60 at world 4 in one GPU call: the GPU suite's all_reduce_rmsnorm cases (every mode, the
# decode token counts, FP8 out), then bench/fused.py's all_reduce_rmsnorm (every mode side by side)
# and bench/allreduce.py's small messages with the lamport path's grids. Logs and JSON under $OUT.
#   bench/decode_check.sh [WORLD]        (default 4)
set -uo pipefail
cd "$(dirname "$0")/.."
world=${1:-4}
export OUT=${OUT:-build/decode_check} PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
mkdir -p "$OUT"
tests/gpu/run.sh fusion --worlds "$world" --quick --only all_reduce_rmsnorm > "$OUT/fusion-w$world.log" 2>&1
echo "fusion suite (all_reduce_rmsnorm) rc=$?"; grep -E "^== |FAILED" "$OUT/fusion-w$world.log" | head -30

NGPU=$world bench/run_py.sh fused --ops allreduce_rmsnorm 2>&1 | grep -E "allreduce_rmsnorm" > "$OUT/fused-w$world.log"
NGPU=$world bench/run.sh --sizes 1024,4096,16384,65536,262144 --dtypes bf16 --skip-gather-scatter \
  --lamport-grids 512x1,1024x2,1024x4,4096x4,4096x8 2>&1 | grep -E "all_reduce" > "$OUT/allreduce-w$world.log"
