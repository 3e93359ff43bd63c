"""bench/native/kbench: the C++ kernel timing tool builds, checks every product against the reference kernel,
prints its table, writes its JSON, and refuses bad options with exit status 2."""

import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "native" / "build_kbench.sh"
CXX = os.environ.get("CXX", "g++")

pytestmark = [
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the build script is for x86-64"),
    pytest.mark.skipif(shutil.which(CXX) is None, reason=f"{CXX} not found"),
    pytest.mark.skipif(not SCRIPT.exists(), reason="needs the source tree (bench/native/)"),
]
# (the sanitizer pass of .ci/run preloads libasan: not for the compiler or this uninstrumented tool)
ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


@pytest.fixture(scope="module")
def kbench(tmp_path_factory):
    out = tmp_path_factory.mktemp("kbench")
    r = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out / "kbench"


def run(kbench, *args):
    return subprocess.run([str(kbench), *args], capture_output=True, text=True, env=ENV, timeout=300)


@pytest.mark.parametrize("fmt", ["q4_K", "q4_K_r16", "q3_K_r16", "q2_K_r16", "q5_K_r16", "q6_K_r16", "iq4_xs_r16", "iq3_xxs_r16",
                                 "iq3_s_r16", "q6_K", "q8_0"])
def test_kbench_table_and_json(kbench, tmp_path, fmt):
    js = tmp_path / "k.json"
    r = run(kbench, "--type", fmt, "--rows", "48", "--k", "512", "--tokens", "1,2,3,9", "--reps", "1",
            "--json", str(js))
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[2:]]
    assert [int(x[0]) for x in rows] == [1, 2, 3, 9]
    d = json.loads(js.read_text())
    assert d["type"] == fmt.lower() and d["rows"] == 48 and d["k"] == 512 and d["dram"] is False
    assert d["range"] == [0, 48]
    assert [x["tokens"] for x in d["results"]] == [1, 2, 3, 9]
    assert all(x["gflop_per_s"] > 0 and x["max_rel_error"] < 1e-4 for x in d["results"])


def test_kbench_every_isa_agrees_with_the_reference(kbench):
    isas = run(kbench, "--type", "q4_k", "--rows", "16", "--k", "256", "--isa", "nope").stderr
    assert "available: ref" in isas
    names = isas.split("available: ")[1].split(")")[0].split(", ")
    for isa in names:
        r = run(kbench, "--type", "q5_k", "--rows", "24", "--k", "768", "--tokens", "1,4,13", "--reps", "1",
                "--isa", isa)
        assert r.returncode == 0, (isa, r.stderr)
        assert f"isa {isa}," in r.stdout
        # a thread's share of the rows, not in whole groups of 16: the repacked kernels hand the partial
        # groups at both ends to the reference loops (kernel_r16.h), which nothing in Python reaches
        for fmt in ("q4_k_r16", "q3_k_r16", "q2_k_r16", "q5_k_r16", "q6_k_r16", "iq4_xs_r16", "iq3_xxs_r16", "iq3_s_r16", "q4_k"):
            r = run(kbench, "--type", fmt, "--rows", "96", "--k", "512", "--range", "3:90", "--tokens", "1,5,9,33,50",
                    "--reps", "1", "--isa", isa)
            assert r.returncode == 0, (isa, fmt, r.stderr)
            assert "rows [3, 90)" in r.stdout


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--type", "q9_x", "--rows", "8", "--k", "256"], "unknown type"),
        (["--type", "q4_k", "--rows", "8", "--k", "100"], "multiple of 256"),
        (["--type", "q4_k", "--rows", "8", "--k", "256", "--tokens", "0"], "1..512"),
        (["--type", "q4_k", "--rows", "8", "--k", "256", "--isa", "sparc"], "not available"),
        (["--type", "q4_k", "--rows", "8", "--k", "256", "--bogus"], "unknown option"),
        (["--type"], "missing value"),
        (["--type", "q4_k", "--rows", "8", "--k", "256", "--tokens", ""], "at least one"),
        (["--type", "q4_k_r16", "--rows", "8", "--k", "256"], "multiples of 16"),
        (["--type", "q3_k_r16", "--rows", "8", "--k", "256"], "multiples of 16"),
        (["--type", "q4_k", "--rows", "8", "--k", "256", "--range", "3:3"], "0 <= N0 < N1 <= --rows"),
        (["--type", "q4_k", "--rows", "8", "--k", "256", "--range", "0:9"], "0 <= N0 < N1 <= --rows"),
        (["--type", "q4_k", "--rows", "8", "--k", "256", "--range", "3"], "takes N0:N1"),
        (["--type", "q4_k", "--rows", "8", "--k", "256", "--range", "3:x"], "takes N0:N1"),
    ],
)
def test_kbench_refuses_bad_options(kbench, args, msg):
    r = run(kbench, *args)
    assert r.returncode == 2 and msg in r.stderr and "usage:" in r.stderr, r.stderr
