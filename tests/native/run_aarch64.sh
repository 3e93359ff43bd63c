#!/usr/bin/env bash
# Cross-compile the native kernel test for aarch64 and run it under qemu-user on two CPU models:
# cortex-a53 (Armv8.0, no dot product: the plain NEON table) and max (dot product: both tables).
# Usage: tests/native/run_aarch64.sh [BUILD_DIR]   (default: a temporary folder, removed afterwards)
# Needs aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: g++-aarch64-linux-gnu qemu-user).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cxx=${CXX_AARCH64:-aarch64-linux-gnu-g++}
qemu=${QEMU_AARCH64:-qemu-aarch64}

if [ $# -ge 1 ]; then
  build=$1
  mkdir -p "$build"
else
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
fi

# shellcheck source=tests/native/aarch64_objects.sh
. "$root/tests/native/aarch64_objects.sh"
echo "compiling with $("$cxx" --version | head -n 1)"
aarch64_objects "$cxx" "$root" "$build" tests/native/test_kernels_native.cpp

# The +dotprod object must not define shared (weak / COMDAT) symbols: the linker could pick its copy of
# an inline function for the whole program, and a CPU without dot product would then run Armv8.2 code.
nm=${cxx%g++}nm
if command -v "$nm" >/dev/null 2>&1; then
  weak=$("$nm" -C "$build/kernels_neon_dotprod.o" | awk '$2 ~ /^[WVuiw]$/' || true)
  if [ -n "$weak" ]; then
    echo "kernels_neon_dotprod.o defines shared symbols:"
    echo "$weak"
    exit 1
  fi
fi

"$cxx" -static -pthread "$build"/*.o -o "$build/test_kernels_native"

status=0
for cpu in cortex-a53 max; do
  case $cpu in cortex-a53) dp=no ;; *) dp=yes ;; esac
  echo "== qemu-aarch64 -cpu $cpu"
  "$qemu" -cpu "$cpu" "$build/test_kernels_native" --expect-dotprod=$dp || status=1
done
exit $status
