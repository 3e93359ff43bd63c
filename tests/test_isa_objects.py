"""Each ISA file is the only one compiled with its instruction-set flags, and must stay self-contained:
a template or inline function it instantiates with external (weak) linkage, say std::vector<float>,
could be the copy the linker keeps for every other file, and run AVX-512 instructions on a CPU without
them. Compiles each x86 ISA file alone with its flags from CMakeLists.txt and checks that it defines no
weak symbols."""

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def isa_files() -> dict[str, list[str]]:
    """source file -> its COMPILE_OPTIONS, read from csrc/CMakeLists.txt (where the extension is defined)"""
    text = (ROOT / "csrc" / "CMakeLists.txt").read_text()
    out = {}
    for files, opts in re.findall(r"set_source_files_properties\(([^)]*?)PROPERTIES COMPILE_OPTIONS\s*\"([^\"]+)\"", text):
        for f in files.split():
            out[f"csrc/{f}"] = opts.split(";")
    return out


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA files")
@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")) or not shutil.which("nm"), reason="no compiler/nm")
def test_isa_files_define_no_weak_symbols(tmp_path):
    files = {f: o for f, o in isa_files().items() if "avx" in " ".join(o)}
    assert {"csrc/kernels_avx2.cpp", "csrc/kernels_avx512.cpp", "csrc/model_ops_avx512.cpp"} <= set(files)
    cxx = shutil.which("g++") or shutil.which("c++")
    for src, opts in files.items():
        probe = subprocess.run([cxx, "-x", "c++", "-c", *opts, "-", "-o", str(tmp_path / "probe.o")], input="",
                               capture_output=True, text=True)
        if probe.returncode:  # a flag this compiler does not know (CMake leaves that file out too)
            continue
        obj = tmp_path / (Path(src).stem + ".o")
        subprocess.run([cxx, "-std=c++17", "-O2", "-fPIC", "-c", *opts, str(ROOT / src), "-o", str(obj)], check=True)
        syms = subprocess.run(["nm", "-C", "--defined-only", str(obj)], capture_output=True, text=True, check=True)
        weak = [ln for ln in syms.stdout.splitlines() if re.search(r" [WVu] ", ln) and "DW.ref.__gxx_personality" not in ln]
        assert not weak, f"{src} defines weak symbols compiled with {' '.join(opts)}:\n" + "\n".join(weak[:10])
