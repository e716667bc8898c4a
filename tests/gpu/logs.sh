#!/usr/bin/env bash
# What tests/gpu/run.sh says of a run's log; sourced by run.sh (and by tests/packaging/test_gpu_scripts.py).

# cut_note LIMIT LOG: the line run.sh prints for a run stopped at its LIMIT seconds: the limit, and
# the case that was running where LOG names one. The GPU workers print "case NAME: started" as a
# case begins (tests/gpu/workers/_cases.py), so the last such line is the case the limit cut
# (or the last to end before it); a log that names none (a benchmark, pytest) gives the limit alone.
cut_note() {
  local limit=$1 log=$2 last=""
  [ -f "$log" ] && last=$(sed -nE 's/^case (.*): started$/\1/p' "$log" | tail -1)
  echo "  stopped at its ${limit} s limit${last:+; the last case started: $last}"
}
