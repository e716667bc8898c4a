#!/usr/bin/env bash
# Issue 60's A/B of the decode kernels at world 4 (and the same machine's world 2): two Python
# trees against one bitcode, both on the same GPUs in one call (bench/ab.sh), JSON under $OUT.
#   git archive <old-rev> python | tar -x -C build/ab_old       # here, then carry build/
#   bench/decode_ab.sh build/ab_old .
# - bench/rmsnorm_timeline.py: all_reduce_rmsnorm's phases per CTA (mode lamport; mode split with
#   8 slices, over LL packets and lamport slots) at 1 / 8 / 32 / 128 tokens of hidden 8192;
# - bench/allreduce.py: ironlink.all_reduce (both paths: lamport slots and the device library's)
#   against NCCL at 1 / 4 / 16 / 64 KiB, bf16;
# then, with the second tree only, the timeline at world 2 on the first two GPUs.
set -uo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: bench/decode_ab.sh OLD_TREE NEW_TREE}
new=${2:?usage: bench/decode_ab.sh OLD_TREE NEW_TREE}
export OUT=${OUT:-build/decode_ab} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeline=(--tokens 1,8,32,128 --modes lamport --split-parts 8)
NGPU=4 AB_PROG=rmsnorm_timeline AB_GREP='"tokens"' AB_TAG=-w4 bench/ab.sh "$old" "$new" -- "${timeline[@]}"
NGPU=4 AB_TAG=-w4 bench/ab.sh "$old" "$new" -- --sizes 1024,4096,16384,65536 --dtypes bf16 --skip-gather-scatter
CUDA_VISIBLE_DEVICES=0,1 NGPU=2 AB_PROG=rmsnorm_timeline AB_GREP='"tokens"' AB_TAG=-w2 bench/ab.sh "$new" -- "${timeline[@]}"
