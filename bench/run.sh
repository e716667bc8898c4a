#!/usr/bin/env bash
# Runs the side-by-side benchmark on the local GPUs (a machine with torch; the extension comes from
# build/dist, see tests/gpu/setup_native.sh) and writes JSON under $OUT (default bench/results).
#   bench/run.sh                      # all local GPUs, 1 KiB .. 1 GiB, bf16 and fp32
#   bench/run.sh --max-bytes 268435456 --dtypes bf16
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/gpu/setup_native.sh || exit 1
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
n=${NGPU:-$(nvidia-smi -L | wc -l)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
name="$OUT/allreduce-${n}x${gpu}-$(date -u +%Y%m%d-%H%M%S).json"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
torchrun --standalone --nproc_per_node="$n" -m ironlink.bench --out "$name" "$@"
