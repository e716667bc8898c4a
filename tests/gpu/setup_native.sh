#!/usr/bin/env bash
# Source me on a GPU machine (torch, no Rust): puts the extension from the abi3 wheel that
# `make wheel` built (build/dist/*.whl, carried with build/) next to this tree's sources, and
# exports PYTHONPATH (the package, and bench/ for the benchmark harness `ironlink_bench`) and the
# multicast-off variables.
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
