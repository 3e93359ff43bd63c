# Sourced by tests/native/run_aarch64.sh and bench/native/icount_aarch64.sh (bash, set -euo pipefail).
# aarch64_objects CXX ROOT OUT [SRC ...]: the kernel sources, and each SRC (relative to ROOT), cross-compiled
# by CXX into OUT/<name>.o in parallel with the extension's flags (CMakeLists.txt), warnings as errors;
# kernels_neon_dotprod.cpp is the only file with -march (armv8.2-a+dotprod). Fails if any compile fails.
aarch64_objects() {
  local cxx=$1 root=$2 out=$3
  shift 3
  local flags=(-std=c++17 -O3 -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -Werror -DCLOVER_HAVE_NEON
               -I"$root/csrc" -pthread)
  local sources=(csrc/quants.cpp csrc/quants_lowbit.cpp csrc/quants_kquant_low.cpp csrc/kernels_ref.cpp csrc/kernels_neon.cpp
                 csrc/dispatch.cpp csrc/ops.cpp csrc/model_ops.cpp csrc/model_ops_neon.cpp csrc/threadpool.cpp "$@")
  local pids=() src pid
  for src in "${sources[@]}"; do
    "$cxx" "${flags[@]}" -c "$root/$src" -o "$out/$(basename "$src" .cpp).o" &
    pids+=($!)
  done
  "$cxx" "${flags[@]}" -march=armv8.2-a+dotprod -c "$root/csrc/kernels_neon_dotprod.cpp" \
    -o "$out/kernels_neon_dotprod.o" &
  pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid"; done
}
