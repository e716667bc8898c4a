#!/usr/bin/env bash
# The one GPU entry point: every GPU suite of ironlink, or the parts you name, on the local GPUs.
#
#   tests/gpu/run.sh                         # every part, world sizes 2 4 8 as the GPUs allow
#   tests/gpu/run.sh collectives ops         # only these parts
#   tests/gpu/run.sh --worlds "4 2" --quick  # options go anywhere
#
# Parts, in the order they run:
#   wheel        the wheel from build/dist installs as is and imports (extension + bitcode)
#   basics       single-GPU tests: bitcode links, context checks, error codes (tests/gpu/test_basic.py)
#   heap         symmetric heap suite and examples/peer_write.py, per world size (tests/gpu/test_heap.py)
#   collectives  every device collective and primitive, per world size (tests/gpu/workers/collectives_worker.py)
#   fusion       grid barrier, tile collectives, push-as-produced and the fused ops (ironlink.fused),
#                per world size (tests/gpu/workers/fusion_worker.py)
#   ops          host-level ops (ironlink.all_reduce, ...) on all --worlds' largest size (tests/gpu/workers/ops_worker.py)
#   nvshmem      every host-level op over SymmetricHeap(backend="nvshmem") (PyTorch's NVSHMEM symmetric
#                memory), bitwise against a P2P heap, per world size (tests/gpu/workers/nvshmem_worker.py)
#   examples     examples/all_reduce.py (the GPU `make demo`), examples/moe_layer.py and
#                examples/fused_matmul_all_reduce.py
#   e2e          bench/e2e.py and bench/e2e_moe.py --check at each world size: the small decoder
#                stack, each contender against nccl's output, and the small MoE stack, ironlink
#                against torch_a2a's (not in the default parts)
#   tune         the decode tuner (`torchrun -m ironlink.tune --quick`) at each world size: it runs to
#                the end and writes a table the ops read ($OUT/tune-wW.json; with --shared-gpu its
#                choices mean nothing, the run and the file are what is checked; not in the default parts).
#                The tuner compiles ahead and records as a program does (bench/run.sh's records,
#                `ironlink.tune-wW[-shared]-smXX.rankR.jsonl.gz`, a --quick run's kernels)
#   bench        the side-by-side benchmark, JSON under $OUT (bench/run.sh)
#   fused-bench  the fused-op benchmark, JSON under $OUT (bench/run.sh fused)
#   moe-bench    the MoE dispatch / combine benchmark, JSON under $OUT (bench/run.sh moe)
#   tutorial     every lesson of examples/tutorial/ at each world size, one line each; their
#                timings go to $OUT/tutorial-<N>x<GPU>-<date>.json (bench/report/tutorial_table.py)
#   misuse       misuse caught or made safe: two streams on one heap, a closed heap, a destroyed
#                group, a call on some ranks, different grids, asymmetric heaps; largest world
#                (tests/gpu/workers/misuse_worker.py)
#   killed-rank  SIGKILL a rank mid all-reduce (large, small): TIMEOUT on the others, GPUs free, a
#                new group works; largest world, JSON under $OUT (tests/gpu/workers/killed_rank.py)
#   soak         seeded random collectives for --minutes, each checked; largest world, JSON under
#                $OUT (tests/gpu/workers/soak.py)
#   sanitize     compute-sanitizer (--tools) over the small cases of collectives, ops and fusion
#                (IRONLINK_GPU_SMALL=1), per world size up to 4; logs and a report count per tool
#   reliability  misuse killed-rank soak sanitize compile: every GPU check of docs/reliability.md
#   compile      torch.compile(fullgraph=True) of a tensor-parallel block (all_reduce_rmsnorm,
#                matmul_all_reduce, MoeExchange) and of the other host-level ops, default mode and
#                mode="reduce-overhead", bitwise against eager, no graph break; largest world
#                (tests/gpu/workers/compile_worker.py; in reliability, not in the default parts)
#   nvshmem-link @ironlink.jit(nvshmem=True) over torch's NVSHMEM backend: module init, nvshmem_ptr,
#                a ring of puts with signal, argument errors; per world size
#                (tests/gpu/workers/nvshmem_link_worker.py; not in the default parts)
# Options:
#   --worlds "W..."    world sizes for heap and collectives (default "2 4 8"; sizes above the
#                      GPU count are skipped)
#   --only SUBSTR      the cases whose names contain SUBSTR ("A|B": either)
#   --skip SUBSTR      not the cases whose names contain SUBSTR ("A|B": either); with --only, a
#                      suite too long for one device call runs in parts (--only X, then --skip X)
#   --quick            collectives without the large (8 MiB and 256 MiB) cases
#   --bench-args "..." arguments for bench/allreduce.py (e.g. "--max-bytes 16777216")
#   --fused-args "..." arguments for bench/fused.py (e.g. "--ops matmul_allreduce")
#   --moe-args "..."   arguments for bench/moe.py (e.g. "--tokens 4096 --sms 16 0")
#   --e2e-args "..."   more arguments for bench/e2e.py --check (e.g. "--batches 32 --sdpa flash,efficient")
#   --minutes M        how long the soak runs (default 5)
#   --seed S           the soak's seed (default 20)
#   --soak-nodes       the soak adds a heap of simulated nodes over NVSHMEM (tests/gpu/workers/soak.py --nodes)
#   --tools "T..."     sanitize: compute-sanitizer tools (default "memcheck racecheck synccheck initcheck")
#   --suites "S..."    sanitize: workers to sanitize (default "collectives ops fusion")
#   --shared-gpu       ranks may outnumber the GPUs: world sizes are not capped by the GPU count,
#                      ranks share GPUs (IRONLINK_SHARED_GPU=1: LOCAL_RANK modulo the GPUs, a gloo
#                      group) under a CUDA MPS daemon started here, so every rank's kernels run at
#                      once, each rank confined to its share of the SMs (confine, below). For
#                      multi-rank correctness on a machine with fewer GPUs: timings mean nothing,
#                      so the benchmark parts are skipped and the tutorial writes no JSON;
#                      the workers' wait timeout defaults to 30 s (IRONLINK_GPU_HEAP_TIMEOUT_S)
# Environment: OUT (logs and benchmark JSON; default build/gpu-out), IRONLINK_WORLD_TIMEOUT
# (seconds per collectives, fusion or nvshmem world, default 480, nvshmem with --shared-gpu 600:
# the first world compiles every kernel; e2e: a program at a world, default 540),
# IRONLINK_GIT_REV (the revision the benchmark records when the tree has no .git), TRITON_CACHE_DIR,
# IRONLINK_GPU_COMPILE_AHEAD / IRONLINK_GPU_COMPILE_RECORD (the folder of committed records of
# compiled kernels, default tests/gpu/compile_ahead; where this run's go, default $OUT/compile_ahead),
# TORCHINDUCTOR_COMPILE_THREADS (default: the cores / the largest world),
# SANITIZE_ARGS (extra compute-sanitizer options; none by default; sanitize_rank.sh says what each
# tool leaves out),
# IRONLINK_SANITIZE_TIMEOUT (seconds per sanitized worker run, default 540), IRONLINK_GPU_VERBOSE=1
# (the workers print each case's seconds as it ends: finds a slow case; its name as it starts is
# always printed: a stuck case is the last one started).
#
# Needs python3 with torch and triton, and build/ from a machine with Rust (`make wheel`: the
# bitcode and the abi3 wheel). Prints one summary line per part; exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/../.."

parts=() worlds="2 4 8" bench_args="" fused_args="" moe_args="" e2e_args="" minutes=5 seed=20 soak_nodes=""
tools="memcheck racecheck synccheck initcheck" suites="collectives ops fusion" shared_gpu="" nvshmem_limit=480
while [ $# -gt 0 ]; do
  case "$1" in
    --worlds) worlds=$2; shift 2 ;;
    --only) export IRONLINK_GPU_ONLY=$2; shift 2 ;;
    --skip) export IRONLINK_GPU_SKIP=$2; shift 2 ;;
    --quick) export IRONLINK_GPU_FULL=0; shift ;;
    --bench-args) bench_args=$2; shift 2 ;;
    --fused-args) fused_args=$2; shift 2 ;;
    --moe-args) moe_args=$2; shift 2 ;;
    --e2e-args) e2e_args=$2; shift 2 ;;
    --minutes) minutes=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --soak-nodes) soak_nodes=--nodes; shift ;;
    --tools) tools=$2; shift 2 ;;
    --suites) suites=$2; shift 2 ;;
    --shared-gpu) shared_gpu=1; shift ;;
    reliability) parts+=(misuse killed-rank soak sanitize compile); shift ;;
    misuse|killed-rank|soak|sanitize|nvshmem-link|compile|e2e|tune) parts+=("$1"); shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    wheel|basics|heap|collectives|fusion|ops|nvshmem|examples|bench|fused-bench|moe-bench|tutorial) parts+=("$1"); shift ;;
    *) echo "tests/gpu/run.sh: unknown part or option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || parts=(wheel basics heap collectives fusion ops nvshmem examples bench fused-bench)

if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "skipped: no GPU (nvidia-smi lists none)"; exit 0
fi
source tests/gpu/setup_native.sh || exit 1  # also exports NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
source tests/gpu/logs.sh
export OUT=${OUT:-build/gpu-out} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ironlink-triton-cache}
export IRONLINK_GPU_STACKS_DIR=${IRONLINK_GPU_STACKS_DIR:-$OUT/stacks}  # each worker's stacks at a time limit (_cases.py)
# Compiling ahead (_cases.py, docs/gpu-testing.md): the workers first compile, in parallel, the
# kernels that the committed records say they compiled before, and record what they compile now
# under $OUT (run_bounded.sh packs those into compile-records.tar). Set either empty to turn it off.
export IRONLINK_GPU_COMPILE_AHEAD=${IRONLINK_GPU_COMPILE_AHEAD-$(pwd)/tests/gpu/compile_ahead}
export IRONLINK_GPU_COMPILE_RECORD=${IRONLINK_GPU_COMPILE_RECORD-$OUT/compile_ahead}
# ... and not again through init_distributed's records of whole programs (bench/run.sh's), which
# would compile every case's kernels whatever --only says.
export IRONLINK_COMPILE_AHEAD= IRONLINK_COMPILE_RECORD=
mkdir -p "$OUT"
ngpu=$(nvidia-smi -L | wc -l)
if [ -n "$shared_gpu" ]; then
  source tests/gpu/mps.sh
  start_mps || exit 1
  # A kernel's first call compiles it in every rank at once: four ranks compiling NVSHMEM-linked
  # kernels (7-11 s each) on one host finished more than the default 5 s wait timeout apart, and
  # the early ranks' waits timed out (nvshmem, 2 simulated nodes of 2, world 4).
  export IRONLINK_GPU_HEAP_TIMEOUT_S=${IRONLINK_GPU_HEAP_TIMEOUT_S:-30}
  # Four PEs sharing one GPU took ~450 s of the nvshmem part at world 4 with a cold Triton cache
  # (every rank compiles every case's kernels).
  nvshmem_limit=600
  trap stop_mps EXIT
  echo "shared GPUs: ranks share $ngpu GPU(s) under MPS; results checked, timings meaningless"
fi
fits=()
for w in $worlds; do
  if [ "$w" -le "$ngpu" ] || [ -n "$shared_gpu" ]; then fits+=("$w"); else echo "world $w: skipped ($ngpu GPUs)"; fi
done
largest=$(printf '%s\n' "${fits[@]:-1}" | sort -n | tail -1)
# torch.compile (compile, e2e): each rank's Inductor starts a pool of compile workers, by default
# one per core; eight pools of 32 on a 32-core host oversubscribe it. So each rank gets a share
# of the cores (with it, eight ranks' compiles ended 2-4 s apart; session 60).
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-$(( $(nproc) / largest > 0 ? $(nproc) / largest : 1 ))}
{
  echo "# $(date -u +%FT%TZ) parts: ${parts[*]}; worlds: ${fits[*]:-none}"
  nvidia-smi --query-gpu=index,name,driver_version,compute_cap --format=csv,noheader
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
  ls -l build/*.bc build/dist/*.whl
} > "$OUT/env.txt" 2>&1
rc=0
fail() { echo "$1: FAILED (log: $2)"; tail -20 "$2"; rc=1; }
# confine W: where ranks share GPUs, each rank of a world of W started next gets its share of a
# GPU's SMs from MPS (mps_confine, tests/gpu/mps.sh).
confine() {
  [ -n "$shared_gpu" ] || return 0
  mps_confine $(( ($1 + ngpu - 1) / ngpu ))
}
if [ -n "$shared_gpu" ]; then
  for w in "${fits[@]}"; do (confine "$w"; echo "world $w: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); done >> "$OUT/env.txt"
fi
# as_program CMD...: runs CMD with init_distributed's records of whole programs on (bench/run.sh's):
# it compiles ahead from the committed record of its world and records what it compiles under $OUT,
# as the suites' workers do through Cases (turned off above for the suites).
as_program() {
  IRONLINK_COMPILE_AHEAD=$IRONLINK_GPU_COMPILE_AHEAD IRONLINK_COMPILE_RECORD=$IRONLINK_GPU_COMPILE_RECORD "$@"
}
exec 3>&1  # run.sh's own output, for what a helper says while its command writes to a log
# bounded LIMIT CMD...: every run of GPU processes here (torchrun's ranks, a worker that starts
# its own, pytest, a benchmark) under `timeout LIMIT`, returning its status. Where it hit the limit
# (124 or 137: processes killed mid-call) it says so, with the case that was running (cut_note,
# tests/gpu/logs.sh: read from the log its caller sends stdout to), and where ranks share GPUs it
# waits for MPS to take clients again (mps_ready): the next run's processes would fail at their
# first CUDA call (error 807) while the killed ones retire.
bounded() {
  local limit=$1 r
  shift
  timeout "$limit" "$@"; r=$?
  if [ $r -eq 124 ] || [ $r -eq 137 ]; then
    cut_note "$limit" "$(readlink "/proc/$$/fd/1")" >&3  # this shell's stdout: the caller's log
    [ -z "$shared_gpu" ] || mps_ready >&3
  fi
  return $r
}
# Runs tests/gpu/workers/<part>_worker.py under torchrun at every world size that fits, `limit` seconds
# each, printing the log lines that match `summary`.
per_world() {
  local part=$1 limit=$2 summary=$3 w log r
  for w in "${fits[@]}"; do
    log="$OUT/$part-w$w.log"
    confine "$w"
    bounded "$limit" torchrun --standalone --nproc_per_node="$w" "tests/gpu/workers/${part}_worker.py" > "$log" 2>&1; r=$?
    grep -E "$summary" "$log" | head -30; [ $r -eq 0 ] || fail "$part world $w" "$log"
  done
}
# Runs `suite`'s worker under compute-sanitizer `tool` at world `w` on its small cases; prints the
# number of reports over the ranks' logs (a log without its summary line counts as a failure).
sanitize_one() {
  local tool=$1 suite=$2 w=$3 prefix="$OUT/sanitize-$1-$2-w$3" r n logs
  rm -f "$prefix"-rank*.log
  confine "$w"
  SANITIZE_TOOL=$tool SANITIZE_LOG=$prefix IRONLINK_GPU_SMALL=1 IRONLINK_GPU_HEAP_TIMEOUT_S=120 \
    bounded "${IRONLINK_SANITIZE_TIMEOUT:-540}" torchrun --standalone --nproc_per_node="$w" --no-python \
    tests/gpu/sanitize_rank.sh "tests/gpu/workers/${suite}_worker.py" > "$prefix.log" 2>&1; r=$?
  logs=$(ls "$prefix"-rank*.log 2> /dev/null | wc -l)
  # memcheck, synccheck and initcheck end with "ERROR SUMMARY: N errors"; racecheck with
  # "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
  n=$(cat "$prefix"-rank*.log 2> /dev/null |
    sed -nE 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/p; s/.*RACECHECK SUMMARY: ([0-9]+) hazard.*/\1/p' |
    awk '{s += $1} END {print s + 0}')
  [ "$(cat "$prefix"-rank*.log 2> /dev/null | grep -cE '(ERROR|RACECHECK) SUMMARY')" -eq "$w" ] ||
    n="$n+ (a rank's log has no summary)"
  echo "sanitize $tool $suite world $w: $n reports ($logs rank logs; $(grep -E '^== ' "$prefix.log" | tail -1))"
  [ $r -eq 0 ] && [ "$n" = 0 ] || fail "sanitize $tool $suite world $w" "$prefix.log"
}

for part in "${parts[@]}"; do
  echo "== $part"
  log="$OUT/$part.log"
  confine "$largest"  # the parts that loop over the worlds confine each
  case $part in bench|fused-bench|moe-bench)
    [ -z "$shared_gpu" ] || { echo "$part: skipped (--shared-gpu: timings mean nothing)"; continue; } ;;
  esac
  case $part in
    wheel)
      rm -rf /tmp/ironlink-site
      { python3 -m pip install -q --no-index --no-deps --target /tmp/ironlink-site build/dist/ironlink-*.whl &&
        PYTHONPATH=/tmp/ironlink-site python3 -c "import ironlink, ironlink._native, ironlink.language._lib as l; print('installed wheel imports; bitcode:', sorted(p.name for p in l.PACKAGE_LIB_DIR.glob('*.bc')))"
      } > "$log" 2>&1 && tail -1 "$log" || fail wheel "$log" ;;
    basics)
      bounded 180 python3 -m pytest -q tests/gpu/test_basic.py > "$log" 2>&1; r=$?
      tail -1 "$log"; [ $r -eq 0 ] || fail basics "$log" ;;
    heap)
      [ ${#fits[@]} -gt 0 ] || { echo "no world size fits"; continue; }
      IRONLINK_HEAP_WORLDS="${fits[*]}" bounded 400 python3 -m pytest -q -s tests/gpu/test_heap.py > "$log" 2>&1; r=$?
      grep -hE "HEAP SUITE" "$log" | tail -3; tail -1 "$log"; [ $r -eq 0 ] || fail heap "$log" ;;
    collectives) per_world collectives "${IRONLINK_WORLD_TIMEOUT:-480}" "^== world|^FAILED" ;;
    nvshmem-link) per_world nvshmem_link 300 "^NVSHMEM LINK|FAIL" ;;
    fusion) per_world fusion "${IRONLINK_WORLD_TIMEOUT:-480}" "^== fusion|^FAILED" ;;
    nvshmem) per_world nvshmem "${IRONLINK_WORLD_TIMEOUT:-$nvshmem_limit}" "^== nvshmem|^FAILED" ;;
    ops)
      bounded 240 torchrun --standalone --nproc_per_node="$largest" tests/gpu/workers/ops_worker.py > "$log" 2>&1; r=$?
      grep -E "^== ops|FAILED" "$log" | head -20; [ $r -eq 0 ] || fail ops "$log" ;;
    examples)
      for ex in all_reduce moe_layer fused_matmul_all_reduce; do
        log="$OUT/example-$ex.log"
        bounded 180 torchrun --standalone --nproc_per_node="$largest" "examples/$ex.py" > "$log" 2>&1; r=$?
        grep -vE "^(W|I)[0-9]{4}|^\*+$|OMP_NUM_THREADS|^$" "$log" | tail -12; [ $r -eq 0 ] || fail "example $ex" "$log"
      done ;;
    e2e)
      # bench/e2e.py --check: the small decoder stack, every contender against nccl's output;
      # bench/e2e_moe.py --check: the small MoE stack, ironlink against torch_a2a's output.
      for w in "${fits[@]}"; do
        for prog in e2e e2e_moe; do
          log="$OUT/$prog-check-w$w.log" more=()
          confine "$w"
          # shellcheck disable=SC2206 # the program's arguments are split on purpose
          [ "$prog" = e2e ] && more=($e2e_args)
          bounded "${IRONLINK_WORLD_TIMEOUT:-540}" torchrun --standalone --nproc_per_node="$w" "bench/$prog.py" --check \
            "${more[@]}" > "$log" 2>&1; r=$?
          grep -E "FAILED|skipped|err " "$log" | tail -20; [ $r -eq 0 ] || fail "$prog world $w" "$log"
        done
      done ;;
    tune)
      for w in "${fits[@]}"; do
        log="$OUT/tune-w$w.log" table="$OUT/tune-w$w.json"
        confine "$w"
        rm -f "$table"
        as_program bounded "${IRONLINK_WORLD_TIMEOUT:-540}" torchrun --standalone --nproc_per_node="$w" -m ironlink.tune --quick \
          --out "$table" > "$log" 2>&1 &&
          python3 -c 'import sys; from pathlib import Path; from ironlink.runtime.tuning import decode_table as dt
t = dt.read_file(Path(sys.argv[1]), int(sys.argv[2])); print("tune world", sys.argv[2], "table:", dict(t._asdict()))' \
            "$table" "$w" >> "$log" 2>&1; r=$?
        grep -E "^tune world|^wrote|Error" "$log" | tail -5; [ $r -eq 0 ] || fail "tune world $w" "$log"
      done ;;
    bench)
      # shellcheck disable=SC2086 # the benchmark's arguments are split on purpose
      NGPU=$largest bounded 300 bench/run.sh $bench_args > "$log" 2>&1; r=$?
      grep -E "all_reduce|all_gather|reduce_scatter" "$log" | grep -v "symm_one_shot" | tail -70
      [ $r -eq 0 ] || fail bench "$log" ;;
    fused-bench)
      # shellcheck disable=SC2086 # the benchmark's arguments are split on purpose
      NGPU=$largest bounded 540 bench/run.sh fused $fused_args > "$log" 2>&1; r=$?
      grep -E "allreduce_rmsnorm|matmul_allreduce|allgather_matmul|matmul_reducescatter" "$log" | tail -100
      [ $r -eq 0 ] || fail fused-bench "$log" ;;
    moe-bench)
      # shellcheck disable=SC2086 # the benchmark's arguments are split on purpose
      NGPU=$largest bounded 540 bench/run.sh moe $moe_args > "$log" 2>&1; r=$?
      grep -E "dispatch|combine|torch_nvshmem: skipped" "$log" | tail -80  # 7 rows per shape with torch_nvshmem
      [ $r -eq 0 ] || fail moe-bench "$log" ;;
    tutorial)
      # One JSON per world size (each lesson appends its rows); the docs table takes 4 GPUs' file.
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
      for w in "${fits[@]}"; do
        export IRONLINK_TUTORIAL_JSON="$OUT/tutorial-${w}x${gpu}-$(date -u +%Y%m%d-%H%M%S).json"
        [ -z "$shared_gpu" ] || unset IRONLINK_TUTORIAL_JSON  # shared GPUs: timings mean nothing
        for lesson in examples/tutorial/[0-9][0-9]_*.py; do
          log="$OUT/tutorial-$(basename "$lesson" .py)-w$w.log"
          confine "$w"
          bounded 180 torchrun --standalone --nproc_per_node="$w" "$lesson" > "$log" 2>&1; r=$?
          grep -E "^[0-9]{2} " "$log" || echo "$(basename "$lesson") world $w: no result line"
          [ $r -eq 0 ] || fail "tutorial $(basename "$lesson") world $w" "$log"
        done
      done
      unset IRONLINK_TUTORIAL_JSON ;;
    misuse)
      bounded 300 torchrun --standalone --nproc_per_node="$largest" tests/gpu/workers/misuse_worker.py > "$log" 2>&1; r=$?
      grep -E "^== misuse|FAILED" "$log" | head -20; [ $r -eq 0 ] || fail misuse "$log" ;;
    compile)
      bounded 600 torchrun --standalone --nproc_per_node="$largest" tests/gpu/workers/compile_worker.py > "$log" 2>&1; r=$?
      grep -E "^== compile|^compile|FAILED|skipping cudagraphs" "$log" | head -20; [ $r -eq 0 ] || fail compile "$log" ;;
    killed-rank)
      bounded 900 python3 tests/gpu/workers/killed_rank.py --world "$largest" --json "$OUT/killed-rank.json" > "$log" 2>&1; r=$?
      grep -E "^killed-rank" "$log"; [ $r -eq 0 ] || fail killed-rank "$log" ;;
    soak)
      limit=$(awk -v m="$minutes" 'BEGIN {print int(m * 60 + 600)}')  # compiling and checking on top
      # The soak is a program, not a suite of cases: what it compiles ahead itself leaves out the
      # nodes heap's NVSHMEM kernels, each rank's at its first call otherwise.
      as_program bounded "$limit" torchrun --standalone --nproc_per_node="$largest" tests/gpu/workers/soak.py --minutes "$minutes" \
        --seed "$seed" --json "$OUT/soak.json" $soak_nodes > "$log" 2>&1; r=$?
      grep -E "^soak|^MISMATCH|FAILED" "$log" | head -25; [ $r -eq 0 ] || fail soak "$log" ;;
    sanitize)
      command -v compute-sanitizer > /dev/null || { echo "sanitize: compute-sanitizer not found"; rc=1; continue; }
      for w in "${fits[@]}"; do
        [ "$w" -le 4 ] || { echo "sanitize world $w: skipped (worlds up to 4: a sanitized world 8 takes too long)"; continue; }
        for tool in $tools; do
          for suite in $suites; do sanitize_one "$tool" "$suite" "$w"; done
        done
      done ;;
  esac
done
echo "== done: $([ $rc -eq 0 ] && echo 'every part passed' || echo 'FAILURES above'); logs in $OUT"
exit $rc
