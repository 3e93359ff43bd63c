"""Speed of the low-bit types against llama.cpp b11434 on the same files and threads.

For each GGUF (the bench twin requantized by llama-quantize: Q3_K_M, IQ4_XS, an IQ3_XXS mix made with an
importance matrix, ...), in alternating rounds: llama.cpp's own `llama-bench` (pp512 and tg32, -r 1) and
clover-cpu's bench worker (the same tests as `clover-cpu bench`: pp512 forwards 512 tokens into a fresh
context; tg generates 32 tokens after a 16-token prompt), each in its own process, one after the other. Then
tg against the read-bandwidth roofline (the weight bytes one token reads over the machine's measured read
bandwidth). Prints a table per file, writes JSON.

    python bench/bench_lowbit.py --llama-bin DIR FILE.gguf [FILE.gguf ...] [--rounds 3] [--json out.json]
        [--file-layout]   (clover-cpu also with --repack off, each round: the repacked layouts' before/after)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


def llama_bench(binary: Path, model: Path, threads: int) -> dict:
    r = subprocess.run([str(binary), "-m", str(model), "-p", "512", "-n", "32", "-t", str(threads), "-r", "1",
                        "-o", "json"], capture_output=True, text=True, timeout=3600)
    if r.returncode:
        raise RuntimeError(f"llama-bench failed on {model}: {r.stderr[-2000:]}")
    out = {}
    for row in json.loads(r.stdout):
        test = f"pp{row['n_prompt']}" if row["n_prompt"] else "tg"
        out[test] = row["avg_ts"]
    return out


def clover_bench(model: Path, threads: int, repack: str = "auto") -> dict:
    r = subprocess.run([sys.executable, "-m", "clover_cpu.bench_worker", "--engine", "clover", str(model), "--threads",
                        str(threads), "--tests", "pp512,tg", "--reps", "1", "--tg-tokens", "32",
                        "--repack", repack],
                       capture_output=True, text=True, timeout=3600, cwd="/")
    if r.returncode:
        raise RuntimeError(f"clover-cpu's bench worker failed on {model}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["tokens_per_second"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--llama-bin", type=Path, required=True, help="folder with llama.cpp's llama-bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--file-layout", action="store_true",
                    help="also time clover-cpu with --repack off (the file's layout) in every round: a before/after")
    a = ap.parse_args(argv)
    from clover_cpu.commands.bench import read_bandwidth_gbps, weight_bytes_per_token
    from clover_cpu.gguf_file import GGUFFile

    results = {"machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d"),
               "threads": a.threads, "files": {}}
    for f in a.files:
        with GGUFFile(f) as g:
            kinds = {}
            for ti in g.tensors.values():
                kinds[ti.ggml_type] = kinds.get(ti.ggml_type, 0) + ti.nbytes
        per_token = weight_bytes_per_token(f)
        runs = {"llama.cpp": [], "clover-cpu": []}
        if a.file_layout:
            runs["clover-cpu, file layout"] = []
        bandwidth = []
        for _ in range(a.rounds):
            bandwidth.append(read_bandwidth_gbps(a.threads))
            runs["llama.cpp"].append(llama_bench(a.llama_bin / "llama-bench", f, a.threads))
            runs["clover-cpu"].append(clover_bench(f, a.threads))
            if a.file_layout:
                runs["clover-cpu, file layout"].append(clover_bench(f, a.threads, "off"))
        bandwidth.append(read_bandwidth_gbps(a.threads))
        bw = statistics.median(bandwidth)
        med = {e: {t: statistics.median(r[t] for r in rs) for t in ("pp512", "tg")} for e, rs in runs.items()}
        # ratios paired round by round, then their median
        ratios = {e: {t: statistics.median(c[t] / l[t] for c, l in zip(rs, runs["llama.cpp"]))
                      for t in ("pp512", "tg")} for e, rs in runs.items() if e != "llama.cpp"}
        ratio = ratios["clover-cpu"]
        roof = bw * 1e9 / per_token
        entry = {"size_gb": f.stat().st_size / 1e9, "bytes_by_type": kinds, "weight_bytes_per_token": per_token,
                 "read_bandwidth_gbps": bandwidth, "tg_roofline_tps": roof, "runs": runs, "median": med,
                 "ratio": ratio, "ratios": ratios, "tg_roofline_share": {e: med[e]["tg"] / roof for e in med}}
        results["files"][f.name] = entry
        mix = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:4])
        print(f"\n{f.name} ({entry['size_gb']:.2f} GB: {mix} GB; {per_token / 1e9:.2f} GB read per token, "
              f"read bandwidth {bw:.1f} GB/s, tg roofline {roof:.1f} t/s)")
        print(f"  {'test':6s} " + " ".join(f"{e:>{max(10, len(e))}s}" for e in runs) + "  ratios to llama.cpp")
        for t in ("pp512", "tg"):
            print(f"  {t:6s} " + " ".join(f"{med[e][t]:{max(10, len(e))}.2f}" for e in runs) + "  " +
                  ", ".join(f"{ratios[e][t]:.2f}x" for e in ratios))
        print("  tg at the roofline: " + ", ".join(f"{e} {entry['tg_roofline_share'][e]:.2f}" for e in runs))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
