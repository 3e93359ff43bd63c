#!/usr/bin/env bash
# Instructions the NEON dot-product kernels execute per weight row, super-block and token, for q4_K weights
# in the file's layout and repacked by 16 rows (q4_k_r16): a proxy for their cost where no Arm machine is
# at hand. Cross-compiles the kernel sources with the extension's flags (CMakeLists.txt) and
# bench/native/icount_driver.cpp, runs it under qemu-aarch64 with its per-block execution log limited to
# kernels_neon_dotprod.o's code, and counts the instructions of every block executed. Instruction counts,
# not times: a core's throughput per instruction class (sdot, loads, float) is not modelled. With FORMAT
# names after JSON (q2_k, iq3_xxs, ...), also each format's product by that table against the scalar
# reference's (kernels_ref.o, compiled with the same flags), at 1 and 4 tokens.
#
#   bash bench/native/icount_aarch64.sh OUTDIR [JSON [FORMAT ...]]   (needs aarch64-linux-gnu-g++, qemu-aarch64)
set -euo pipefail
out="${1:?usage: icount_aarch64.sh OUTDIR [JSON [FORMAT ...]]}"
json="${2:-}"
formats=("${@:3}")
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
text_of() {  # OBJECT: "START+SIZE" of its .text
  awk -v o="$1" '$1 == ".text" && index($4, o) && substr($4, length($4) - length(o) + 1) == o {print $2 "+" $3; exit}' \
    "$out/icount_driver.map"
}
neon_text=$(text_of kernels_neon_dotprod.o)
ref_text=$(text_of kernels_ref.o)
[ -n "$neon_text" ] && [ -n "$ref_text" ] || { echo "icount_aarch64.sh: no .text of the kernel objects in the map" >&2; exit 1; }

# instructions executed in the code ranges FILTER by: icount_driver ARGS...
count() {
  local filter=$1
  shift
  "$qemu" -cpu max -d in_asm,exec,nochain -dfilter "$filter" -D "$out/log" "$out/icount_driver" "$@" >/dev/null
  python3 - "$out/log" <<'PY'
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
}

echo "q4_K, $rows rows x $k, NEON dot-product table: instructions per row, super-block and token"
results=()
for m in 1 2 4 8 16; do
  line="$m"
  for layout in q4_k q4_k_r16; do
    line="$line $(count "$neon_text" "$layout" $rows $k $m $reps)"
  done
  results+=("$line")
done
lowbit=()
for f in "${formats[@]}"; do
  for m in 1 4; do
    lowbit+=("$f $m $(count "$neon_text" "$f" $rows $k $m $reps) $(count "$ref_text" "ref:$f" $rows $k $m $reps)")
  done
done
rm -f "$out/log"
python3 - "$rows" "$k" "$reps" "$json" "${#results[@]}" "${results[@]}" "${lowbit[@]}" <<'PY'
import json, sys
rows, k, reps, out, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
per = lambda count, m: count / reps / (rows * k // 256) / m
table = []
print(f"{'tokens':>6} {'q4_k':>8} {'q4_k_r16':>9} {'ratio':>6}")
for entry in sys.argv[6:6 + n]:
    m, a, b = (int(v) for v in entry.split())
    table.append({"tokens": m, "q4_k": round(per(a, m), 1), "q4_k_r16": round(per(b, m), 1), "ratio": round(a / b, 2)})
    print(f"{m:>6} {per(a, m):>8.1f} {per(b, m):>9.1f} {a / b:>5.2f}x")
formats = []
if sys.argv[6 + n:]:
    print(f"\n(per 256 weights of a row and token; {rows} rows x {k})")
    print(f"{'format':>11} {'tokens':>6} {'neon':>8} {'ref':>8} {'ratio':>6}")
for entry in sys.argv[6 + n:]:
    name, m, a, b = entry.split()
    m, a, b = int(m), int(a), int(b)
    formats.append({"format": name, "tokens": m, "neon": round(per(a, m), 1), "ref": round(per(b, m), 1),
                    "ratio": round(b / a, 2)})
    print(f"{name:>11} {m:>6} {per(a, m):>8.1f} {per(b, m):>8.1f} {b / a:>5.2f}x")
if out:
    with open(out, "w") as f:
        json.dump({"isa": "neon+dotprod (qemu-aarch64 -cpu max)", "rows": rows, "k": k, "unit":
                   "instructions per weight row, super-block and token", "results": table,
                   "formats": formats}, f, indent=1)
PY
