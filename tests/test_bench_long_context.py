"""bench/bench_long_context.py: a short run prints its table and writes JSON; prompt lengths the file's
context cannot hold (with the tokens to decode after them) are refused up front in one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "bench_long_context.py"

pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="needs the source tree (bench/)")


def run(tmp_path, *args):
    return subprocess.run([sys.executable, str(SCRIPT), "--json", str(tmp_path / "lc.json"), *map(str, args)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)


def test_short_run_writes_its_rows(tmp_path):
    r = run(tmp_path, "--lengths", "256", "--new", "4", "--threads", "1")
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "lc.json").read_text())["rows"]
    assert [x["prompt_tokens"] for x in rows] == [256] and rows[0]["new_tokens"] == 4
    assert rows[0]["kv_bytes_per_token"] > 0 and "Clover-35B-A3B shape" in r.stdout


@pytest.mark.parametrize("lengths", ["0", "abc", "131069", "256,131072"])
def test_lengths_the_context_cannot_hold_are_refused(tmp_path, lengths):
    # the shipped model's context is 131072: with 4 new tokens the longest prompt is 131068
    r = run(tmp_path, "--lengths", lengths, "--new", "4")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error: --lengths") and len(r.stderr.strip().splitlines()) == 1
    assert "131068" in r.stderr and not (tmp_path / "lc.json").exists()  # refused before any run
