#!/usr/bin/env bash
# tests/gpu/run.sh under a wall-clock limit that stops everything it started:
#
#   tests/gpu/run_bounded.sh SECONDS [run.sh's parts and options]
#
# `timeout S tests/gpu/run.sh ...` stops run.sh alone: its torchrun workers keep running (a stalled
# rank keeps its GPU), and with --shared-gpu the MPS daemon cannot quit while they are its
# clients, so the next run.sh finds it running and gives up. Here run.sh runs in a process group
# of its own; at the limit the whole group gets TERM, then KILL 10 s later, and the MPS daemon
# that run.sh started is told to quit. Exit status: run.sh's, or 124 at the limit.
set -uo pipefail
[ $# -ge 1 ] && [[ $1 =~ ^[0-9]+$ ]] || { echo "usage: tests/gpu/run_bounded.sh SECONDS [run.sh args]" >&2; exit 2; }
limit=$1; shift
# A background job of a non-interactive shell is no group leader, so setsid makes it one in place:
# its pid is the group's id.
setsid "$(dirname "$0")/run.sh" "$@" &
pid=$! end=$((SECONDS + limit))
while kill -0 "$pid" 2> /dev/null && [ $SECONDS -lt $end ]; do sleep 1; done
if kill -0 "$pid" 2> /dev/null; then
  echo "run_bounded: ${limit} s passed: stopping run.sh and everything it started"
  kill -TERM -- -"$pid" 2> /dev/null; sleep 10; kill -KILL -- -"$pid" 2> /dev/null
  wait "$pid" 2> /dev/null; rc=124
else
  wait "$pid"; rc=$?
fi
if [[ " $* " == *" --shared-gpu "* ]]; then  # run.sh's EXIT trap does not run after a KILL
  echo quit | CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/ironlink-mps} timeout 10 \
    nvidia-cuda-mps-control > /dev/null 2>&1
fi
exit $rc
