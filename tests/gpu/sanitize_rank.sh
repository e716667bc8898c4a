#!/usr/bin/env bash
# One torchrun rank under compute-sanitizer (tests/gpu/run.sh sanitize):
#   torchrun --no-python ... tests/gpu/sanitize_rank.sh tests/gpu/workers/<worker>.py
# $SANITIZE_TOOL (memcheck, racecheck, synccheck, initcheck) checks the rank; its report goes to
# $SANITIZE_LOG-rank$RANK.log ($RANK from torchrun); exit status 9 if the tool reported anything.
# $SANITIZE_ARGS adds options (none by default).
# Per tool, what is left out and why (every read, write and barrier of ironlink's kernels is still
# checked; NCCL and torch are the workers' references, not under test):
# - synccheck leaves out NCCL's kernels (--kernel-name-exclude kns=nccl): it flags their
#   warp-specialized aligned barriers (bar.sync reached from different branches), thousands of
#   "Divergent thread(s) in block" in ncclDevFunc_AllReduce_MinMax_f32_RING_SIMPLE over `ops` at
#   world 2 (2026-11-24). Only for synccheck: initcheck must see NCCL's writes, or the reference
#   outputs NCCL wrote read as uninitialized.
# - initcheck does not check the host API's copies (--check-api-memory-access no): heap creation's
#   dist.all_gather_object copies the uninitialized padding of torch's own object buffers
#   ("Uninitialized access ... by cudaMemcpy source", all in all_gather_object, same run).
# - initcheck cannot see a peer process's writes: every load from a peer's heap reads to it as
#   uninitialized (bench/probes/initcheck_peer_reads.py). IRONLINK_INITCHECK_PEERS=1 makes each new
#   heap (all zeros) zero-fill its peers' regions with a kernel (python/ironlink/runtime/initcheck.py),
#   so initcheck takes them as initialized; set it to 0 to see the reports.
set -u
case "$SANITIZE_TOOL" in
  synccheck) leave_out="--kernel-name-exclude kns=nccl" ;;
  initcheck) leave_out="--check-api-memory-access no"; export IRONLINK_INITCHECK_PEERS=${IRONLINK_INITCHECK_PEERS:-1} ;;
  *) leave_out="" ;;
esac
# shellcheck disable=SC2086 # the extra options are split on purpose
exec compute-sanitizer --tool "$SANITIZE_TOOL" --report-api-errors no --print-limit 20 --error-exitcode 9 \
  $leave_out \
  --log-file "$SANITIZE_LOG-rank$RANK.log" ${SANITIZE_ARGS:-} python3 "$@"
