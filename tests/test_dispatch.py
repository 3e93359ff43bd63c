"""Run-time ISA choice, the CLOVER_ISA override, and `clover-cpu info --system`."""

import json
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import clover_cpu


def run(code, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e)


def test_system_info_fields():
    info = clover_cpu.system_info()
    assert info["isa"] in info["available_isas"]
    assert info["available_isas"][0] == "ref"
    assert info["threads"] >= 1 and info["default_threads"] >= 1
    if platform.machine() in ("x86_64", "AMD64") and info["cpu_features"]["avx2"] and info["cpu_features"]["fma"]:
        f = info["cpu_features"]
        if all(f[k] for k in ("avx512f", "avx512bw", "avx512vl", "avx512vnni")):
            best = "avx512"  # ("amx" is offered, with the tiles and the OS granting them, not chosen)
            assert ("amx" in info["available_isas"]) <= (info["available_isas"][-1] == "amx")
        elif f["avxvnni"] and "avxvnni" in info["available_isas"]:  # (a compiler without -mavxvnni: absent)
            best = "avxvnni"
        else:
            best = "avx2"
        assert "avx2" in info["available_isas"] and info["isa"] == best
        assert ("avxvnni" in info["available_isas"]) <= f["avxvnni"]
    if platform.machine() in ("aarch64", "arm64"):
        assert info["isa"] == "neon"


@pytest.mark.parametrize("isa", clover_cpu.system_info()["available_isas"])
def test_env_forces_isa(isa):
    r = run("import clover_cpu; print(clover_cpu.system_info()['isa'])", CLOVER_ISA=isa)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == isa


def test_env_unavailable_isa_is_clear_error():
    """A bad CLOVER_ISA does not break `import clover_cpu` (the command line reports it in one line), and
    system_info() / load() raise ValueError naming it."""
    bad = "neon" if platform.machine() in ("x86_64", "AMD64") else "avx2"
    r = run("import clover_cpu\ntry:\n    clover_cpu.system_info()\nexcept ValueError as e:\n    print(e)", CLOVER_ISA=bad)
    assert r.returncode == 0, r.stderr
    assert f"CLOVER_ISA: ISA '{bad}' is not available" in r.stdout


def test_env_threads():
    r = run("import clover_cpu; print(clover_cpu.system_info()['threads'])", CLOVER_THREADS="1")
    assert r.stdout.strip() == "1", r.stderr


def test_cli_info_system():
    r = subprocess.run([sys.executable, "-m", "clover_cpu", "info", "--system", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["isa"] == clover_cpu.system_info()["isa"]
    dotprod = clover_cpu.system_info()["cpu_features"].get("dotprod", False)
    x86 = info["isa"] in ("avx2", "avxvnni", "avx512", "amx")
    assert ("q4_k" in info["repack"]) == (x86 or (info["isa"] == "neon" and dotprod))
    for fmt in ("iq4_xs", "iq3_xxs", "iq3_s"):
        assert (fmt in info["repack"]) == (x86 or (info["isa"] == "neon" and dotprod))
    assert ("q3_k" in info["repack"]) == x86
    for fmt in ("q5_k", "q6_k"):
        assert (fmt in info["repack"]) == (info["isa"] == "avx2")
    # what a bug report needs: version, ISA chosen and available, threads, numpy, OS, CPU model
    assert info["version"] == clover_cpu.__version__ and info["available_isas"] and info["threads"] >= 1
    assert info["packages"]["numpy"] == np.__version__ and info["os"] and info["cpu_model"]
    r = subprocess.run([sys.executable, "-m", "clover_cpu", "info", "--system"], capture_output=True, text=True)
    for field in ("kernels:", "threads:", "repack:", "os:", "cpu model:", f"numpy {np.__version__}"):
        assert field in r.stdout, field


def test_cli_errors_are_one_line():
    r = subprocess.run([sys.executable, "-m", "clover_cpu", "info"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "error" in r.stderr
    r = subprocess.run([sys.executable, "-m", "clover_cpu"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stdout
