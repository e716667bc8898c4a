#!/usr/bin/env bash
# A/B of device builds in one GPU session: the benchmark once per bitcode directory, same GPUs,
# NCCL measured again in each run. JSON per directory under $OUT (default build/ab).
#   IRONLINK_GIT_REV=$(git rev-parse --short HEAD) bench/ab.sh build build/pull -- --min-bytes 16777216 --dtypes bf16 --skip-gather-scatter
# (build the variant into its own directory first, e.g. from another checkout; $AB_TAG suffixes
# the JSON names; pass IRONLINK_GIT_REV: the device copy of the tree may not know its revision.)
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/gpu/setup_native.sh || exit 1
OUT=${OUT:-build/ab}
mkdir -p "$OUT"
dirs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do dirs+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
# One Triton cache per build: kernels compiled against one bitcode must not serve another.
n=${NGPU:-$(nvidia-smi -L | wc -l)}
rc=0
for d in "${dirs[@]}"; do
  name=$(echo "$d" | tr '/' '-')${AB_TAG:-}
  echo "== $d"
  TRITON_CACHE_DIR=/tmp/ironlink-ab-cache-$name IRONLINK_BITCODE_DIR=$d torchrun --standalone --nproc_per_node="$n" bench/allreduce.py \
    --out "$OUT/ab-$name.json" "$@" 2>&1 | grep -E "all_reduce|all_gather|reduce_scatter" || rc=1
done
exit $rc
