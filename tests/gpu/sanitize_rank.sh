#!/usr/bin/env bash
# One torchrun rank under compute-sanitizer (tests/gpu/run.sh sanitize):
#   torchrun --no-python ... tests/gpu/sanitize_rank.sh tests/gpu/<worker>.py
# $SANITIZE_TOOL (memcheck, racecheck, synccheck, initcheck) checks the rank; its report goes to
# $SANITIZE_LOG-rank$RANK.log ($RANK from torchrun); exit status 9 if the tool reported anything.
# $SANITIZE_ARGS adds options (e.g. "--kernel-name-exclude kns=nccl"; none by default).
# CUDA API errors are not reported (--report-api-errors no): NCCL's communicator setup probes
# kernel images and gets cudaErrorNoKernelImageForDevice on purpose (8 such reports, nothing else,
# in a memcheck run of the MoE cases on one H200); ironlink's host code checks every CUDA result
# itself and raises. Memory, race, sync and init errors in kernels are all still reported.
set -u
# shellcheck disable=SC2086 # the extra options are split on purpose
exec compute-sanitizer --tool "$SANITIZE_TOOL" --report-api-errors no --print-limit 20 --error-exitcode 9 \
  --log-file "$SANITIZE_LOG-rank$RANK.log" ${SANITIZE_ARGS:-} python3 "$@"
