#!/usr/bin/env bash
# Instructions the NEON dot-product kernels execute per weight row, super-block and token, for q4_K weights
# in the file's layout and repacked by 16 rows (q4_k_r16): a proxy for their cost where no Arm machine is
# at hand. Cross-compiles the kernel sources with the extension's flags (CMakeLists.txt) and
# bench/native/icount_driver.cpp, runs it under qemu-aarch64 with its per-block execution log limited to
# kernels_neon_dotprod.o's code, and counts the instructions of every block executed. Instruction counts,
# not times: a core's throughput per instruction class (sdot, loads, float) is not modelled.
#
#   bash bench/native/icount_aarch64.sh OUTDIR [JSON]     (needs aarch64-linux-gnu-g++ and qemu-aarch64)
set -euo pipefail
out="${1:?usage: icount_aarch64.sh OUTDIR [JSON]}"
json="${2:-}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cxx=${CXX_AARCH64:-aarch64-linux-gnu-g++}
qemu=${QEMU_AARCH64:-qemu-aarch64}
rows=64 k=2048 reps=3
mkdir -p "$out"
rm -f "$out"/*.o "$out/icount_driver"
# shellcheck source=tests/native/aarch64_objects.sh
. "$root/tests/native/aarch64_objects.sh"
aarch64_objects "$cxx" "$root" "$out" bench/native/icount_driver.cpp
"$cxx" -static -pthread "$out"/*.o -o "$out/icount_driver" -Wl,-Map,"$out/icount_driver.map"
# the kernel object's code in the linked program (GNU ld's map; GCC puts the object's code in one .text)
read -r lo size < <(awk '$1 == ".text" && $4 ~ /kernels_neon_dotprod\.o$/ {print $2, $3; exit}' \
  "$out/icount_driver.map") || { echo "icount_aarch64.sh: no .text of kernels_neon_dotprod.o in the map" >&2; exit 1; }

echo "q4_K, $rows rows x $k, NEON dot-product table: instructions per row, super-block and token"
results=()
for m in 1 2 4 8 16; do
  line="$m"
  for layout in q4_k q4_k_r16; do
    "$qemu" -cpu max -d in_asm,exec,nochain -dfilter "$lo+$size" -D "$out/log" \
      "$out/icount_driver" "$layout" $rows $k $m $reps >/dev/null
    n=$(python3 - "$out/log" <<'PY'
import collections, re, sys
size, hits, start = {}, collections.Counter(), None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"0x([0-9a-f]+):\s", line)
    if m:  # an instruction of the block being translated (-d in_asm); a block translated again replaces it
        if start is None:
            start = int(m.group(1), 16)
            size[start] = 0
        size[start] += 1
        continue
    start = None
    m = re.search(r"Trace \d+: \S+ \[[0-9a-f]+/([0-9a-f]+)/", line)  # a block executed (-d exec, nochain)
    if m:
        hits[int(m.group(1), 16)] += 1
print(sum(size.get(pc, 0) * c for pc, c in hits.items()))
PY
)
    line="$line $n"
  done
  results+=("$line")
done
rm -f "$out/log"
python3 - "$rows" "$k" "$reps" "$json" "${results[@]}" <<'PY'
import json, sys
rows, k, reps, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
table = []
print(f"{'tokens':>6} {'q4_k':>8} {'q4_k_r16':>9} {'ratio':>6}")
for entry in sys.argv[5:]:
    m, a, b = (int(v) for v in entry.split())
    per = lambda n: n / reps / (rows * k // 256) / m
    table.append({"tokens": m, "q4_k": round(per(a), 1), "q4_k_r16": round(per(b), 1), "ratio": round(a / b, 2)})
    print(f"{m:>6} {per(a):>8.1f} {per(b):>9.1f} {a / b:>5.2f}x")
if out:
    with open(out, "w") as f:
        json.dump({"isa": "neon+dotprod (qemu-aarch64 -cpu max)", "rows": rows, "k": k, "unit":
                   "instructions per weight row, super-block and token", "results": table}, f, indent=1)
PY
