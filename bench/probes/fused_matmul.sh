#!/usr/bin/env bash
# The matmul + all-reduce run behind docs/fused.md, on the local GPUs (one call of a GPU machine):
# correctness of every method (the fusion suite's matmul_all_reduce cases), the benchmark
# (bench/fused.py --ops matmul_allreduce), the per-CTA timeline (bench/probes/fused_timeline.py) and the
# peer-bandwidth curve by CTA count (bench/probes/nvlink_probe.py push_one / pull_one), and on request
# the cost of one tile signal (bench/probes/signal_probe.py) and the GEMM alone by loop structure
# (bench/probes/gemm_probe.py). Logs and JSON under $OUT (default build/gpu-out). Parts: check bench
# timeline probe (default: these four), signal, gemm.
#   bench/probes/fused_matmul.sh                 # everything
#   bench/probes/fused_matmul.sh bench timeline  # only these
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/gpu/setup_native.sh || exit 1
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache} PYTHONUNBUFFERED=1
n=$(nvidia-smi -L | wc -l)
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(check bench timeline probe)
status=0
for part in "${parts[@]}"; do
  start=$(date +%s)
  case "$part" in
    check)
      IRONLINK_GPU_ONLY="matmul_all_reduce" OUT="$OUT" timeout 400 tests/gpu/run.sh fusion --worlds "$n" \
        > "$OUT/check.log" 2>&1 || status=1
      grep -E "^== |FAILED|passed" "$OUT/check.log" | tail -8 ;;
    bench)
      OUT="$OUT" timeout 300 bench/run.sh fused --ops matmul_allreduce ${FUSED_ARGS:-} > "$OUT/bench.log" 2>&1 || status=1
      grep -E "matmul_allreduce" "$OUT/bench.log" | sed 's/^ *//' | tail -40 ;;
    timeline)
      timeout 200 torchrun --standalone --nproc_per_node="$n" bench/probes/fused_timeline.py --ms "${TIMELINE_MS:-1024,4096}" --staggers "${STAGGERS:-1,8}" --tma-push "${TMA_PUSH:-0,1}" \
        --shots "${SHOTS:-one,two}" --signal-at "${SIGNAL_AT:-0.5,1.0}" --flat "${FLAT:-0,1}" \
        --out "$OUT/timeline.json" > "$OUT/timeline.log" 2>&1 || status=1
      grep -E '^\{' "$OUT/timeline.log" | cut -c1-400 ;;
    probe)
      timeout 200 torchrun --standalone --nproc_per_node="$n" bench/probes/nvlink_probe.py --heap ironlink \
        --patterns push_one,pull_one --grids 1,2,4,8,16,32,132 --warps 8 --egress $((64 << 20)) \
        --out "$OUT/probe.json" > "$OUT/probe.log" 2>&1 || status=1
      grep -E '"unroll": 4' "$OUT/probe.log" | cut -c1-200 ;;
    signal)
      timeout 200 torchrun --standalone --nproc_per_node=2 bench/probes/signal_probe.py --out "$OUT/signal-probe.json" \
        > "$OUT/signal.log" 2>&1 || status=1
      grep -E '^\{' "$OUT/signal.log" | cut -c1-200 ;;
    gemm)
      timeout 300 torchrun --standalone --nproc_per_node="$n" bench/probes/gemm_probe.py --out "$OUT/gemm-probe.json" \
        > "$OUT/gemm.log" 2>&1 || status=1
      grep -E '^\{' "$OUT/gemm.log" | cut -c1-200 ;;
    *) echo "unknown part $part"; status=1 ;;
  esac
  echo "== $part: $(( $(date +%s) - start )) s"
done
exit $status
