#!/usr/bin/env bash
# Runs the GPU tests on a GPU machine (python3 with torch + triton; no Rust there: build/*.bc must
# have been built elsewhere and carried along). The log goes to $OUT/gpu-tests.log.
set -euo pipefail
cd "$(dirname "$0")/../.."

# NVLink multicast stays off on the shared machines (see /work/shared/field-notes.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-./build/gpu-out}"
mkdir -p "$OUT"
# A private Triton cache: a kernel compiled against another bitcode must not be reused.
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$(mktemp -d)}"

{
  echo "# $(date -u +%FT%TZ) $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader || true
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)' || true
  ls -l build/*.bc || echo "no bitcode in build/: build it with 'make all-archs' where Rust is installed"
} 2>&1 | tee "$OUT/gpu-tests.log"

# A hung device function must not eat the whole session: give up after GPU_TEST_TIMEOUT seconds.
if python3 -c 'import pytest' 2>/dev/null; then
  PYTHONPATH=triton timeout "${GPU_TEST_TIMEOUT:-900}" python3 -m pytest -q -rs tests/gpu "$@" 2>&1 | tee -a "$OUT/gpu-tests.log"
else
  echo "pytest is not installed: running tests/gpu/test_basic.py directly" | tee -a "$OUT/gpu-tests.log"
  PYTHONPATH=triton timeout "${GPU_TEST_TIMEOUT:-900}" python3 tests/gpu/test_basic.py 2>&1 | tee -a "$OUT/gpu-tests.log"
fi
