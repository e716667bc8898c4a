#!/usr/bin/env bash
# A/B of device builds in one GPU session: a benchmark once per bitcode directory, same GPUs,
# its other contenders (NCCL, torch) measured again in each run. JSON per directory under $OUT
# (default build/ab). The program is bench/allreduce.py unless $AB_PROG names another by its path
# under bench/ without .py (bench/$AB_PROG.py, e.g. fused or probes/rmsnorm_timeline); its lines
# matching $AB_GREP are shown.
#   IRONLINK_GIT_REV=$(git rev-parse --short HEAD) bench/probes/ab.sh build build/pull -- --min-bytes 16777216 --dtypes bf16 --skip-gather-scatter
#   AB_PROG=fused AB_GREP=allreduce_rmsnorm bench/probes/ab.sh build/old build -- --ops allreduce_rmsnorm
# (build the variant into its own directory first, e.g. from another checkout; $AB_TAG suffixes
# the JSON names; pass IRONLINK_GIT_REV: the device copy of the tree may not know its revision.)
# A directory holding python/ironlink is a Python tree instead (Triton kernels changed, not the
# device library): its package runs against this tree's bitcode and native extension, e.g.
#   git archive HEAD~1 python | tar -x -C build/ab_old   (carry build/ab_old)
#   AB_PROG=moe AB_GREP=4096 bench/probes/ab.sh build/ab_old . build/ab_old . -- --tokens 4096
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/gpu/setup_native.sh || exit 1
OUT=${OUT:-build/ab}
mkdir -p "$OUT"
dirs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do dirs+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
# One Triton cache per build: kernels compiled against one bitcode must not serve another.
n=${NGPU:-$(nvidia-smi -L | wc -l)}
prog=${AB_PROG:-allreduce}
[ -f "bench/$prog.py" ] || { echo "no bench/$prog.py (AB_PROG is a path under bench/ without .py)" >&2; exit 2; }
pattern=${AB_GREP:-"all_reduce|all_gather|reduce_scatter"}
rc=0
i=0
for d in "${dirs[@]}"; do
  i=$((i + 1))
  name=$i-$(echo "$d" | tr '/.' '--')${AB_TAG:-}
  echo "== $d"
  bitcode=$d py=$PYTHONPATH
  if [ -d "$d/python/ironlink" ]; then
    bitcode=build py=$PWD/$d/python:$PWD/bench
    cp python/ironlink/_native*.so "$d/python/ironlink/" 2>/dev/null
  fi
  PYTHONPATH=$py TRITON_CACHE_DIR=/tmp/ironlink-ab-cache-$name IRONLINK_BITCODE_DIR=$bitcode torchrun --standalone --nproc_per_node="$n" "bench/$prog.py" \
    --out "$OUT/ab-${prog##*/}-$name.json" "$@" 2>&1 | grep -E "$pattern" || rc=1
done
exit $rc
