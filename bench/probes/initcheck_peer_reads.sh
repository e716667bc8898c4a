#!/usr/bin/env bash
# Runs bench/probes/initcheck_peer_reads.py under initcheck on one shared GPU (MPS), at each world
# and size, with IRONLINK_INITCHECK_PEERS=0 (the tool sees peers' memory as never written) and =1
# (each heap marks it initialized): the report counts per rank go to $OUT/initcheck-peers.txt.
#   bench/probes/initcheck_peer_reads.sh [worlds (default "2 4")] [bytes (default "1048576 4096")]
set -u
worlds=${1:-"2 4"} sizes=${2:-"1048576 4096"}
here=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/gpu/mps.sh
source "$here/tests/gpu/mps.sh"
start_mps || exit 1
summary=$OUT/initcheck-peers.txt
for w in $worlds; do
  mps_confine "$w"
  for b in $sizes; do
    for peers in 0 1; do
      log=$OUT/ic-w$w-b$b-peers$peers
      IRONLINK_INITCHECK_PEERS=$peers SANITIZE_TOOL=initcheck SANITIZE_LOG=$log timeout 300 \
        torchrun --standalone --nproc_per_node="$w" --no-python "$here/tests/gpu/sanitize_rank.sh" \
        "$here/bench/probes/initcheck_peer_reads.py" --bytes "$b" > "$log.out" 2>&1
      rc=$?
      counts=$(for f in "$log"-rank*.log; do grep -o "ERROR SUMMARY: [0-9]*" "$f" | grep -o "[0-9]*$"; done | tr '\n' ' ')
      sums=$(grep -c "right" "$log.out")
      echo "world $w bytes $b INITCHECK_PEERS=$peers rc=$rc reports/rank: $counts lines saying right: $sums" \
        | tee -a "$summary"
    done
  done
done
stop_mps
