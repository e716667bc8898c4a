#!/usr/bin/env bash
# Builds timing-diagnostic variants of the sm_90 bitcode into build/diag/<variant>/: each leaves
# a stage of the push all-reduce out (device/src/two_shot_push.rs, `ironlink_diag`), so that a
# stage's time and the cost of running both stages together come out by difference. Results
# of these builds are wrong; the benchmark only checks statuses. Then, on the GPUs:
#   IRONLINK_GIT_REV=<rev> bench/ab.sh build build/diag/no_scatter build/diag/no_reduce build/diag/no_stages \
#     -- --min-bytes 1073741824 --dtypes bf16 --skip-gather-scatter
set -euo pipefail
cd "$(dirname "$0")/.."
make -s toolchain
toolchain=$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
for v in ${DIAG_VARIANTS:-no_scatter no_reduce no_stages}; do
  mkdir -p "build/diag/$v"
  CARGO_TARGET_DIR=target/diag-$v RUSTC_BOOTSTRAP=1 \
    CARGO_TARGET_NVPTX64_NVIDIA_CUDA_RUSTFLAGS="-C target-cpu=sm_90 --cfg ironlink_diag=\"$v\"" \
    cargo +"$toolchain" rustc -q -p ironlink-device -Z build-std=core --target nvptx64-nvidia-cuda \
    --profile device --crate-type cdylib -- --emit=llvm-bc -C target-cpu=sm_90 -C linker=/bin/true
  cp "target/diag-$v/nvptx64-nvidia-cuda/device/deps/ironlink_device.bc" "build/diag/$v/ironlink_sm90.bc"
  echo "built build/diag/$v/ironlink_sm90.bc"
done
