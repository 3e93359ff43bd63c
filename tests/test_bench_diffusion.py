"""bench/bench_diffusion.py: record the shipped Clover's forwards, replay them on another model, and bound
the replay by the read bandwidth (the weight bytes each forward must stream)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def test_record_auto_with_another_models_costs_and_expert_union(tmp_path):
    from clover_cpu.commands.bench import build_model

    model = build_model(tmp_path, "tiny", lambda s: None)
    traces = tmp_path / "auto.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "record", "--prompts", "2", "--new", "8", "--threads", "1",
                        "--mode", "auto", "--costs-model", str(model), "--out", str(traces)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert f"mode auto with {model}'s forward costs: T=1 " in r.stdout and "agreement with exact" in r.stdout
    doc = json.loads(traces.read_text())
    B = doc["block_length"]
    assert doc["mode"] == "auto" and 0 <= doc["parse_rate"] <= 1 and doc["agreement"]["prompts"] == 2
    # reuse: no forward computes more than the block's newly final tokens and its positions
    assert all(f["T"] < 2 * B for t in doc["traces"] for f in t["forwards"][1:])
    out = tmp_path / "experts.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "experts", "--prompts", "2", "--positions", "1", "4",
                        "--threads", "1", "--json", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    n, k = res["n_expert"], res["n_expert_used"]
    one, four = res["by_positions"]["1"], res["by_positions"]["4"]
    assert one["trained"] == k == one["random"]  # one token: exactly its k experts
    assert k <= four["trained"] <= min(n, 4 * k) and four["random"] == pytest.approx(n * (1 - (1 - k / n) ** 4))


def test_compare_prices_every_replay_at_the_same_times(tmp_path):
    def replay(name, by_T, generated, ar_seconds):
        doc = {"forwards_by_positions": {str(T): {"count": n, "seconds": s} for T, (n, s) in by_T.items()},
               "diffusion": {"generated": generated, "tokens_per_forward": generated / sum(n for n, _ in by_T.values())},
               "ar": {"seconds": ar_seconds, "generated": generated}, "speedup_vs_ar": 0.5}
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
        return tmp_path / f"{name}.json"

    a = replay("a", {2: (10, 0.2)}, 10, 1.0)  # ten 2-position forwards at 0.2 s
    b = replay("b", {2: (4, 0.4), 8: (2, 1.0)}, 10, 3.0)  # the same positions ran slower in b
    r = subprocess.run([sys.executable, str(SCRIPT), "compare", str(a), str(b)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:]}
    # pooled 2-position median 0.2 s (10 at 0.2, 4 at 0.4); AR 0.2 s per token (median of 0.1 and 0.3)
    assert rows["a"][-1] == "1.00x"  # 10 tokens in 10 x 0.2 s, against AR's 10 x 0.2 s
    assert rows["b"][-1] == f"{10 / (4 * 0.2 + 2 * 1.0) * 0.2:.2f}x"


def bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_diffusion", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_synthetic_exact_trace_is_what_the_decoder_does():
    """synth's exact trace for a model that finalizes k tokens per step equals the forwards clover_cpu's
    own decoder logs when it is made to commit k per step (policy fixed, block / k steps per block)."""
    import clover_cpu

    bd = bench_module()
    m = clover_cpu.load(str(Path(clover_cpu.__file__).parent / "models" / "clover-small.gguf"), threads=1)
    B, k, prompt = 8, 2, 16  # a prompt of whole blocks: the first block has all B positions to decode
    ids = (np.arange(prompt) * 7 % 500 + 3).tolist()
    rec = bd.Recorder(m)
    m.generate_text(ids, max_new_tokens=3 * B, block_length=B, policy="fixed", max_steps=B // k,
                    stop_at_eos=False)
    logged = [(c["T"], c["commit"], c["rows"]) for c in rec.calls]
    rec.close()
    synth = bd.synthetic_trace(B, prompt, 3 * B, k)
    assert logged == [(f["T"], f["commit"], f["rows"]) for f in synth["forwards"]]
    assert len(synth["forwards"]) == 1 + 3 * B // k  # the prefill, then k tokens per forward


def test_synthetic_auto_trace_follows_the_cost_curve():
    from clover_cpu.costs import CostCurve
    from clover_cpu.decode import AutoWindow

    bd = bench_module()
    B, new = 32, 96
    # extra positions cost a fortune: one candidate per forward (its final token goes in with the next)
    steep = CostCurve({1: 1.0, 2: 50.0, 64: 5000.0}, {1: 0.0, 32: 0.0})
    t = bd.synthetic_trace(B, 64, new, 9, AutoWindow(steep, B))
    fw = t["forwards"][1:]
    assert t["forwards"][0] == {"T": 64, "commit": 64, "n": 0, "rows": 0}
    assert all(f["rows"] == 1 for f in fw) and len(fw) == new
    assert all(f["T"] == f["commit"] + 1 for f in fw) and sum(f["commit"] for f in fw) == new - 1
    # positions nearly free: the window widens and the forwards commit about 9 tokens each
    flat = CostCurve({1: 1.0, 64: 1.1}, {1: 0.0, 32: 0.0})
    t = bd.synthetic_trace(B, 64, new, 9, AutoWindow(flat, B))
    fw = t["forwards"][1:]
    assert all(1 <= f["rows"] <= B and f["T"] < 2 * B for f in fw)
    assert max(f["rows"] for f in fw) == B and new / len(fw) > 7  # 96 tokens in 12 forwards
    # every forward starts where the caches end: its commit is the final tokens not yet in them
    assert [f["n"] for f in fw] == list(np.cumsum([64] + [f["commit"] for f in fw[:-1]]))
