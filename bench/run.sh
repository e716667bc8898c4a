#!/usr/bin/env bash
# Runs the side-by-side benchmark on the local GPUs (a machine with torch; the extension comes from
# build/dist, see tests/gpu/setup_native.sh) and writes JSON under $OUT (default bench/results).
#   bench/run.sh                      # all local GPUs, 1 KiB .. 1 GiB, bf16 and fp32
#   bench/run.sh --max-bytes 268435456 --dtypes bf16
exec "$(dirname "$0")/run_py.sh" allreduce "$@"
