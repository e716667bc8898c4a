#!/usr/bin/env bash
# Source me on a GPU machine (torch, no Rust): puts the extension from the abi3 wheel that
# `make wheel` built (build/dist/*.whl, carried with build/) next to this tree's sources, and
# exports PYTHONPATH (the package, and bench/ for the benchmark harness `ironlink_bench`) and the
# multicast-off variables. Defines `program_records` and `pack_program_records` for the programs'
# compile records.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
WHL=$(ls build/dist/ironlink-*.whl 2>/dev/null | head -1)
if [ -z "$WHL" ]; then
  echo "no wheel in build/dist: run 'make wheel' where Rust is installed and carry build/" >&2
  return 1 2>/dev/null || exit 1
fi
python3 - "$WHL" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
name = next(n for n in z.namelist() if n.startswith("ironlink/_native"))
open("python/ironlink/" + name.split("/")[-1], "wb").write(z.read(name))
PY
export PYTHONPATH=$PWD/python:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}

# Programs' compile records (python/ironlink/runtime/compile_records.py; docs/gpu-testing.md,
# "Compiling ahead"): `program_records DIR` makes every program that starts with
# ironlink.init_distributed compile the committed records of its world ahead, and record what
# each rank compiles under DIR/compile_ahead (with DIR empty: no recording); `pack_program_records
# DIR` packs those into DIR/compile-records-programs.tar (a device call brings back 8 files).
program_records() {
  export IRONLINK_COMPILE_AHEAD=${IRONLINK_COMPILE_AHEAD-$PWD/tests/gpu/compile_ahead}
  if [ -n "$1" ]; then export IRONLINK_COMPILE_RECORD=${IRONLINK_COMPILE_RECORD-$1/compile_ahead}; fi
}
pack_program_records() {
  local records=${IRONLINK_COMPILE_RECORD:-}
  if [ -n "$records" ] && [ -d "$records" ] && [ -n "$(ls -A "$records")" ]; then
    tar -cf "$1/compile-records-programs.tar" -C "$records" .
  fi
}
