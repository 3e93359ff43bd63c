"""Replay every input the fuzzer (fuzz/fuzz_inputs.py) found a bug with: each must now be accepted or
refused with the project's own error, never another exception or a crash."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAVED = Path(__file__).resolve().parent / "fuzz_regressions"


def _harness():
    spec = importlib.util.spec_from_file_location("fuzz_inputs", ROOT / "fuzz" / "fuzz_inputs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CASES = sorted((f.parent.name, f) for f in SAVED.glob("*/*") if f.is_file())


def test_there_are_saved_findings():
    assert {t for t, _ in CASES} >= {"gguf", "config", "safetensors"}


@pytest.mark.parametrize("target,path", CASES, ids=[f"{t}/{p.name[:24]}" for t, p in CASES])
def test_saved_input_is_refused_cleanly(target, path, tmp_path, monkeypatch):
    h = _harness()
    monkeypatch.setattr(h, "SCRATCH", tmp_path)
    h.RUN[target](path.read_bytes())
