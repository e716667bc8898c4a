#!/usr/bin/env bash
# Everything GPU-side in one go, for one device call: single-GPU basics, the symmetric-heap
# suite, the collectives suite for world sizes 2, 4, 8, then the benchmark (JSON under $OUT).
# Needs build/ (bitcode and the wheel from `make wheel`) carried from a machine with Rust.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/gpu/setup_native.sh || exit 1
export OUT=${OUT:-./build/gpu-out} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
mkdir -p "$OUT"
rc=0
echo "== basics (1 GPU)"
timeout 180 python3 -m pytest -q tests/gpu/test_basic.py > "$OUT/basic.log" 2>&1 || rc=1
tail -1 "$OUT/basic.log"
if [ "${IRONLINK_SKIP_HEAP:-0}" != 1 ]; then
  echo "== symmetric heap"
  timeout 280 python3 -m pytest -q -s tests/gpu/test_heap.py > "$OUT/heap.log" 2>&1 || rc=1
  grep -hE "HEAP SUITE" "$OUT/heap.log" | tail -3; tail -1 "$OUT/heap.log"
fi
echo "== collectives"
tests/gpu/run_collectives.sh || rc=1
echo "== host-level ops (ironlink.all_reduce / all_gather / reduce_scatter)"
n=$(nvidia-smi -L | wc -l)
timeout 240 torchrun --standalone --nproc_per_node="$n" tests/gpu/ops_worker.py > "$OUT/ops.log" 2>&1 || rc=1
grep -E "^== ops|FAILED" "$OUT/ops.log" | head -20
if [ "${IRONLINK_SKIP_BENCH:-0}" != 1 ]; then
  echo "== benchmark"
  OUT=$OUT timeout 300 bench/run.sh ${IRONLINK_BENCH_ARGS:-} > "$OUT/bench.log" 2>&1 || rc=1
  grep -E "all_reduce|all_gather|reduce_scatter" "$OUT/bench.log" | grep -v "symm_one_shot" | tail -70
fi
exit $rc
