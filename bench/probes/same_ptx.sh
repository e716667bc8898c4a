#!/usr/bin/env bash
# Did a change of device/ change the code? Lowers the bitcode of two build directories to PTX
# (the toolchain's llc, every arch and the NVSHMEM variants) and compares it, with comments and
# Rust's mangled names left out: a refactor that moves functions between modules renames their
# mangled symbols and LLVM's value names, not one instruction. No GPU.
#
#   cp build/*.bc /tmp/bc_before/          # before the change (after `make all-archs`)
#   make all-archs && bench/probes/same_ptx.sh /tmp/bc_before build
#
# Exit status 0 when every arch's PTX is the same; each differing arch is named with its count of
# differing lines (the PTX files stay in $TMPDIR/same_ptx for a diff).
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: bench/probes/same_ptx.sh BEFORE_DIR AFTER_DIR" >&2; exit 2; }
cd "$(dirname "$0")/../.."
# The toolchain's LLVM tools, as the tests find them ($IRONLINK_LLVM_BIN, which make test sets),
# else where the Makefile's LLVM_BIN points.
llvm_bin=${IRONLINK_LLVM_BIN:-$(make -s --no-print-directory print-llvm-bin)}
llc="$llvm_bin/llc"
[ -x "$llc" ] || { echo "no llc at $llc (rustup component add llvm-tools)" >&2; exit 2; }
work=${TMPDIR:-/tmp}/same_ptx
mkdir -p "$work"
# The PTX, less what a move renames: comments (LLVM's block names) and mangled Rust symbols.
normalized() { sed -E 's#//.*##; s/_R[A-Za-z0-9_]+/MANGLED/g; s/[ \t]+$//' "$1"; }
rc=0
for before in "$1"/ironlink_*sm*.bc; do
  name=$(basename "$before" .bc)
  after=$2/$name.bc
  [ -f "$after" ] || { echo "$name: missing in $2"; rc=1; continue; }
  arch=${name##*_}
  for side in before after; do
    "$llc" -O3 -mtriple=nvptx64-nvidia-cuda -mcpu="sm_${arch#sm}" "${!side}" -o "$work/$name.$side.ptx" || rc=1
  done
  lines=$(diff <(normalized "$work/$name.before.ptx") <(normalized "$work/$name.after.ptx") | wc -l)
  if [ "$lines" -eq 0 ]; then echo "$name: same PTX"; else echo "$name: $lines differing lines"; rc=1; fi
done
exit $rc
