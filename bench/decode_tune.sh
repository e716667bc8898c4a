#!/usr/bin/env bash
# The decode tables and their probes in one GPU call (issue 60): the tuner at each world size
# (`python -m ironlink.tune`, writing $OUT/decode-wN.json: what runtime/tables/ commits), then
# bench/decode_probe.py (steady state against a replay's start skew) at the largest world and on
# pairs of GPUs, and bench/rmsnorm_timeline.py's split slices (8 against 16 a row).
#   bench/decode_tune.sh "4 2"        (worlds; world 2 on the first two GPUs)
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/gpu/setup_native.sh || exit 1
export OUT=${OUT:-build/decode_tune} PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
mkdir -p "$OUT"
worlds=${1:-"4 2"}
gpus() { seq -s, 0 $(($1 - 1)); }
for w in $worlds; do
  CUDA_VISIBLE_DEVICES=$(gpus "$w") timeout 240 torchrun --standalone --nproc_per_node="$w" -m ironlink.tune \
    --out "$OUT/decode-w$w.json" 2>&1 | tr '\r' '\n' | grep -vE "^(rmsnorm|all_reduce) [0-9]+/" | tail -40
done
top=$(echo $worlds | tr ' ' '\n' | sort -n | tail -1)
CUDA_VISIBLE_DEVICES=$(gpus "$top") timeout 150 torchrun --standalone --nproc_per_node="$top" bench/decode_probe.py \
  --out "$OUT/decode-probe-w$top.json" 2>&1 | grep '"contender"'
for pair in 0,2 2,3; do
  CUDA_VISIBLE_DEVICES=$pair timeout 60 torchrun --standalone --nproc_per_node=2 bench/decode_probe.py --tokens 1 \
    --modes split --out "$OUT/decode-probe-pair${pair/,/}.json" 2>&1 | grep '"contender"' | sed "s/^/pair $pair: /"
done
