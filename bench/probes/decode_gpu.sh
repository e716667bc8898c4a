#!/usr/bin/env bash
# The decode path's GPU work in one call (issue 60): steps run in the order given, each on the
# local GPUs, logs and JSON under $OUT (default build/decode). World W runs on the first W GPUs.
#
#   bench/probes/decode_gpu.sh tune "4 2" probe 4 pairs "0,2 2,3"
#   bench/probes/decode_gpu.sh ab build/ab_old .        (git archive OLD python | tar -x -C build/ab_old; carry build/)
#
# Steps:
#   tune WORLDS     the tuner (`python -m ironlink.tune`) at each world: $OUT/decode-wW.json, what
#                   python/ironlink/runtime/tuning/tables/ commits
#   suites WORLDS   the GPU suites' all-reduce cases (fusion: all_reduce_rmsnorm in every mode,
#                   matmul_all_reduce; ops: ironlink.all_reduce, its lamport path forced too)
#   bench WORLDS    bench/fused.py's all_reduce_rmsnorm and bench/allreduce.py's messages up to
#                   256 KiB with the lamport path's grids
#   probe WORLDS    bench/probes/decode_probe.py: steady state against a replay's start, the
#                   exchange probes (fan-out, copies), the rmsnorm default and split at 1 to 128
#                   tokens ($PROBE_ARGS replaces its arguments: "--reps 15 --tokens=" for the
#                   exchange probes and the 1 and 16 KiB all-reduces only)
#   timeline WORLDS bench/probes/rmsnorm_timeline.py: per-CTA phases of split, lamport and two_shot
#                   at 1, 32 and 128 tokens (split also over 16 slices a row)
#   fp8 WORLDS      bench/probes/rmsnorm_timeline.py --fp8: per-CTA phases of two_shot and rows at 32,
#                   128 and 512 tokens, bf16 against FP8 out (where an FP8 out's extra time goes)
#   pairs PAIRS     bench/probes/decode_probe.py at world 2 on each pair of GPUs ("0,2 2,3")
#   shared8         the fusion suite's all_reduce_rmsnorm cases at world 8 on these GPUs
#                   (--shared-gpu: correctness only; $W8_LIMIT_S bounds it, default 300)
#   ab OLD NEW      two Python trees against one bitcode (bench/probes/ab.sh) at world 4:
#                   bench/probes/rmsnorm_timeline.py (lamport; split over 8 slices) and bench/allreduce.py
#                   up to 64 KiB
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/gpu/setup_native.sh || exit 1
export OUT=${OUT:-build/decode} PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
mkdir -p "$OUT"
program_records "$OUT"
gpus() { seq -s, 0 $(($1 - 1)); }
on() { local w=$1; shift; CUDA_VISIBLE_DEVICES=$(gpus "$w") NGPU=$w "$@"; }

tune() {
  for w in $1; do
    on "$w" timeout 240 torchrun --standalone --nproc_per_node="$w" -m ironlink.tune --out "$OUT/decode-w$w.json" 2>&1 |
      tr '\r' '\n' | grep -vE "^(rmsnorm|all_reduce) [0-9]+/" | tail -40
  done
}

suites() {
  tests/gpu/run.sh fusion ops --worlds "$1" --quick --only all_reduce > "$OUT/suites.log" 2>&1
  echo "suites rc=$?"; grep -E "^== |^FAILED" "$OUT/suites.log" | head -30
}

bench() {
  for w in $1; do
    on "$w" bench/run.sh fused --ops allreduce_rmsnorm 2>&1 | grep -E "ironlink_fused |nccl_torch" | cut -c1-110
    on "$w" bench/run.sh --sizes 1024,4096,16384,65536,262144 --dtypes bf16 --skip-gather-scatter \
      --lamport-grids 1024x2,4096x8 2>&1 | grep -E "all_reduce" > "$OUT/allreduce-w$w.log"
  done
}

probe() {
  for w in $1; do
    # shellcheck disable=SC2086  # PROBE_ARGS: several arguments
    on "$w" timeout 300 torchrun --standalone --nproc_per_node="$w" bench/probes/decode_probe.py \
      ${PROBE_ARGS:---reps 4 --tokens 1,8,32,128 --modes split} \
      --out "$OUT/decode-probe-w$w.json" > "$OUT/decode-probe-w$w.log" 2>&1
    grep '"contender"' "$OUT/decode-probe-w$w.log" || grep "decode_probe:\|Error" "$OUT/decode-probe-w$w.log" | tail -5
  done
}

timeline() {
  for w in $1; do
    on "$w" timeout 200 torchrun --standalone --nproc_per_node="$w" bench/probes/rmsnorm_timeline.py \
      --tokens 1,32,128 --modes split,lamport,two_shot --split-parts 16 --out "$OUT/timeline-w$w.json" 2>&1 |
      grep '"tokens"' | cut -c1-300
  done
}

fp8() {
  for w in $1; do
    on "$w" timeout 200 torchrun --standalone --nproc_per_node="$w" bench/probes/rmsnorm_timeline.py \
      --tokens 32,128,512 --modes two_shot,rows --fp8 --out "$OUT/timeline-fp8-w$w.json" 2>&1 |
      grep '"tokens"' | cut -c1-300
  done
}

pairs() {
  for pair in $1; do
    CUDA_VISIBLE_DEVICES=$pair timeout 60 torchrun --standalone --nproc_per_node=2 bench/probes/decode_probe.py --tokens 1 \
      --modes split --out "$OUT/decode-probe-pair${pair/,/}.json" 2>&1 | grep '"contender"' | sed "s/^/pair $pair: /"
  done
}

shared8() {
  timeout "${W8_LIMIT_S:-300}" tests/gpu/run.sh fusion --shared-gpu --worlds 8 --quick --only all_reduce_rmsnorm \
    > "$OUT/suites-w8.log" 2>&1
  echo "world 8 shared rc=$?"; grep -E "^== |^FAILED" "$OUT/suites-w8.log" | head -30
}

ab() {
  NGPU=4 AB_PROG=probes/rmsnorm_timeline AB_GREP='"tokens"' AB_TAG=-w4 bench/probes/ab.sh "$1" "$2" -- \
    --tokens 1,8,32,128 --modes lamport --split-parts 8
  NGPU=4 AB_TAG=-w4 bench/probes/ab.sh "$1" "$2" -- --sizes 1024,4096,16384,65536 --dtypes bf16 --skip-gather-scatter
}

while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    tune|suites|bench|probe|timeline|fp8|pairs) "$step" "${1:?$step needs an argument}"; shift ;;
    shared8) shared8 ;;
    ab) ab "${1:?ab OLD NEW}" "${2:?ab OLD NEW}"; shift 2 ;;
    *) echo "unknown step $step (see the head of $0)" >&2; exit 2 ;;
  esac
done
pack_program_records "$OUT"
