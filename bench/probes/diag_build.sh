#!/usr/bin/env bash
# Builds timing-diagnostic variants of the sm_90 bitcode into build/diag/<variant>/ (the
# Makefile's bitcode rule with DIAG=<variant>): each leaves a stage of the push all-reduce out
# (device/src/transport/store_rounds.rs, `ironlink_diag`), so that a stage's time and the cost of running
# both stages together come out by difference. Results of these builds are wrong; the benchmark
# only checks statuses. Then, on the GPUs:
#   IRONLINK_GIT_REV=<rev> bench/probes/ab.sh build build/diag/no_scatter build/diag/no_reduce build/diag/no_stages \
#     -- --min-bytes 1073741824 --dtypes bf16 --skip-gather-scatter
# DIAG_VARIANTS=no_call_check builds the variant without the call-word check at first barriers
# (device/src/runtime/sync.rs: heaps and grids compared); its results are right, it only
# reports nothing, so the check's cost is the difference:
#   IRONLINK_GIT_REV=<rev> bench/probes/ab.sh build build/diag/no_call_check -- --max-bytes 67108864 --dtypes bf16
# DIAG_VARIANTS="ll_tile_no_exchange ll_tile_no_wait" builds the LL tile all-reduce without its
# exchange, and without its waits for arrivals (device/src/transport/ll_packet.rs): where the
# time of all_reduce_rmsnorm's one-row exchange goes, by difference:
#   IRONLINK_GIT_REV=<rev> AB_PROG=probes/rmsnorm_timeline AB_GREP=tokens bench/probes/ab.sh build \
#     build/diag/ll_tile_no_exchange build/diag/ll_tile_no_wait -- --tokens 1,8 --modes rows
# DIAG_VARIANTS="call_entry call_checked call_begun" builds symm_all_reduce and symm_tile_all_reduce
# returning at entry, once the context and arguments are checked, and once the call's begin is
# done too (call_checked: every collective): what a call costs before its algorithm, by
# difference with ll_tile_no_exchange and the normal build:
#   IRONLINK_GIT_REV=<rev> AB_PROG=probes/rmsnorm_timeline AB_GREP=tokens bench/probes/ab.sh build build/diag/call_entry \
#     build/diag/call_checked build/diag/call_begun build/diag/ll_tile_no_exchange -- --tokens 1 --modes rows
set -euo pipefail
cd "$(dirname "$0")/../.."
for v in ${DIAG_VARIANTS:-no_scatter no_reduce no_stages}; do
  make -s CUDA_ARCH=sm_90 DIAG="$v"
done
