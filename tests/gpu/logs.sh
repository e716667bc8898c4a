#!/usr/bin/env bash
# What tests/gpu/run.sh and run_bounded.sh say of a run's log; sourced by both (and by
# tests/packaging/test_gpu_scripts.py).

# cut_note LIMIT LOG: the line run.sh prints for a run stopped at its LIMIT seconds: the limit, and
# the case that was running where LOG names one. The GPU workers print "case NAME: started" as a
# case begins (tests/gpu/workers/_cases.py), so the last such line is the case the limit cut
# (or the last to end before it); a log that names none (a benchmark, pytest) gives the limit alone.
cut_note() {
  local last
  last=$(last_case_started "$2")
  echo "  stopped at its ${1} s limit${last:+; the last case started: $last}"
}

# last_case_started LOG: NAME of LOG's last "case NAME: started" line; nothing where there is none.
last_case_started() {
  [ -f "$1" ] && sed -nE 's/^case (.*): started$/\1/p' "$1" | tail -1
}
