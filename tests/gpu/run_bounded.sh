#!/usr/bin/env bash
# tests/gpu/run.sh under a wall-clock limit that stops everything it started:
#
#   tests/gpu/run_bounded.sh SECONDS [run.sh's parts and options]
#
# `timeout S tests/gpu/run.sh ...` stops run.sh alone: its torchrun workers keep running (a stalled
# rank keeps its GPU), and with --shared-gpu the MPS daemon cannot quit while they are its
# clients, so the next run.sh finds it running and gives up. Here run.sh runs in a session of its
# own; at the limit everything in that session gets TERM, then KILL 10 s later, and the MPS daemon
# that run.sh started is told to quit. The session, not the process group: run.sh starts each
# torchrun under `timeout`, which makes a process group of its own (a kill of run.sh's group left
# the workers of a stalled kernel running, 2026-11-29). Exit status: run.sh's, or 124 at the limit.
set -uo pipefail
[ $# -ge 1 ] && [[ $1 =~ ^[0-9]+$ ]] || { echo "usage: tests/gpu/run_bounded.sh SECONDS [run.sh args]" >&2; exit 2; }
limit=$1; shift
source "$(dirname "$0")/logs.sh"
# A background job of a non-interactive shell is no session leader, so setsid makes it one in
# place: its pid is the session's id.
setsid "$(dirname "$0")/run.sh" "$@" &
pid=$! end=$((SECONDS + limit))
while kill -0 "$pid" 2> /dev/null && [ $SECONDS -lt $end ]; do sleep 1; done
out=${OUT:-build/gpu-out}
if kill -0 "$pid" 2> /dev/null; then
  echo "run_bounded: ${limit} s passed: stopping run.sh and everything it started"
  # The case that was running: the last one started in the newest log that names cases (the
  # worker's of run.sh's part in progress; a sanitizer's rank logs name none).
  for log in $(ls -t "$out"/*.log 2> /dev/null); do
    last=$(last_case_started "$log")
    [ -z "$last" ] || { echo "run_bounded: the last case started ($(basename "$log")): $last"; break; }
  done
  pkill -TERM -s "$pid"; sleep 10; pkill -KILL -s "$pid"; sleep 1
  wait "$pid" 2> /dev/null; rc=124
else
  wait "$pid"; rc=$?
fi
if [[ " $* " == *" --shared-gpu "* ]]; then  # run.sh's EXIT trap does not run after a KILL
  source "$(dirname "$0")/mps.sh" && stop_mps
fi
# The ranks' stacks (a file a rank) as one archive, stacks.tar.gz beside the logs: a run that
# brings back a few files (eight ranks' stacks are eight) keeps them with the logs.
stacks=${IRONLINK_GPU_STACKS_DIR:-$out/stacks}
if [ -d "$stacks" ] && [ -n "$(ls -A "$stacks")" ]; then
  tar -czf "$stacks.tar.gz" -C "$(dirname "$stacks")" "$(basename "$stacks")" && rm -rf "$stacks"
fi
# The workers' records of the kernels they compiled (a file a worker and world) as one archive,
# compile-records.tar: unpacked into tests/gpu/compile_ahead/ and committed, they let a later run
# on a fresh machine compile those kernels ahead, in parallel (docs/gpu-testing.md).
records=${IRONLINK_GPU_COMPILE_RECORD-$out/compile_ahead}
if [ -n "$records" ] && [ -d "$records" ] && [ -n "$(ls -A "$records")" ]; then
  tar -cf "$out/compile-records.tar" -C "$records" . && rm -rf "$records"
fi
# The sanitized workers' rank logs (a file a rank and a worker: 12 for one tool at world 4) as one
# archive too, rank-logs.tar.gz; each worker's own log and run.sh's summary lines stay beside it.
(cd "$out" 2> /dev/null && set -- *-rank[0-9]*.log && [ -e "$1" ] && tar -czf rank-logs.tar.gz "$@" && rm -f "$@")
exit $rc
