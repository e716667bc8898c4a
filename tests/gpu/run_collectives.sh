#!/usr/bin/env bash
# The collectives GPU suite (tests/gpu/collectives_worker.py) for each world size that fits the
# local GPUs; prints one pytest-style summary line per world size and exits non-zero on failure.
#   tests/gpu/run_collectives.sh            # worlds 2 4 8
#   IRONLINK_WORLDS="8" IRONLINK_GPU_FULL=0 tests/gpu/run_collectives.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/gpu/setup_native.sh || exit 1
OUT=${OUT:-./build/gpu-out}
mkdir -p "$OUT"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
ngpu=$(nvidia-smi -L | wc -l)
rc=0
for w in ${IRONLINK_WORLDS:-2 4 8}; do
  [ "$w" -le "$ngpu" ] || { echo "world $w: skipped ($ngpu GPUs)"; continue; }
  timeout "${IRONLINK_WORLD_TIMEOUT:-240}" torchrun --standalone --nproc_per_node="$w" \
    tests/gpu/collectives_worker.py > "$OUT/collectives-w$w.log" 2>&1
  r=$?
  [ $r -eq 0 ] || rc=1
  grep -E "^== world|^FAILED" "$OUT/collectives-w$w.log" | head -30
  [ $r -eq 0 ] || { echo "world $w: exit $r; last lines:"; tail -25 "$OUT/collectives-w$w.log"; }
done
exit $rc
