import os
import sys

import numpy as np
import pytest

import clover_cpu

# Test modules import shared helpers from here (pytest runs with --import-mode=importlib).
sys.path.insert(0, os.path.dirname(__file__))


def pytest_report_header(config):
    info = clover_cpu.system_info()
    return f"clover-cpu kernels: {info['isa']} (available {info['available_isas']}), threads {info['threads']}"


@pytest.fixture(autouse=True, scope="session")
def _neutral_cwd(tmp_path_factory):
    """Run every test (and the subprocesses it starts) outside the source tree: `python -m clover_cpu`
    and `python -c` put the working directory first on sys.path, and the repository's clover_cpu/
    folder (no compiled extension) would shadow the installed package."""
    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(old)


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """mode auto keeps measured forward costs in the user's cache folder: the tests (and the commands
    they start) use a folder of their own instead of ~/.cache."""
    old = os.environ.get("CLOVER_CACHE_DIR")
    os.environ["CLOVER_CACHE_DIR"] = str(tmp_path_factory.mktemp("clover-cache"))
    yield
    if old is None:
        os.environ.pop("CLOVER_CACHE_DIR", None)
    else:
        os.environ["CLOVER_CACHE_DIR"] = old


def int8_exact(isa, m, fmt):
    """Whether the ISA's product of m tokens with weights of format fmt sums the same int8 block dots as the
    scalar path: not where the "amx" table takes its bf16 tiles (from kernels.amx_min_tokens(fmt) tokens;
    tests compare those with float64 instead, tests/test_amx.py)."""
    from clover_cpu import kernels

    mt = kernels.amx_min_tokens(fmt, isa) if isa == "amx" else 0
    return not (mt and m >= mt)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def check_close(actual, expected, tol, what=""):
    """Assert max|a - e| <= tol * max(|e|, tiny); on failure print the first mismatches (llm.c style)."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    scale = max(float(np.abs(expected).max(initial=0.0)), 1e-30)
    diff = np.abs(actual - expected)
    bad = diff > tol * scale
    if bad.any():
        idx = np.argwhere(bad)[:5]
        lines = [f"  at {tuple(i)}: got {actual[tuple(i)]!r}, want {expected[tuple(i)]!r}" for i in idx]
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} values off; max diff {diff.max():.3e} "
            f"(tolerance {tol:.1e} x {scale:.3e})\n" + "\n".join(lines)
        )
