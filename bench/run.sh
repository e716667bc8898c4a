#!/usr/bin/env bash
# The one runner of the benchmarks: bench/<NAME>.py on the local GPUs under torchrun (a machine
# with torch; the extension comes from build/dist, see tests/gpu/setup_native.sh), writing
# $OUT/<NAME>-<n>x<gpu>-<date>.json (default OUT: bench/results). NAME defaults to allreduce;
# the arguments after it go to the program:
#   bench/run.sh                                      # allreduce: all local GPUs, 1 KiB .. 1 GiB
#   bench/run.sh --max-bytes 268435456 --dtypes bf16  # allreduce with arguments
#   bench/run.sh fused --ops matmul_allreduce --ms 1024,4096
#   bench/run.sh moe --tokens 128,4096
set -uo pipefail
cd "$(dirname "$0")/.."
prog=allreduce
if [ $# -gt 0 ] && [[ $1 != -* ]]; then prog=$1; shift; fi
[ -f "bench/${prog}.py" ] || { echo "bench/run.sh: no bench/${prog}.py (usage: bench/run.sh [NAME] [ARGS...])" >&2; exit 2; }
source tests/gpu/setup_native.sh || exit 1
program_records "${OUT:-}"  # records only where $OUT is given (a GPU machine's run), not into bench/results
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
n=${NGPU:-$(nvidia-smi -L | wc -l)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
name="$OUT/${prog}-${n}x${gpu}-$(date -u +%Y%m%d-%H%M%S).json"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
torchrun --standalone --nproc_per_node="$n" "bench/${prog}.py" --out "$name" "$@"
rc=$?
pack_program_records "$OUT"
exit $rc
