#!/usr/bin/env bash
# Runs a benchmark program bench/<name>.py on the local GPUs under torchrun and writes
# $OUT/<name>-<n>x<gpu>-<date>.json (default OUT: bench/results). Extra arguments go to the program:
#   bench/run_py.sh fused --ops matmul_allreduce --ms 1024,4096
#   bench/run_py.sh moe --tokens 128,4096
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/gpu/setup_native.sh || exit 1
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
n=${NGPU:-$(nvidia-smi -L | wc -l)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
prog=${1:?usage: bench/run_py.sh NAME [ARGS...] (runs bench/NAME.py)}
shift
name="$OUT/${prog}-${n}x${gpu}-$(date -u +%Y%m%d-%H%M%S).json"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
torchrun --standalone --nproc_per_node="$n" "bench/${prog}.py" --out "$name" "$@"
