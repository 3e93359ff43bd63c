"""The NEON kernels and model operators, cross-compiled for aarch64 and run under qemu-user against the scalar reference.

tests/native/run_aarch64.sh builds tests/native/test_kernels_native.cpp with the NEON sources and runs it on
a CPU without the dot-product extension (cortex-a53) and on one with it (max); each run ends with the line
"N passed, M failed".
"""

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


@pytest.mark.skipif(
    bool(MISSING),
    reason=f"{' and '.join(MISSING)} not found (Debian: apt-get install g++-aarch64-linux-gnu qemu-user)",
)
@pytest.mark.skipif(not (ROOT / "csrc" / "kernels_neon.cpp").exists(), reason="needs the source tree (csrc/)")
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
