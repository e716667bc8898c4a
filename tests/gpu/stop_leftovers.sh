#!/usr/bin/env bash
# Stops what an earlier GPU run left behind on this machine: torchrun and its workers, then the
# MPS daemon that --shared-gpu started. A worker whose kernel never returns keeps its GPU (and
# keeps the MPS daemon from quitting) after its parent is gone; the next run would find the GPU
# busy. Never this script's own shell or the shells that started it (their command lines may
# name the same programs). Prints what was left, then what is left after.
# IRONLINK_LEFTOVERS: the command lines to stop instead (a regex; then the MPS daemon is left
# alone): for tests, which must not stop a run of yours.
pattern=${IRONLINK_LEFTOVERS:-"torchrun|tests/gpu/workers/|bench/.*\.py|nvidia-cuda-mps"}
ancestors=" "
p=$$
while [ "$p" -gt 1 ] 2> /dev/null; do
  ancestors+="$p "
  p=$(awk '/^PPid:/ {print $2}' /proc/$p/status 2> /dev/null || echo 1)
done
leftovers() {  # pids of torchrun, the GPU workers, bench programs and the MPS daemon, not ours
  pgrep -f "$pattern" | while read -r q; do
    [[ $ancestors == *" $q "* ]] || echo "$q"
  done
}
show() { for q in $(leftovers); do ps -o pid=,stat=,etime=,args= -p "$q"; done; }
echo "before:"; show
if [ -z "${IRONLINK_LEFTOVERS:-}" ] && command -v nvidia-cuda-mps-control > /dev/null; then
  source "$(dirname "$0")/mps.sh" && stop_mps
fi
for q in $(leftovers); do kill -9 "$q" 2> /dev/null; done
sleep 2
echo "after:"; show
if command -v nvidia-smi > /dev/null; then nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; fi
