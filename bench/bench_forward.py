"""Forward-pass speed of the runtime on a random-weight model of the Clover-35B shape with 32 experts
(same work per token as the real model, fits this machine): T-token forwards over a cached context,
prefill speed, peak RSS, and where the time goes.

    python bench/bench_forward.py --model bench.gguf             # an existing file
    python bench/bench_forward.py --workdir /data/bench           # builds the checkpoint and file there

Writes a table to stdout and JSON to bench/results/forward.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from clover_cpu.costs import median_time

HERE = Path(__file__).resolve().parent


def build_model(workdir: Path, fmt: str) -> Path:
    ckpt = workdir / "ckpt-bench"
    out = workdir / f"bench-{fmt}.gguf"
    if out.exists():
        return out
    if not (ckpt / "config.json").exists():
        subprocess.run([sys.executable, "-m", "clover_cpu.convert.synthetic", str(ckpt), "--preset", "bench",
                        "--model-type", "clover"], check=True)
    subprocess.run([sys.executable, "-m", "clover_cpu", "convert", str(ckpt), "-o", str(out), "--type", fmt, "--quiet"],
                   check=True)
    return out


class Profile:
    """Wall time per category, by wrapping the kernel entry points the model calls."""

    def __init__(self, model):
        import clover_cpu.kernels as K
        import clover_cpu.ops as O

        self.t = defaultdict(float)
        self.flops = defaultdict(float)
        self.model = model
        out_data = model.output.data
        self.patches = []

        def wrap(mod, name, category):
            orig = getattr(mod, name)

            def f(*a, **kw):
                t0 = time.perf_counter()
                r = orig(*a, **kw)
                cat = category(a) if callable(category) else category
                self.t[cat] += time.perf_counter() - t0
                if name == "matmul":
                    x, w = a[0], a[1]
                    rows = w.shape[0]
                    k = x.shape[1]
                    self.flops[cat] += 2.0 * x.shape[0] * rows * k
                if name == "matmul_many":
                    x = a[0]
                    self.flops[cat] += sum(2.0 * x.shape[0] * w.shape[0] * x.shape[1] for w, _ in a[1])
                if name == "moe_block":
                    x, router, top_k, gate, sh = a[0], a[1][0], a[2], a[3], a[8][0]
                    M, H = x.shape
                    self.flops[cat] += 2.0 * M * (top_k * 3 * gate.shape[1] + router.shape[0] + 3 * sh.shape[0] + 1) * H
                if name == "moe":
                    x, ids, g = a[0], a[1], a[3]
                    self.flops[cat] += 2.0 * ids.size * 3 * g.shape[1] * x.shape[1]
                return r

            self.patches.append((mod, name, orig))
            setattr(mod, name, f)

        wrap(K, "matmul", lambda a: "lm_head" if a[1] is out_data else "projections")
        wrap(K, "matmul_many", "projections")
        wrap(K, "moe", "experts")
        wrap(K, "moe_block", "experts")  # (with the router and the shared expert)
        wrap(O, "attention", "attention")
        wrap(O, "gated_delta_rule", "gdn")
        wrap(O, "conv1d_silu", "gdn")
        for name in ("rms_norm", "gated_rms_norm", "rope_neox", "router_topk", "swiglu", "gdn_gates"):
            wrap(O, name, "small ops")

    def close(self):
        for mod, name, orig in self.patches:
            setattr(mod, name, orig)


def timed(fn, reps=3):
    fn()  # warm
    return median_time(fn, reps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF file (default: build the bench model in --workdir)")
    ap.add_argument("--workdir", default="/tmp/clover-bench")
    ap.add_argument("--type", default="q4_k_m", help="format when building the model")
    ap.add_argument("--context", type=int, default=1024, help="cached context before the timed forwards")
    ap.add_argument("--tokens", default="1,4,8,16,32")
    ap.add_argument("--prefill", default="512,4096")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "forward.json"))
    a = ap.parse_args()

    import clover_cpu
    from clover_cpu import kernels

    path = Path(a.model) if a.model else build_model(Path(a.workdir), a.type)
    t0 = time.perf_counter()
    m = clover_cpu.load(path, threads=a.threads or None, ctx_len=max(8192, a.context + 64))
    load_s = time.perf_counter() - t0
    rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    info = clover_cpu.system_info()
    c = m.config
    print(f"model {path} ({path.stat().st_size / 1e9:.2f} GB), {c.arch}, {c.n_layer} layers, {c.n_expert} experts; "
          f"{info['isa']} x {info['threads']} threads; load {load_s:.2f} s, RSS after load {rss_load:.2f} GB")
    rng = np.random.default_rng(0)
    block = c.block_length if c.is_diffusion else None
    results = {"model": str(path), "isa": info["isa"], "threads": info["threads"], "load_seconds": load_s,
               "rss_after_load_gb": rss_load, "forward": {}, "prefill": {}}

    cache = m.new_cache()
    t = time.perf_counter()
    for s in range(0, a.context, 256):
        m.run(cache, rng.integers(0, c.vocab_size, min(256, a.context - s)), commit=True, block=block)
    print(f"cached context of {a.context} tokens built in {time.perf_counter() - t:.1f} s")

    # the kernels' GEMM rate on a representative shape, for the arithmetic bound
    print(f"\n{'T':>4} {'ms/forward':>11} {'tok/s':>8} {'GFLOP':>8} {'GFLOP/s':>8} {'bound x':>8}  share of time "
          "(of the operator-by-operator path)")
    for T in [int(x) for x in a.tokens.split(",")]:
        ids = rng.integers(0, c.vocab_size, T)
        # the speed: the model as it runs (token mixers and feed-forwards fused, one C++ call each)
        dt = timed(lambda: m.run(cache, ids, commit=False, block=block))
        # the shares: the operator-by-operator path (Model.fused = False, the same results), whose calls
        # the profile can see one by one
        prof = Profile(m)
        m.fused = False
        runs = []  # (seconds, kernel seconds by category, flops) of each timed run, after a warm-up run
        try:
            for rep in range(4):
                prof.t.clear()
                prof.flops.clear()
                t = time.perf_counter()
                m.run(cache, ids, commit=False, block=block)
                if rep:
                    runs.append((time.perf_counter() - t, dict(prof.t), sum(prof.flops.values())))
        finally:
            prof.close()
            m.fused = True
        # the median run, its shares from its own kernel times (python = what no kernel accounts for)
        dt_ops, kt, flops = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        shares = {k: v / dt_ops for k, v in kt.items()}
        shares["python"] = max(0.0, 1 - sum(shares.values()))
        w = m.layers[0 if not c.recurrent[0] else next(i for i in range(c.n_layer) if c.recurrent[i])]
        wq = w["qkv"] if "qkv" in w else w["q"]
        x = rng.standard_normal((T, c.n_embd)).astype(np.float32)
        g_dt = timed(lambda: kernels.matmul(x, wq.data, wq.fmt), reps=7)
        rate = 2.0 * T * wq.data.shape[0] * c.n_embd / g_dt
        bound = flops / rate
        results["forward"][T] = {"ms": dt * 1e3, "ms_operator_path": dt_ops * 1e3, "tokens_per_second": T / dt,
                                 "gflop": flops / 1e9,
                                 "gflop_per_s": flops / dt / 1e9, "kernel_gemm_gflop_per_s": rate / 1e9,
                                 "vs_arithmetic_bound": dt / bound, "shares": shares,
                                 "experts_touched_last_layer": getattr(m, "last_experts_used", None)}
        share_s = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]))
        print(f"{T:>4} {dt * 1e3:>11.1f} {T / dt:>8.2f} {flops / 1e9:>8.1f} {flops / dt / 1e9:>8.1f} "
              f"{dt / bound:>8.2f}  {share_s}")

    print(f"\n{'prefill':>8} {'seconds':>9} {'tok/s':>8}")
    for P in [int(x) for x in a.prefill.split(",") if x]:
        ids = rng.integers(0, c.vocab_size, P)
        cache2 = m.new_cache()
        t = time.perf_counter()
        for s in range(0, P, 512):
            m.run(cache2, ids[s : s + 512], commit=True, block=block, logits=False)
        dt = time.perf_counter() - t
        results["prefill"][P] = {"seconds": dt, "tokens_per_second": P / dt}
        print(f"{P:>8} {dt:>9.1f} {P / dt:>8.1f}")
        del cache2
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    results["peak_rss_gb"] = peak
    print(f"\npeak RSS {peak:.2f} GB (file {path.stat().st_size / 1e9:.2f} GB)")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
