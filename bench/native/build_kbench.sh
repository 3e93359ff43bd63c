#!/usr/bin/env bash
# Build bench/native/kbench (a C++ timing of one kernel table's products, one thread, no Python) into OUT:
# the kernel sources with the flags CMakeLists.txt gives them. x86-64, with a GCC or Clang that knows the
# AVX-512 VNNI flags (as the package's own build needs: GCC 8+, Clang 6+).
#
#   bash bench/native/build_kbench.sh /tmp/kbench && /tmp/kbench/kbench --type q4_k --rows 512 --k 2048
set -euo pipefail
out="${1:?usage: build_kbench.sh OUTDIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
src="$root/csrc"
cxx="${CXX:-g++}"
case "$(uname -m)" in x86_64|amd64) ;; *) echo "build_kbench.sh: x86-64 only (this is $(uname -m))" >&2; exit 2 ;; esac
mkdir -p "$out"
rm -f "$out"/*.o "$out/kbench"
defs="-DCLOVER_HAVE_AVX2 -DCLOVER_HAVE_AVX512"
vnni=0
if echo 'int main(){}' | "$cxx" -mavxvnni -x c++ - -o /dev/null 2>/dev/null; then
    defs="$defs -DCLOVER_HAVE_AVXVNNI"
    vnni=1
fi
vbmi=0
if echo 'int main(){}' | "$cxx" -mavx512vbmi -mavx512bitalg -x c++ - -o /dev/null 2>/dev/null; then
    defs="$defs -DCLOVER_HAVE_AVX512_VBMI"
    vbmi=1
fi
base="-O3 -ffp-contract=off -std=c++17 -I$src $defs"
avx2="-mavx2 -mfma -mf16c"
avx512="-mavx512f -mavx512bw -mavx512vl -mavx512vnni $avx2 -Wno-maybe-uninitialized"
objs=""
pids=""
build() {  # build NAME SOURCE FLAGS: in the background; finish waits for every compile and fails with any
    # shellcheck disable=SC2086
    "$cxx" $base $3 -c "$2" -o "$out/$1.o" &
    pids="$pids $!"
    objs="$objs $out/$1.o"
}
finish() {
    local p
    for p in $pids; do wait "$p" || { echo "build_kbench.sh: a compile failed" >&2; exit 1; }; done
    pids=""
}
build quants "$src/quants.cpp" ""
build quants_lowbit "$src/quants_lowbit.cpp" ""
build quants_kquant_low "$src/quants_kquant_low.cpp" ""
build quants_avx2 "$src/quants_avx2.cpp" "$avx2"
finish
build kernels_ref "$src/kernels_ref.cpp" ""
build kernels_avx2 "$src/kernels_avx2.cpp" "$avx2"
finish
build kernels_avx512 "$src/kernels_avx512.cpp" "$avx512"
if [[ $vnni == 1 ]]; then build kernels_avxvnni "$src/kernels_avxvnni.cpp" "$avx2 -mavxvnni"; fi
if [[ $vbmi == 1 ]]; then build kernels_avx512_vbmi "$src/kernels_avx512_vbmi.cpp" "$avx512 -mavx512vbmi -mavx512bitalg"; fi
finish
build dispatch "$src/dispatch.cpp" ""
build kbench "$root/bench/native/kbench.cpp" ""
finish
# shellcheck disable=SC2086
"$cxx" $objs -o "$out/kbench" -lpthread
echo "built $out/kbench"
