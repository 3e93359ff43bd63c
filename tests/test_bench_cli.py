"""`clover-cpu bench`: builds the random-weight model, measures clover-cpu (llama.cpp where installed: see
bench/setup_peers.sh), prints the table and writes JSON; bad options are refused in one line."""

import json
import subprocess
import sys


def bench(*args):
    return subprocess.run([sys.executable, "-m", "clover_cpu", "bench", *map(str, args)], capture_output=True, text=True)


def test_bench_tiny_clover_only(tmp_path):
    out = tmp_path / "b.json"
    r = bench("--preset", "tiny", "--workdir", tmp_path, "--no-llama", "--tests", "pp1,pp8,tg", "--reps", "1",
              "--tg-tokens", "4", "--threads", "1", "--json", out)
    assert r.returncode == 0, r.stderr
    assert "pp8" in r.stdout and "peak RSS" in r.stdout
    d = json.loads(out.read_text())
    tps = d["results"]["clover"]["tokens_per_second"]
    assert set(tps) == {"pp1", "pp8", "tg"} and all(v > 0 for v in tps.values())
    assert d["results"]["clover"]["peak_rss_gb"] > 0 and d["threads"] == 1
    assert (tmp_path / "tiny-qwen35moe-q4_k_m.gguf").exists()  # built once, reused by the next run
    roof = d["tg_roofline"]
    assert "tg roofline" in r.stdout and len(roof["read_bandwidth_gbps"]) == 2 and min(roof["read_bandwidth_gbps"]) > 0
    assert roof["roofline_gbps"] in roof["read_bandwidth_gbps"]
    assert roof["tg_roofline_tps"] > 0 and roof["clover_tg_share"] == tps["tg"] / roof["tg_roofline_tps"]


def test_bench_rounds_keep_the_median(tmp_path):
    out = tmp_path / "b.json"
    r = bench("--preset", "tiny", "--workdir", tmp_path, "--no-llama", "--tests", "pp4,tg", "--reps", "1",
              "--tg-tokens", "2", "--threads", "1", "--rounds", "3", "--json", out)
    assert r.returncode == 0, r.stderr
    assert "round 3 of 3" in r.stderr
    c = json.loads(out.read_text())["results"]["clover"]
    assert len(c["rounds"]) == 3
    for t in ("pp4", "tg"):
        assert c["tokens_per_second"][t] == sorted(x["tokens_per_second"][t] for x in c["rounds"])[1]
    assert c["peak_rss_gb"] == max(x["peak_rss_gb"] for x in c["rounds"])
    assert len(json.loads(out.read_text())["tg_roofline"]["read_bandwidth_gbps"]) == 4  # one per run, one at the end


def test_bench_interleave_runs_each_test_per_round(tmp_path):
    # --interleave: the engines stay loaded (bench_worker --serve) and each round runs every test once
    out = tmp_path / "b.json"
    r = bench("--preset", "tiny", "--workdir", tmp_path, "--no-llama", "--tests", "pp4,pp2,tg", "--reps", "1",
              "--tg-tokens", "2", "--threads", "1", "--rounds", "3", "--interleave", "--json", out)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    c = d["results"]["clover"]
    assert d["interleaved"] and len(c["rounds"]) == 3 and c["peak_rss_gb"] > 0 and c["load_seconds"] > 0
    # one process for all rounds (one load), first in every round (the only engine)
    assert len({x["load_seconds"] for x in c["rounds"]}) == 1 and d["first_by_round"] == ["clover"] * 3
    for t in ("pp4", "pp2", "tg"):
        assert c["tokens_per_second"][t] == sorted(x["tokens_per_second"][t] for x in c["rounds"])[1] > 0
    # in the order asked, once per round
    ran = [line.split("]")[1].split(":")[0].strip() for line in r.stderr.splitlines() if line.startswith("[CloverEngine]")]
    assert ran == ["pp4", "pp2", "tg"] * 3
    assert len(d["tg_roofline"]["read_bandwidth_gbps"]) == 4  # before each round's tg, one at the end


def test_bench_worker_serve_protocol(tmp_path):
    # one JSON line per request after a "ready" line; an unknown test ends the worker with an error
    from clover_cpu.commands.bench import build_model

    path = build_model(tmp_path, "tiny", lambda s: None)
    p = subprocess.run([sys.executable, "-m", "clover_cpu.bench_worker", "--engine", "clover", str(path), "--threads",
                        "1", "--serve"], input='{"test": "pp2"}\n{"test": "xx"}\n', capture_output=True, text=True)
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert lines[0]["ready"] == "clover" and lines[1]["test"] == "pp2" and lines[1]["tokens_per_second"] > 0
    assert p.returncode != 0 and "unknown test" in p.stderr
    # a clean end of input: the final record, every test's figures in a list
    p = subprocess.run([sys.executable, "-m", "clover_cpu.bench_worker", "--engine", "clover", str(path), "--threads",
                        "1", "--serve"], input='{"test": "pp2"}\n{"test": "pp2"}\n', capture_output=True, text=True)
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert p.returncode == 0 and len(lines) == 4 and lines[3]["peak_rss_gb"] > 0
    assert lines[3]["tokens_per_second"]["pp2"] == [lines[1]["tokens_per_second"], lines[2]["tokens_per_second"]]


def test_bench_interleave_engine_that_fails_gives_one_line(tmp_path):
    # an "llama.cpp" Python that imports llama_cpp but answers junk: a one-line error, no worker left behind
    fake = tmp_path / "fakepy"
    fake.write_text('#!/bin/sh\nif [ "$1" = "-c" ]; then exit 0; fi\necho "not a record"\nexit 3\n')
    fake.chmod(0o755)
    r = bench("--preset", "tiny", "--workdir", tmp_path, "--llama-python", fake, "--tests", "pp2", "--reps", "1",
              "--threads", "1", "--interleave")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "the llama benchmark replied 'not a record', not its record" in r.stderr.strip().splitlines()[-1]
    fake.write_text('#!/bin/sh\nif [ "$1" = "-c" ]; then exit 0; fi\nexit 3\n')
    r = bench("--preset", "tiny", "--workdir", tmp_path, "--llama-python", fake, "--tests", "pp2", "--reps", "1",
              "--threads", "1", "--interleave")
    assert r.returncode == 2 and "the llama benchmark failed (exit 3)" in r.stderr and "Traceback" not in r.stderr


def test_ratios_paired_or_of_medians():
    from clover_cpu.commands.bench import combine_rounds, ratios_of, table

    def rec(tps, rss):
        return {"tokens_per_second": tps, "peak_rss_gb": rss, "load_seconds": 1.0}

    # both engines slow down together, round by round: paired ratios 2, 2, 2
    runs = {"clover": [rec({"pp32": 60.0}, 4.0), rec({"pp32": 40.0}, 4.0), rec({"pp32": 30.0}, 4.1)],
            "llama": [rec({"pp32": 30.0}, 6.0), rec({"pp32": 20.0}, 6.0), rec({"pp32": 15.0}, 6.0)]}
    results = {k: combine_rounds(v) for k, v in runs.items()}
    paired, rounds = ratios_of(runs, results, ["pp32"], paired=True)
    assert rounds == [{"pp32": 2.0}] * 3 and paired["pp32"] == 2.0 and paired["peak_rss"] == 4.1 / 6.0
    medians, _ = ratios_of(runs, results, ["pp32"], paired=False)
    assert medians["pp32"] == 40.0 / 20.0
    runs["llama"][1] = rec({"pp32": 10.0}, 6.0)  # one disturbed round: 2, 4, 2
    results = {k: combine_rounds(v) for k, v in runs.items()}
    assert ratios_of(runs, results, ["pp32"], paired=True)[0]["pp32"] == 2.0
    assert ratios_of(runs, results, ["pp32"], paired=False)[0]["pp32"] == 40.0 / 15.0
    assert "   2.00x" in table(results, ["pp32"], {"pp32": 2.0})
    assert ratios_of({"clover": runs["clover"], "llama": []}, {"clover": results["clover"]}, ["pp32"], True) == ({}, [])


def test_weight_bytes_per_token_counts_used_experts_only(tmp_path):
    # against the gguf package's own reader: all tensors but the embedding, routed experts at k / E
    import gguf

    from clover_cpu.commands.bench import build_model, weight_bytes_per_token

    path = build_model(tmp_path, "tiny", lambda s: None)
    r = gguf.GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    E = int(r.fields[f"{arch}.expert_count"].parts[-1][0])
    k = int(r.fields[f"{arch}.expert_used_count"].parts[-1][0])
    want = sum(t.n_bytes * (k / E if "_exps." in t.name else 1) for t in r.tensors if t.name != "token_embd.weight")
    assert 0 < k < E and weight_bytes_per_token(path) == int(want)


def test_bench_refuses_bad_options(tmp_path):
    for bad in (["--tests", "pp0"], ["--tests", "pp4096"], ["--tests", "xx"], ["--reps", "0"], ["--threads", "0"],
                ["--rounds", "0"]):
        r = bench("--no-llama", "--workdir", tmp_path, *bad)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, bad
    r = bench("--no-llama", "-m", tmp_path / "missing.gguf")
    assert r.returncode == 2 and "no such file" in r.stderr
    from clover_cpu.commands.run import shipped_model

    r = bench("--no-llama", "-m", shipped_model())
    assert r.returncode == 2 and "needs a qwen35moe file" in r.stderr and len(r.stderr.strip().splitlines()) == 1
