# ironlink: `make` builds the device bitcode for one arch, `make test` runs everything CI runs.
# Both install what they need themselves (rustup components, a project-local Python venv).

CUDA_ARCH ?= sm_90
ARCHS     := sm_80 sm_90 sm_100
# The pinned toolchain of rust-toolchain.toml; RUSTC_BOOTSTRAP=1 unlocks -Z build-std and the
# nvptx features on it. Its LLVM must stay one whose bitcode the oldest supported Triton's LLVM
# (TRITON_OLDEST below) can read.
TOOLCHAIN := $(shell sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
CARGO     := RUSTC_BOOTSTRAP=1 cargo +$(TOOLCHAIN)
PYTHON    ?= python3
VENV      := .venv
VPY       := $(VENV)/bin/python
# The Triton releases the package supports (pyproject.toml's range, which a test checks against
# these): `make test` compile-tests the oldest and the newest in venvs of their own; the project
# venv has the one the GPU machines run (requirements-dev.txt).
TRITON_OLDEST := 3.5.0
TRITON_NEWEST := 3.9.0
# The wheel's platform tag: linked by zig against this glibc, so it installs where GPU users are.
MANYLINUX := manylinux_2_28
LLVM_BIN   = $(shell rustc +$(TOOLCHAIN) --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin
# DIAG=<variant> builds a timing-diagnostic bitcode (`--cfg ironlink_diag`, see
# device/src/transport/store_rounds.rs) into build/diag/<variant>/ instead (bench/probes/diag_build.sh);
# with NVSHMEM=1 its NVSHMEM bitcode (e.g. DIAG=final_ack_wait, device/src/transport/remote.rs).
DIAG      ?=
# NVSHMEM=1 builds the NVSHMEM bitcode (`--cfg ironlink_nvshmem`: device/src/hw/nvshmem.rs declares
# NVSHMEM's device functions, device/src/api/nvshmem.rs exports wrappers of them) as
# build/ironlink_nvshmem_smXX.bc; kernels link it ahead of libnvshmem_device.bc. The P2P bitcode
# never references NVSHMEM. `make nvshmem` builds it for every arch; all-archs builds both.
NVSHMEM   ?=
BCDIR      = build$(if $(DIAG),/diag/$(DIAG))
BC         = $(BCDIR)/ironlink_$(if $(NVSHMEM),nvshmem_)$(subst _,,$(CUDA_ARCH)).bc
STAMP     := build/.stamps
# pytest runs its tests in one process per core (pytest-xdist): the suites are mostly Triton
# compiles, one core each (test_triton_compile.py: 73 s in one process, 40 s in two, on 2 cores).
# worksteal: an idle process takes tests queued for the other, so a run of long compiles at the
# end does not leave a core idle (`make test-python` on 2 cores: 230 s, 296 s with the default).
PYTEST    := -m pytest -q -n auto --dist worksteal

.PHONY: all all-archs nvshmem toolchain venv abi test test-rust test-python test-triton-range lint demo wheel test-gpu bench bench-fused bench-moe bench-e2e docs clean print-llvm-bin
all: $(BC)
	@echo "bitcode ready: $(BC)"

# Every arch's bitcode, both kinds, built side by side (each rustc is one thread: codegen-units =
# 1, fat LTO).
NPROC     := $(shell nproc 2>/dev/null || echo 2)
# The P2P builds first: the jobs make runs at once then take different archs (two builds of one
# arch wait for each other's target dir).
ALL_BC    := $(foreach a,$(subst _,,$(ARCHS)),$(BCDIR)/ironlink_$(a).bc) $(foreach a,$(subst _,,$(ARCHS)),$(BCDIR)/ironlink_nvshmem_$(a).bc)
all-archs: $(STAMP)/toolchain
	@$(MAKE) --no-print-directory -j$(NPROC) $(ALL_BC)

nvshmem: $(STAMP)/toolchain
	@$(MAKE) --no-print-directory -j$(NPROC) $(filter $(BCDIR)/ironlink_nvshmem_%,$(ALL_BC))

toolchain: $(STAMP)/toolchain
$(STAMP)/toolchain: rust-toolchain.toml
	@mkdir -p $(STAMP)
	@echo "== installing Rust $(TOOLCHAIN) with rust-src, llvm-tools, rustfmt, clippy (rustup, once)"
	rustup toolchain install $(TOOLCHAIN) --profile minimal --component rust-src,llvm-tools,rustfmt,clippy
	@touch $@

venv: $(STAMP)/venv
$(STAMP)/venv: requirements-dev.txt
	@mkdir -p $(STAMP)
	@echo "== creating the project venv $(VENV) from requirements-dev.txt (once; Triton is the large download)"
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements-dev.txt
	@touch $@

DEVICE_SRC := $(shell find device/src -name '*.rs') device/Cargo.toml Cargo.toml
# One cargo target dir per arch, shared by its P2P, NVSHMEM and diagnostic builds: core is built
# once an arch (the RUSTFLAGS, which reach core, are the arch alone), the cfgs that tell the
# builds apart go to the device crate only (after `--`), and each writes its own file (--emit
# with a path), so two builds of an arch never overwrite each other's output; cargo's lock on the
# target dir runs them one after the other.
# $(call device_bc,smXX,extra rustc flags of the device crate): builds $@ from the device crate.
define device_bc
	@mkdir -p $(@D)
	@CARGO_TARGET_DIR=target/device-$(1) CARGO_TARGET_NVPTX64_NVIDIA_CUDA_RUSTFLAGS="-C target-cpu=$(subst sm,sm_,$(1))" \
	  $(CARGO) rustc -q -p ironlink-device -Z build-std=core \
	  --target nvptx64-nvidia-cuda --profile device --crate-type cdylib -- \
	  --emit=llvm-bc=$(abspath $@) -C target-cpu=$(subst sm,sm_,$(1)) -C linker=/bin/true$(2)
endef
$(BCDIR)/ironlink_%.bc: $(DEVICE_SRC) $(STAMP)/toolchain
	@echo "== building $@ (the device crate for nvptx64 $*$(if $(DIAG), as diagnostic build $(DIAG)); the first build of an arch also compiles core)"
	$(call device_bc,$*,$(if $(DIAG), --cfg ironlink_diag=\"$(DIAG)\"))
# The more specific pattern wins for build/ironlink_nvshmem_smXX.bc.
$(BCDIR)/ironlink_nvshmem_%.bc: $(DEVICE_SRC) $(STAMP)/toolchain
	@echo "== building $@ (the device crate for nvptx64 $* with the NVSHMEM wrappers$(if $(DIAG), as diagnostic build $(DIAG)); the first build of an arch also compiles core)"
	$(call device_bc,$*, --cfg ironlink_nvshmem$(if $(DIAG), --cfg ironlink_diag=\"$(DIAG)\"))

# Regenerates python/ironlink/language/_abi.py from device/src (build.rs does it on every host build).
abi: $(STAMP)/toolchain
	@echo "== generating python/ironlink/language/_abi.py (cargo build of the host crate runs build.rs)"
	@$(CARGO) build -q

# The three venvs download while the bitcode compiles (pip waits on the network, rustc on the CPU):
# one make with a slot each; all-archs runs its own -j$(NPROC) inside.
TRITON_VENVS := $(STAMP)/triton-$(TRITON_OLDEST) $(STAMP)/triton-$(TRITON_NEWEST)
test: $(STAMP)/toolchain
	@$(MAKE) --no-print-directory -j4 all-archs venv $(TRITON_VENVS)
	@$(MAKE) --no-print-directory abi wheel test-rust test-python test-triton-range lint
	@echo "== make test: everything passed"

# cargo test's binaries, each pinned to one CPU, one a CPU at a time (tests/run_rust.py says why).
test-rust: $(STAMP)/toolchain
	@echo "== Rust tests: the device code on simulated nodes (world 2 to 8), host crate units (cargo test's binaries, one a CPU)"
	@RUSTC_BOOTSTRAP=1 $(PYTHON) tests/run_rust.py --toolchain $(TOOLCHAIN)

test-python: venv
	@echo "== Python tests: bitcode symbols, Triton compile-to-cubin for sm_80/90/100, ABI sync, heap and ops checks (pytest)"
	@IRONLINK_LLVM_BIN=$(LLVM_BIN) PYTHONPATH=python $(VPY) $(PYTEST) tests

lint: $(STAMP)/toolchain venv
	@echo "== lint: mypy on the Python package and bench/ (probes/ and report/ too), cargo fmt --check, clippy -D warnings"
	cd python && ../$(VPY) -m mypy --ignore-missing-imports -p ironlink
	cd bench && ../$(VPY) -m mypy --ignore-missing-imports *.py models/*.py probes/*.py report/*.py
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy -q --workspace --all-targets -- -D warnings
	$(CARGO) clippy -q --workspace --all-targets --features python -- -D warnings

# An all-reduce across the local GPUs where there are two or more (and torch), else across 8
# simulated ranks on the CPU, running the same device code.
NGPU := $(shell nvidia-smi -L 2>/dev/null | wc -l)
demo: $(STAMP)/toolchain
	@if [ "$(NGPU)" -ge 2 ] && python3 -c 'import torch' 2>/dev/null; then \
	  echo "== $(NGPU) GPUs here: building the wheel, then examples/all_reduce.py on every GPU"; \
	  $(MAKE) --no-print-directory wheel && . tests/gpu/setup_native.sh && \
	  torchrun --standalone --nproc_per_node=$(NGPU) examples/all_reduce.py; \
	else \
	  echo "== no GPUs here: running the device code on 8 simulated GPUs, CPU threads standing in for GPU threads"; \
	  $(CARGO) run -q --release -p ironlink-device --example sim_all_reduce; \
	fi

clean:
	rm -rf build target $(VENV) .venv-triton-*

# Where the toolchain's LLVM tools are (bench/probes/same_ptx.sh asks).
print-llvm-bin:
	@echo $(LLVM_BIN)

# The abi3 Python wheel (one build serves Python 3.9+): ironlink._native plus the bitcode of every
# arch as package data (ironlink/lib/*.bc, copied in for the build and removed after). Output in
# build/dist/.
wheel: all-archs venv
	@echo "== building the abi3 wheel (maturin, linked by zig for $(MANYLINUX)) into build/dist/"
	@rm -rf python/ironlink/lib build/dist && mkdir -p python/ironlink/lib
	@cp build/ironlink_sm*.bc build/ironlink_nvshmem_sm*.bc python/ironlink/lib/
	@git describe --always --dirty > build/git_rev 2> /dev/null || rm -f build/git_rev  # benchmarks record it (bench/ironlink_bench.py)
	@PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/maturin build -q --release --zig --compatibility $(MANYLINUX) \
	  -o build/dist; s=$$?; rm -rf python/ironlink/lib; exit $$s

# The compile tests (link, inline, no local memory; the fused GPU-test kernels too; the NVSHMEM
# bitcode against the pinned NVSHMEM 3.4.5's) with the oldest and the newest supported Triton, each
# in a venv of its own (.venv-triton-X, made once). test-python compiles for sm_80/90/100 with the
# pinned Triton; here (TRITON_RANGE: version:archs) the oldest compiles for sm_90 (what differs in
# it, its API and its LLVM, is the same for every arch) and the newest for sm_90 and sm_100 (its
# newer ptxas-blackwell too). All three archs in both took 865 of make test's 1738 s at f83c6f0 on
# the 2-core CI machine (tests/_archs.py; IRONLINK_COMPILE_ARCHS=80,90,100 compiles every arch).
# They also sample the NVSHMEM link tests (IRONLINK_COMPILE_SAMPLED: one case a family of kernels,
# 6 of 19; every one runs with the pinned Triton).
TRITON_RANGE := $(TRITON_OLDEST):90 $(TRITON_NEWEST):90,100
TRITON_TESTS := $(addprefix tests/compile/,test_triton_compile.py test_ptx_shape.py test_typed.py test_fusion_compile.py \
                  test_nvshmem_link.py test_nvshmem_compile.py test_pdl.py test_compile_ahead.py)
test-triton-range: all-archs $(TRITON_VENVS)
	@for pair in $(TRITON_RANGE); do v=$${pair%%:*}; archs=$${IRONLINK_COMPILE_ARCHS:-$${pair#*:}}; \
	  echo "== compile tests with Triton $$v for sm_$$archs"; \
	  IRONLINK_COMPILE_ARCHS=$$archs IRONLINK_COMPILE_SAMPLED=1 IRONLINK_LLVM_BIN=$(LLVM_BIN) PYTHONPATH=python \
	    .venv-triton-$$v/bin/python $(PYTEST) $(TRITON_TESTS) || exit 1; \
	done
$(STAMP)/triton-%: requirements-dev.txt
	@mkdir -p $(STAMP)
	@echo "== creating .venv-triton-$* (triton==$*, pytest, pytest-xdist, numpy; again when requirements-dev.txt changes)"
	$(PYTHON) -m venv .venv-triton-$*
	.venv-triton-$*/bin/python -m pip install -q triton==$* $$(grep -E '^(pytest|pytest-xdist|numpy)==' requirements-dev.txt)
	@touch $@

# On a GPU machine with Rust: every GPU suite and the benchmark (tests/gpu/run.sh; pass parts and
# options with GPU_ARGS="collectives --worlds 4"). Without Rust there, run `make wheel` elsewhere,
# carry build/, run tests/gpu/run.sh there.
test-gpu: wheel
	tests/gpu/run.sh $(GPU_ARGS)

# The side-by-side benchmark alone (JSON under bench/results/).
bench: wheel
	bench/run.sh

# The fused-op benchmark alone (bench/results/fused-*.json).
bench-fused: wheel
	bench/run.sh fused

# The MoE dispatch / combine benchmark alone (bench/results/moe-*.json).
bench-moe: wheel
	bench/run.sh moe

# The end-to-end benchmarks alone (bench/results/e2e-*.json, e2e_moe-*.json): the dense stack, and
# the MoE stack with 256 experts and with 64 (where the experts' weights are a quarter of the step's
# floor: bench/probes/moe_step_floor.py).
bench-e2e: wheel
	bench/run.sh e2e
	bench/run.sh e2e_moe
	bench/run.sh e2e_moe --config deepseek-v3-moe-64

# The plots (docs/img/*.png) and the benchmark tables of README.md and docs/performance.md, from
# the newest bench/results/*.json at each world size (tests/packaging/test_readme_bench.py checks them).
docs: venv
	$(VPY) bench/report/plot.py
	$(VPY) bench/report/table.py --write
	$(VPY) bench/report/fused_table.py --write
	$(VPY) bench/report/moe_table.py --write
	$(VPY) bench/report/tutorial_table.py --write
	$(VPY) bench/report/backends_table.py --write
	$(VPY) bench/report/e2e_table.py --write
	$(VPY) bench/report/e2e_plot.py
