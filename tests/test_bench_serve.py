"""bench/bench_serve.py runs end to end (clover-cpu only, the shipped model, tiny sizes) and writes its JSON:
the benchmark's plumbing, not its numbers."""

import json
import subprocess
import sys
from pathlib import Path

import clover_cpu

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_serve.py"


def test_bench_serve_smoke(tmp_path):
    out = tmp_path / "serve.json"
    r = subprocess.run([sys.executable, str(BENCH), "--model", str(clover_cpu.shipped_model()), "--streams", "1,2",
                        "--requests", "1", "--max-tokens", "8", "--ttft-prompt", "16", "--ttft-runs", "1",
                        "--mixed-prompt", "600", "--conversation", "3", "--turn-tokens", "100", "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(out.read_text())
    levels = d["levels"]["clover-cpu"]
    assert [lv["streams"] for lv in levels] == [1, 2] and all(not lv["errors"] for lv in levels)
    assert [lv["tokens"] for lv in levels] == [8, 16]  # ignore_eos: every request gives all its tokens
    assert d["ttft_512"]["clover-cpu"] > 0 and 0 <= d["overhead"]["outside_forwards"] < 1
    assert "| 2 |" in r.stdout
    mixed = d["mixed"]  # a 600-token prompt beside a stream, with the default slices and without them
    assert set(mixed) == {"clover-cpu", "clover-cpu --prefill-slice 2048"}
    assert all(m["ttft"] > 0 and m["max_gap"] > 0 for m in mixed.values())
    conv = d["conversation"]  # 3 turns of 100 new tokens: with the prompt cache, the last turn's prompt held
    held = [t["cached"] for t in conv["clover-cpu"]["turns"]]
    assert held[0] == 0 and held[1] >= 96 and held[2] >= 192, held  # (blocks of 8, a checkpoint 4 before the end)
    assert [t["cached"] for t in conv["clover-cpu, cache_prompt off"]["turns"]] == [0, 0, 0]
    assert [t["prompt_tokens"] for t in conv["clover-cpu"]["turns"]] == [100, 200, 300]
