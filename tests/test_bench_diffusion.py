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


def classify(path):
    """The byte split by the gguf package's reader and the tensor naming rule alone: routed experts are
    blk.<i>.ffn_{gate,up,down}_exps (the shared expert, _shexp, and the router, ffn_gate_inp, are dense),
    the head is output.weight (the embedding table where tied), the embedding table is not read."""
    import re

    import gguf

    r = gguf.GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    E = int(r.fields[f"{arch}.expert_count"].parts[-1][0])
    k = int(r.fields[f"{arch}.expert_used_count"].parts[-1][0])
    names = {t.name: int(t.n_bytes) for t in r.tensors}
    routed: dict[int, int] = {}
    for n, b in names.items():
        m = re.fullmatch(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight", n)
        if m:
            routed[int(m[1])] = routed.get(int(m[1]), 0) + b
    head = names.get("output.weight", names["token_embd.weight"])
    dense = sum(b for n, b in names.items() if n not in ("output.weight", "token_embd.weight")) - sum(routed.values())
    return E, k, dense, head, [routed[i] / E for i in sorted(routed)]


def test_forward_bytes_by_the_tensor_names(tmp_path):
    # clover_cpu.commands.bench's split (its weight_bytes_per_token is checked against the reader in
    # test_bench_cli.py) against the naming rule
    from clover_cpu.commands.bench import build_model, forward_bytes, weight_bytes

    path = build_model(tmp_path, "tiny", lambda s: None)
    w = weight_bytes(path)
    E, k, dense, head, per_layer = classify(path)
    assert (w["n_expert"], w["n_expert_used"], w["dense"], w["head"]) == (E, k, dense, head) and E > k and head > 0
    assert w["expert_by_layer"] == pytest.approx(per_layer) and len(per_layer) > 1
    # per-layer counts weigh each layer's own experts
    counts = [1 + i % 3 for i in range(len(per_layer))]
    want = dense + sum(c * b for c, b in zip(counts, per_layer))
    assert forward_bytes(w, counts, False) == pytest.approx(want)
    assert forward_bytes(w, counts, True) == pytest.approx(want + head)
    with pytest.raises(ValueError, match="MoE layers"):
        forward_bytes(w, counts[:-1], True)


def test_record_then_replay_reports_the_bandwidth_floor(tmp_path):
    from clover_cpu.commands.bench import build_model

    traces, out = tmp_path / "traces.json", tmp_path / "replay.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "record", "--prompts", "2", "--new", "8", "--threads", "1",
                        "--out", str(traces)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(traces.read_text())
    assert 0 < doc["generated"] <= 16 and doc["decode_forwards"] >= 1
    model = build_model(tmp_path, "tiny", lambda s: None)
    r = subprocess.run([sys.executable, str(SCRIPT), "replay", "-m", str(model), "--traces", str(traces), "--reps", "1",
                        "--threads", "1", "--json", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "bandwidth floor" in r.stdout and "may sit in the caches" in r.stdout  # a tiny model: no bound
    res = json.loads(out.read_text())
    bf, d, a = res["bandwidth_floor"], res["diffusion"], res["ar"]
    assert d["generated"] == doc["generated"] and d["forwards"] == doc["decode_forwards"]
    assert bf["read_gbps"] > 0 and bf["threads"] == 1 and bf["bound"] is False
    assert [c["T"] for c in bf["curve"]] == [1, 2, 4, 8, 16, 32]
    floors = [c["floor_seconds"] for c in bf["curve"]]
    assert floors[0] == min(floors) > 0  # one position touches the fewest experts
    # the decoding forwards only (the prompt's prefill left out): each reads the dense tensors and at
    # most the head and every expert
    E, k, dense, head, per_layer = classify(model)
    bps = bf["read_gbps"] * 1e9
    assert d["forwards"] * (dense + k * sum(per_layer)) / bps <= bf["diffusion_floor_seconds"]
    assert bf["diffusion_floor_seconds"] <= d["forwards"] * (dense + head + E * sum(per_layer)) / bps
    assert bf["ceiling_vs_ar_measured"] == pytest.approx(d["generated"] / bf["diffusion_floor_seconds"] / a["tokens_per_second"])
    assert bf["ceiling_vs_ar_at_floor"] == pytest.approx(
        bf["diffusion_floor_tokens_per_second"] / bf["ar_floor_tokens_per_second"])
    step = bf["block_step"]
    assert step["T"] == doc["block_length"] and step["bytes_over_ar"] > 1
    assert step["tokens_for_1_5x"] == pytest.approx(1.5 * step["tokens_to_tie"])
