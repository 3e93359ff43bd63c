#!/usr/bin/env bash
# Build bench/native/kbench (a C++ timing of one kernel table's products, one thread, no Python) into OUT:
# the kernel sources with the flags CMakeLists.txt gives them. x86-64 with GCC or Clang.
#
#   bash bench/native/build_kbench.sh /tmp/kbench && /tmp/kbench/kbench --type q4_k --rows 512 --k 2048
set -euo pipefail
out="${1:?usage: build_kbench.sh OUTDIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
src="$root/csrc"
cxx="${CXX:-g++}"
case "$(uname -m)" in x86_64|amd64) ;; *) echo "build_kbench.sh: x86-64 only (this is $(uname -m))" >&2; exit 2 ;; esac
mkdir -p "$out"
base=(-O3 -ffp-contract=off -std=c++17 -I"$src" -DCLOVER_HAVE_AVX2 -DCLOVER_HAVE_AVX512)
avx2=(-mavx2 -mfma -mf16c)
avx512=(-mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c -Wno-maybe-uninitialized)
files=()
build() {  # build NAME SOURCE [FLAGS...]
    local name="$1" source="$2"
    shift 2
    "$cxx" "${base[@]}" "$@" -c "$source" -o "$out/$name.o" &
    files+=("$out/$name.o")
}
avxvnni=()
if echo 'int main(){}' | "$cxx" -mavxvnni -x c++ - -o /dev/null 2>/dev/null; then
    base+=(-DCLOVER_HAVE_AVXVNNI)
    avxvnni=(1)
fi
build quants "$src/quants.cpp"
build quants_avx2 "$src/quants_avx2.cpp" "${avx2[@]}"
wait
build kernels_ref "$src/kernels_ref.cpp"
build kernels_avx2 "$src/kernels_avx2.cpp" "${avx2[@]}"
wait
build kernels_avx512 "$src/kernels_avx512.cpp" "${avx512[@]}"
if [[ -n "${avxvnni[*]}" ]]; then build kernels_avxvnni "$src/kernels_avxvnni.cpp" "${avx2[@]}" -mavxvnni; fi
wait
build dispatch "$src/dispatch.cpp"
build kbench "$root/bench/native/kbench.cpp"
wait
"$cxx" "${files[@]}" -o "$out/kbench" -lpthread
echo "built $out/kbench"
