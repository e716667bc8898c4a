# Sourced by the GPU scripts that run ranks sharing a GPU (tests/gpu/run.sh --shared-gpu, the
# shared-GPU probes): the CUDA MPS daemon they share. Without MPS the GPU time-slices between
# processes and each wait on a peer lasts a slice (~6 ms per round trip measured on an H200,
# against ~50 us under MPS; bench/probes/shared_gpu_probe.py).

# Starts the daemon (a private pipe directory) and exports what the ranks need; a daemon left by
# a run cut off before its exit (its server then refuses new clients) is stopped first. Returns 1,
# saying why, if none starts.
start_mps() {
  export IRONLINK_SHARED_GPU=1 CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/ironlink-mps}
  export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/ironlink-mps-log}
  # NVSHMEM gives PEs that share a GPU full support (its barriers, which PyTorch's rendezvous
  # calls) only if their MPS active-thread percentages add up to at most 100. tests/gpu/run.sh
  # sets them so (confine); the probes that start MPS alone may not, and ironlink then warns.
  export NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  local mps r
  mps=$(nvidia-cuda-mps-control -d 2>&1); r=$?
  if [ $r -ne 0 ] && [[ $mps == *"already running"* ]]; then
    stop_mps; sleep 1
    mps=$(nvidia-cuda-mps-control -d 2>&1); r=$?
  fi
  if [ $r -ne 0 ]; then
    echo "--shared-gpu: could not start the MPS daemon (nvidia-cuda-mps-control -d): $mps" \
      "(one left by a stalled run, with its workers? tests/gpu/stop_leftovers.sh stops them)"
    return 1
  fi
}

# mps_confine R: each of the R ranks that share a GPU, started after this, may occupy at most
# its share of the SMs ($CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, read when a rank's CUDA context is
# made; the GPU then reports that share's SMs, ironlink.runtime.distributed.mps_confined).
# Unconfined, eight ranks on two H200s stalled in the compile worker's TP block, and passed
# confined (docs/record.md, session 60; suspected: a rank's CTAs, spread over any SMs, held
# those a GPU-mate's waiting kernel needed). A limit, not a reservation (NVIDIA's MPS docs): four
# confined clients' grids of a whole SM a CTA did not all start at 28 or 32 CTAs each, did at 16
# and 24 (bench/probes/mps_sm_sets_probe.py, session 62), so ironlink's grids there take half the
# share (sm_share).
mps_confine() {
  export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$(( 100 / $1 ))
}

# mps_ready: waits until the MPS server takes new clients again after a run cut off mid-call. The
# server refuses them ("MPS server is not ready to accept new MPS client requests", error 807)
# until the killed clients have all gone, and the next run's ranks failed at their first CUDA call
# (session 71: initcheck's collectives run, started as the cut ops run's clients were retiring).
# Tries a client ($IRONLINK_MPS_PROBE: a CUDA allocation) every $IRONLINK_MPS_READY_WAIT_S (5) s,
# $IRONLINK_MPS_READY_TRIES (12) times, then restarts the daemon once. Returns 1 if no client
# gets in.
mps_ready() {
  local probe=${IRONLINK_MPS_PROBE:-"python3 -c 'import torch; torch.zeros(1, device=\"cuda\")'"}
  local tries=${IRONLINK_MPS_READY_TRIES:-12} wait_s=${IRONLINK_MPS_READY_WAIT_S:-5} i
  for ((i = 0; i < tries; i++)); do
    bash -c "$probe" > /dev/null 2>&1 && return 0
    sleep "$wait_s"
  done
  echo "MPS took no new client for $((tries * wait_s)) s after a cut run: restarting its daemon"
  stop_mps; sleep 1
  start_mps && bash -c "$probe" > /dev/null 2>&1
}

# Asks the daemon to quit. quit waits for the clients to exit: bounded, so a cut-off run does not
# hang here.
stop_mps() {
  echo quit | CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/ironlink-mps} timeout 10 \
    nvidia-cuda-mps-control > /dev/null 2>&1
}
