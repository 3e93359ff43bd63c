"""Conversion throughput and peak memory: clover-cpu convert (bf16 checkpoint -> Q4_K_M GGUF) against
llama.cpp's quantizer (F16 GGUF -> Q4_K_M) on the same weights, with the reconstruction error of both.

    python bench/bench_convert.py                      # bench preset (~13 GB bf16), needs ~35 GB of disk
    python bench/bench_convert.py --preset small       # a quick check of the script
    python bench/bench_convert.py --llama-python .venv-peers/bin/python

llama.cpp comes from llama-cpp-python (`bash bench/setup_peers.sh` builds it into .venv-peers); its
`llama_model_quantize` is the library function behind `llama-quantize`. Both quantizers run with the
same thread count. Each step runs in its own process so that its peak RSS is measured alone.
Writes a table to stdout and JSON to bench/results/convert.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

QUANTIZE_SNIPPET = r"""
import sys, time, ctypes, llama_cpp
src, dst, nthread = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = llama_cpp.llama_model_quantize_default_params()
p.nthread = nthread
p.ftype = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
t = time.perf_counter()
rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
print(time.perf_counter() - t, rc)
"""


def run_measured(cmd: list[str], env=None) -> tuple[float, float, str]:
    """(seconds, peak RSS in GB of the child, stdout) of a command run in its own process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the max over all children so far: run the biggest last or read /proc
    return dt, max(peak, before) / 1e6, r.stdout


def peak_rss_of(cmd: list[str]) -> tuple[float, float, str]:
    """Run cmd under /usr/bin/time -v if present (exact per-process peak), else via rusage."""
    if Path("/usr/bin/time").exists():
        t = time.perf_counter()
        r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
        dt = time.perf_counter() - t
        if r.returncode != 0:
            raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
        kb = next(int(line.split()[-1]) for line in r.stderr.splitlines() if "Maximum resident set size" in line)
        return dt, kb / 1e6, r.stdout
    return run_measured(cmd)


def rmse_by_type(gguf_path: Path, src: Path, names: list[str]) -> dict[str, list[float]]:
    """Relative RMSE of selected tensors of a GGUF against the checkpoint, grouped by tensor type."""
    from gguf import GGUFReader
    from gguf import quants as gq

    from clover_cpu.convert.config import load_config
    from clover_cpu.convert.hf import Planner, tensor_chunks
    from clover_cpu.convert.safetensors_lazy import open_checkpoint

    c = load_config(src)
    plans = {p.name: p for p in Planner(c, open_checkpoint(src)).plan()}
    reader = GGUFReader(gguf_path)
    out: dict[str, list[float]] = {}
    for t in reader.tensors:
        if t.name not in names:
            continue
        p = plans[t.name]
        ref = np.concatenate([x.astype(np.float32) if d != "BF16" else (x.astype(np.uint32) << 16).view(np.float32)
                              for x, d in tensor_chunks(p)]).reshape(-1)
        got = gq.dequantize(t.data, t.tensor_type).reshape(-1)
        err = float(np.sqrt(np.mean((got.astype(np.float64) - ref) ** 2)) / np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
        out.setdefault(t.tensor_type.name, []).append(err)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="bench", help="synthetic checkpoint preset (bench: Clover-35B shape, 32 experts)")
    ap.add_argument("--workdir", default=None, help="where to put the checkpoint and outputs (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint for the next run")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--llama-python", default=str(HERE.parent / ".venv-peers" / "bin" / "python"),
                    help="a Python with llama_cpp installed (default: .venv-peers)")
    ap.add_argument("--out", default=str(HERE / "results" / "convert.json"))
    a = ap.parse_args()

    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench_convert_"))
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / f"ckpt-{a.preset}"
    py = sys.executable
    if not (ckpt / "config.json").exists():
        print(f"writing the {a.preset} checkpoint to {ckpt} ...", flush=True)
        t = time.perf_counter()
        subprocess.run([py, "-m", "clover_cpu.convert.synthetic", str(ckpt), "--preset", a.preset,
                        "--model-type", "qwen3_5_moe", "--shards", "4"], check=True)
        print(f"  {time.perf_counter() - t:.0f} s", flush=True)
    src_bytes = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))

    ours = work / "ours-q4_k_m.gguf"
    dt_ours, rss_ours, _ = peak_rss_of([py, "-m", "clover_cpu", "convert", str(ckpt), "-o", str(ours),
                                        "--type", "q4_k_m", "--force", "--quiet", "--threads", str(a.threads)])
    results = {
        "preset": a.preset, "source_gb": src_bytes / 1e9, "threads": a.threads,
        "clover": {"seconds": dt_ours, "source_mb_per_s": src_bytes / dt_ours / 1e6, "peak_rss_gb": rss_ours,
                   "output_gb": ours.stat().st_size / 1e9},
    }
    f16 = work / "f16.gguf"
    llama = work / "llama-q4_k_m.gguf"
    have_llama = Path(a.llama_python).exists() and subprocess.run(
        [a.llama_python, "-c", "import llama_cpp"], capture_output=True).returncode == 0
    if have_llama:
        dt_f16, _, _ = peak_rss_of([py, "-m", "clover_cpu", "convert", str(ckpt), "-o", str(f16), "--type", "f16",
                                    "--force", "--quiet", "--threads", str(a.threads)])
        dt_q, rss_q, stdout = peak_rss_of([a.llama_python, "-c", QUANTIZE_SNIPPET, str(f16), str(llama), str(a.threads)])
        inner, rc = stdout.split()
        if int(rc) != 0:
            raise SystemExit(f"llama_model_quantize returned {rc}")
        results["llama_quantize"] = {"seconds": float(inner), "process_seconds": dt_q, "peak_rss_gb": rss_q,
                                     "f16_gb": f16.stat().st_size / 1e9, "output_gb": llama.stat().st_size / 1e9,
                                     "f16_conversion_seconds": dt_f16}
        results["speedup"] = float(inner) / dt_ours
    # reconstruction error on the same tensors of both files (a sample of each kind)
    from gguf import GGUFReader

    ours_types = {t.name: t.tensor_type.name for t in GGUFReader(ours).tensors}
    sample = [n for n in ours_types if n.startswith(("blk.0.", "blk.1.", "blk.3.", "output.", "token_embd"))]
    results["rmse"] = {"clover": rmse_by_type(ours, ckpt, sample)}
    if have_llama:
        results["rmse"]["llama"] = rmse_by_type(llama, ckpt, sample)

    print()
    print(f"{'tool':<28}{'seconds':>10}{'source MB/s':>14}{'peak RSS GB':>14}{'output GB':>12}")
    c = results["clover"]
    print(f"{'clover-cpu convert q4_k_m':<28}{c['seconds']:>10.1f}{c['source_mb_per_s']:>14.1f}{c['peak_rss_gb']:>14.2f}{c['output_gb']:>12.2f}")
    if have_llama:
        q = results["llama_quantize"]
        print(f"{'llama quantize f16->q4_k_m':<28}{q['seconds']:>10.1f}{q['f16_gb'] * 1e3 / q['seconds']:>14.1f}"
              f"{q['peak_rss_gb']:>14.2f}{q['output_gb']:>12.2f}")
        print(f"speed ratio (llama seconds / ours): {results['speedup']:.2f}x  (target >= 2x)")
    else:
        print(f"llama.cpp not found at {a.llama_python}: run bash bench/setup_peers.sh for the comparison")
    print("relative RMSE by tensor type (mean over sampled tensors):")
    for tool, d in results["rmse"].items():
        print(f"  {tool:<8}" + "  ".join(f"{k}: {np.mean(v):.5f} ({len(v)})" for k, v in sorted(d.items())))
    print(f"peak RSS target <= 2.5 GB: {'PASS' if c['peak_rss_gb'] <= 2.5 else 'FAIL'} ({c['peak_rss_gb']:.2f} GB)")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {a.out}")
    for p in (ours, f16, llama):
        p.unlink(missing_ok=True)
    if not a.keep and not a.workdir:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
