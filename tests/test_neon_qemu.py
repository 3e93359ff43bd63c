"""The NEON kernels and model operators, cross-compiled for aarch64 and run under qemu-user against the scalar reference.

tests/native/run_aarch64.sh builds tests/native/test_kernels_native.cpp with the NEON sources and runs it on
a CPU without the dot-product extension (cortex-a53) and on one with it (max); each run ends with the line
"N passed, M failed". bench/native/icount_aarch64.sh counts the instructions of the q4_K products there.
"""

import json
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "native" / "run_aarch64.sh"
TOOLS = ["aarch64-linux-gnu-g++", "qemu-aarch64"]
MISSING = [t for t in TOOLS if shutil.which(t) is None]


needs_qemu = pytest.mark.skipif(
    bool(MISSING),
    reason=f"{' and '.join(MISSING)} not found (Debian: apt-get install g++-aarch64-linux-gnu qemu-user)",
)
needs_source = pytest.mark.skipif(
    not (ROOT / "csrc" / "kernels_neon.cpp").exists(), reason="needs the source tree (csrc/)"
)


@needs_qemu
@needs_source
@pytest.mark.skipif(
    platform.machine() in ("aarch64", "arm64"), reason="runs natively on aarch64 (test_matmul)"
)
def test_neon_kernels_under_qemu(tmp_path):
    r = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path)], check=False, capture_output=True, text=True, timeout=900
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    # one summary line per CPU model, and the dot-product table ran on the CPU that has it
    totals = [
        (int(p), int(f)) for p, f in re.findall(r"^(\d+) passed, (\d+) failed$", r.stdout, re.MULTILINE)
    ]
    assert len(totals) == 2 and all(p > 0 and f == 0 for p, f in totals), out[-6000:]
    assert re.search(r"^neon\+dotprod: \d+ passed, 0 failed$", r.stdout, re.MULTILINE), out[-6000:]
    # the model operators' NEON table ran against the scalar one on both CPUs
    assert len(re.findall(r"^model ops neon: [1-9]\d* passed, 0 failed$", r.stdout, re.MULTILINE)) == 2, out[-6000:]


@needs_qemu
@needs_source
def test_instruction_count_bench(tmp_path):
    # bench/native/icount_aarch64.sh: the NEON dot-product table's q4_K product in both layouts under qemu;
    # the repacked one executes fewer instructions at every token count (a count, not a time: deterministic);
    # an i-quant's product by the NEON table against the scalar reference's
    out = tmp_path / "icount.json"
    script = ROOT / "bench" / "native" / "icount_aarch64.sh"
    r = subprocess.run(["bash", str(script), str(tmp_path / "build"), str(out), "iq3_xxs"],
                       check=False, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    results = json.loads(out.read_text())["results"]
    assert [e["tokens"] for e in results] == [1, 2, 4, 8, 16]
    for e in results:
        assert 0 < e["q4_k_r16"] < e["q4_k"] and e["ratio"] > 1, e
    assert "q4_k_r16" in r.stdout and "ratio" in r.stdout
    # and iq3_xxs by the NEON table executes fewer instructions than the scalar reference, at 1 and 4 tokens
    formats = json.loads(out.read_text())["formats"]
    assert [(e["format"], e["tokens"]) for e in formats] == [("iq3_xxs", 1), ("iq3_xxs", 4)]
    assert all(0 < e["neon"] < e["ref"] for e in formats), formats
