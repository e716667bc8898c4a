#!/usr/bin/env bash
# The symmetric-heap GPU suite on a GPU machine that has torch but no Rust: the extension comes
# from the abi3 wheel that `make wheel` built (build/dist/*.whl, carried with build/).
#   tests/gpu/run_heap.sh            # world sizes 2 4 8 (as many as fit), logs under $OUT
#   IRONLINK_HEAP_WORLDS="2" tests/gpu/run_heap.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/ironlink-heap-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
WHL=$(ls build/dist/ironlink-*.whl | head -1)
{
  echo "python: $(command -v $PY) $($PY -V 2>&1)"; echo "wheel: $WHL"
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
  ldd --version | head -1
  nvidia-smi --query-gpu=index,name,pci.bus_id,memory.used --format=csv
  nvidia-smi topo -m
} > "$OUT/env.txt" 2>&1
# The wheel must install as is (platform tag, abi3) ...
rm -rf /tmp/ironlink-site
$PY -m pip install -q --no-index --no-deps --target /tmp/ironlink-site "$WHL" > "$OUT/pip.log" 2>&1
echo "pip install rc=$?" >> "$OUT/pip.log"
# ... and its extension serves the sources of this tree (so PYTHONPATH has one ironlink package).
$PY - "$WHL" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
name = next(n for n in z.namelist() if n.startswith("ironlink/_native"))
open("triton/ironlink/" + name.split("/")[-1], "wb").write(z.read(name))
print("extracted", name)
PY
# The installed wheel works on its own: extension, sources and packaged bitcode.
PYTHONPATH=/tmp/ironlink-site $PY -c "import ironlink, ironlink._native, ironlink.heap; print('installed wheel ok:', ironlink.__file__, ironlink._lib.PACKAGE_LIB_DIR, sorted(p.name for p in ironlink._lib.PACKAGE_LIB_DIR.glob('*.bc')))" >> "$OUT/pip.log" 2>&1
export PYTHONPATH=$PWD/triton${PYTHONPATH:+:$PYTHONPATH}
$PY -c "import ironlink._native as n, ironlink.heap; print('native ok, driver', n.driver_available(), 'devices', n.device_count())" 2>&1 | tee -a "$OUT/env.txt"
timeout 280 $PY -m pytest -q -s -rA tests/gpu/test_heap.py 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
grep -hE "HEAP SUITE|OK, received|FAIL|passed|failed" "$OUT/pytest.log" | tail -40
exit $rc
