"""bench/bench_diffusion.py: record the shipped Clover's forwards, replay them on another model, and bound
the replay by the read bandwidth (the weight bytes each forward must stream)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "bench_diffusion.py"

pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="needs the source tree (bench/)")


def load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_diffusion", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_forward_bytes_match_the_ar_roofline_and_the_file(tmp_path):
    # one token touching k experts per layer reads what `clover-cpu bench`'s roofline counts per token;
    # all the kinds together are the file's tensors but the embedding (the gguf package's reader)
    import gguf

    from clover_cpu.commands.bench import build_model, weight_bytes_per_token

    bd = load_script()
    path = build_model(tmp_path, "tiny", lambda s: None)
    w = bd.weight_bytes(path)
    r = gguf.GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    k = int(r.fields[f"{arch}.expert_used_count"].parts[-1][0])
    assert w["n_expert"] == int(r.fields[f"{arch}.expert_count"].parts[-1][0]) > k
    assert abs(bd.forward_bytes(w, k, True) - weight_bytes_per_token(path)) <= 1
    total = sum(t.n_bytes for t in r.tensors if t.name != "token_embd.weight")
    assert abs(bd.forward_bytes(w, w["n_expert"], True) - total) <= 1e-6 * total
    assert bd.forward_bytes(w, k, False) == bd.forward_bytes(w, k, True) - w["head"] and w["head"] > 0


def test_record_then_replay_reports_the_bandwidth_floor(tmp_path):
    from clover_cpu.commands.bench import build_model

    traces, out = tmp_path / "traces.json", tmp_path / "replay.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "record", "--prompts", "2", "--new", "8", "--threads", "1",
                        "--out", str(traces)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(traces.read_text())
    assert doc["generated"] == 16 and doc["decode_forwards"] >= 2
    model = build_model(tmp_path, "tiny", lambda s: None)
    r = subprocess.run([sys.executable, str(SCRIPT), "replay", "-m", str(model), "--traces", str(traces), "--reps", "1",
                        "--threads", "1", "--json", str(out)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "bandwidth floor" in r.stdout and "may sit in the caches" in r.stdout  # a tiny model: no bound
    res = json.loads(out.read_text())
    bf, d, a = res["bandwidth_floor"], res["diffusion"], res["ar"]
    assert bf["read_gbps"] > 0 and [c["T"] for c in bf["curve"]] == [1, 2, 4, 8, 16, 32]
    floors = [c["floor_seconds"] for c in bf["curve"]]
    assert all(f > 0 for f in floors) and floors == sorted(floors)  # more positions touch more experts
    assert bf["ceiling_vs_ar_measured"] == pytest.approx(bf["diffusion_floor_tokens_per_second"] / a["tokens_per_second"])
    assert bf["ceiling_vs_ar_at_floor"] == pytest.approx(
        bf["diffusion_floor_tokens_per_second"] / bf["ar_floor_tokens_per_second"])
    step = bf["block_step"]
    assert step["T"] == doc["block_length"] and step["bytes_over_ar"] > 1
    assert step["tokens_for_1_5x"] == pytest.approx(1.5 * step["tokens_to_tie"])
    assert d["generated"] == 16 and d["forwards"] == doc["decode_forwards"]
