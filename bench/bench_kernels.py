#!/usr/bin/env python3
"""Quantized kernels on the Clover shapes, against the machine's read bandwidth and numpy float32 matmul.

For each shape, format, ISA and token count M: y = x @ W^T with kernels.matmul, checked first against a
float64 reference on a slice, then timed after a warm-up. Small matrices are cycled through a stack of
distinct copies (>= 4x the last-level cache) so GEMV reads weights from memory, not from cache. Also
times one kernels.moe call (32 tokens, top-8 of 256 experts) against the same work as separate matmuls,
and prints the three targets of the kernel issue as PASS/FAIL lines.

    python bench/bench_kernels.py                 # full run (about 15 min on 2 cores)
    python bench/bench_kernels.py --quick         # q4_k, q4_0, q8_0; M in {1, 32}; no LM head (< 2 min)
    python bench/bench_kernels.py --formats q4_k --isas avx2 --m 1,32 --skip-lm-head --out /tmp/k.json

GFLOP/s = 2*M*N*K / time (an integer multiply-add counts as 2 ops); GB/s = quantized weight bytes read
per call / time. Results go to bench/results/kernels.json (git-ignored) unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

FORMATS = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"]
TOKENS = [1, 4, 8, 32, 128]
QUICK_FORMATS = ["q4_k", "q4_0", "q8_0"]
QUICK_TOKENS = [1, 32]
REL_TOL = 5e-2  # max|got - want| / max|want| against the float64 reference on dequantized weights

# Targets of the kernel issue.
GEMV_BW_FRACTION = 0.60  # (a) M=1 over a weight set >= 4x LLC: quantized bytes/s >= 60% of read bandwidth
GEMV_FORMATS = ["q4_k", "q4_0", "q8_0", "q6_k"]
GEMM_VS_NUMPY = 1.5  # (b) M=32 GFLOP/s >= 1.5x numpy float32 on the same shape
GEMM_FORMATS = ["q4_k", "q4_0"]
GEMM_SHAPES = ["expert_gate_up", "gdn_proj"]
GEMM_M = 32
MOE_VS_SEPARATE = 1.2  # (c) one moe call <= 1.2x the per-expert matmuls run separately
WSET_FACTOR = 4  # weight sets are >= this many times the last-level cache
CHUNK_WEIGHTS = 1 << 24  # big matrices are generated and quantized this many weights at a time (64 MiB f32)
DISTINCT_WEIGHTS = 1 << 25  # quantized per weight set at most; the rest are copies (see build_weights)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench" / "results" / "kernels.json"


@dataclass(frozen=True)
class Shape:
    name: str
    n: int  # weight rows = outputs
    k: int  # weight columns = inputs
    what: str

    @property
    def label(self) -> str:
        return f"{self.n}x{self.k}"


# Clover (Qwen3.5-MoE 35B-A3B): H = 2048, expert I = 512, 256 experts top-8, vocab 248320.
SHAPES = [
    Shape("expert_gate_up", 512, 2048, "expert gate/up [I, H]"),
    Shape("expert_down", 2048, 512, "expert down [H, I]"),
    Shape("gdn_proj", 8192, 2048, "GDN projection"),
    Shape("lm_head", 248320, 2048, "LM head [vocab, H]"),
]
MOE_E, MOE_H, MOE_I, MOE_TOP_K, MOE_TOKENS = 256, 2048, 512, 8, 32


def _blas_threads_from_argv() -> None:
    """BLAS reads its thread count when numpy is imported: make --threads hold for the numpy peer too."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=0)
    n = pre.parse_known_args()[0].threads
    if n > 0:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, str(n))


if __name__ == "__main__":
    _blas_threads_from_argv()

import numpy as np

clover_cpu = None  # imported by import_clover(): the extension may be mid-reinstall when we start
kernels = None


def import_clover(tries: int = 12, wait_s: float = 5.0) -> None:
    """Import the installed package, retrying while someone reinstalls it."""
    global clover_cpu, kernels
    for attempt in range(1, tries + 1):
        try:
            import clover_cpu as cc
            from clover_cpu import kernels as kk

            clover_cpu, kernels = cc, kk
            return
        except (ImportError, OSError) as e:
            for name in [m for m in sys.modules if m == "clover_cpu" or m.startswith("clover_cpu.")]:
                del sys.modules[name]
            if attempt == tries:
                raise
            print(
                f"import clover_cpu failed ({e}); retry {attempt}/{tries - 1} in {wait_s:.0f} s",
                file=sys.stderr,
            )
            time.sleep(wait_s)


# ---------------------------------------------------------------- machine


def llc_bytes() -> tuple[int, str]:
    """Size of the last-level cache and where the number came from."""
    try:
        v = os.sysconf("SC_LEVEL3_CACHE_SIZE")
        if v > 0:
            return v, "sysconf"
    except (ValueError, OSError):
        pass
    best = 0
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (d / "size").read_text().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
            best = max(best, int(size.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            pass
    if best:
        return best, "sysfs"
    return 32 << 20, "assumed"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas_info() -> str:
    try:
        import threadpoolctl

        return "; ".join(
            f"{p.get('internal_api')} {p.get('version')} ({p.get('num_threads')} threads)"
            for p in threadpoolctl.threadpool_info()
        )
    except ImportError:
        pass
    try:  # numpy >= 1.26 returns the build configuration without printing it
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')} (threads: {os.environ.get('OPENBLAS_NUM_THREADS', 'default')})"
    except (AttributeError, KeyError, TypeError, ValueError):
        return "unknown"


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        )
        return out.stdout.strip() or None
    except OSError:
        return None


def measure_read_bandwidth(n_threads: int, size_mb: int, reps: int) -> dict:
    """Read bandwidth of a float32 array far bigger than the LLC, by several methods; the best one counts.

    numpy reductions release the GIL, so Python threads over slices read on all cores at once.
    """
    a = np.ones((size_mb << 20) // 4, np.float32)  # np.ones touches every page
    parts = np.array_split(a, n_threads)
    pool = ThreadPoolExecutor(n_threads)

    def threaded(fn):
        return lambda: list(pool.map(fn, parts))

    mat = a.reshape(-1, 4096)
    ones = np.ones(4096, np.float32)
    methods = {
        f"np.max over {n_threads} thread slices": threaded(np.max),
        f"np.sum over {n_threads} thread slices": threaded(np.sum),
        f"int64 bitwise_or.reduce over {n_threads} thread slices": threaded(
            lambda s: np.bitwise_or.reduce(s.view(np.int64))
        ),
        "np.max, 1 thread": lambda: np.max(a),
        "BLAS sgemv (A @ v, BLAS threads)": lambda: mat @ ones,
    }
    out = {}
    for name, fn in methods.items():
        fn()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        out[name] = a.nbytes / statistics.median(times) / 1e9
    pool.shutdown()
    best = max(out, key=out.get)
    return {"gbps": out[best], "method": best, "array_bytes": a.nbytes, "methods_gbps": out}


# ---------------------------------------------------------------- data


class FloatSource:
    """Deterministic float32 rows: slices of a 64 MiB pool of N(0, 0.02^2) draws (a typical weight scale) at a
    different offset per index.

    A 248320 x 2048 matrix then costs a copy per chunk instead of half a billion random draws.
    """

    def __init__(self, seed: int, size: int = (1 << 24) + 1021):
        self.pool = np.random.default_rng(seed).standard_normal(size, dtype=np.float32) * np.float32(0.02)

    def rows(self, index: int, n_rows: int, k: int) -> np.ndarray:
        size = self.pool.size
        out = np.empty(n_rows * k, np.float32)
        pos = (index * 7_368_787) % size
        done = 0
        while done < out.size:
            take = min(out.size - done, size - pos)
            out[done : done + take] = self.pool[pos : pos + take]
            done += take
            pos = 0
        return out.reshape(n_rows, k)


def stack_count(mat_bytes: int, llc: int) -> int:
    """Copies of a matrix that make a weight set >= WSET_FACTOR x LLC, as a power of two."""
    need = max(1, math.ceil(WSET_FACTOR * llc / mat_bytes))
    return 1 << (need - 1).bit_length()


def build_weights(shape: Shape, fmt: str, n_mat: int, src: FloatSource, salt: int = 0) -> np.ndarray:
    """uint8 [n_mat, N, row_bytes]: n_mat different quantized matrices of one shape.

    The k-quant quantizers are slow (about 40 s for the LM head on 2 cores), so at most DISTINCT_WEIGHTS
    weights are quantized: further stack matrices are row rotations of those, and a single big matrix (the
    LM head), generated and quantized in row chunks, repeats its first chunks. The bytes read per call, and
    so the timing, are the same; the set is >= 4x LLC, so repeats are not served from cache.
    """
    n, k = shape.n, shape.k
    rb = kernels.row_bytes(fmt, k)
    out = np.empty((n_mat, n, rb), np.uint8)
    if n_mat == 1:
        chunk = max(1, CHUNK_WEIGHTS // k)
        n_distinct = max(1, DISTINCT_WEIGHTS // (chunk * k))
        for c, r0 in enumerate(range(0, n, chunk)):
            r1 = min(n, r0 + chunk)
            if c < n_distinct:
                out[0, r0:r1] = kernels.quantize(src.rows(salt + c, r1 - r0, k), fmt)
            else:
                r = c % n_distinct * chunk
                out[0, r0:r1] = out[0, r : r + r1 - r0]
        return out
    n_unique = max(1, min(n_mat, DISTINCT_WEIGHTS // (n * k)))
    unique = [kernels.quantize(src.rows(salt + i, n, k), fmt) for i in range(n_unique)]
    for i in range(n_mat):
        q, s = unique[i % n_unique], (i // n_unique) * 17 % n
        out[i, : n - s] = q[s:]
        out[i, n - s :] = q[:s]
    return out


def float_weights(shape: Shape, n_mat: int, src: FloatSource, salt: int = 0) -> np.ndarray:
    """float32 [n_mat, N, K] for the numpy peer, filled in chunks."""
    out = np.empty((n_mat, shape.n, shape.k), np.float32)
    chunk = max(1, CHUNK_WEIGHTS // shape.k)
    for i in range(n_mat):
        for c, r0 in enumerate(range(0, shape.n, chunk)):
            r1 = min(shape.n, r0 + chunk)
            out[i, r0:r1] = src.rows(salt + i * 1000 + c, r1 - r0, shape.k)
    return out


# ---------------------------------------------------------------- checking and timing


class CheckFailed(Exception):
    pass


def dequantizer():
    """Dequantize with gguf-py (an implementation nobody here wrote) when it is installed."""
    try:
        import gguf
        from gguf import quants

        def deq(q, fmt):
            return quants.dequantize(q, gguf.GGMLQuantizationType[fmt.upper()])

        return deq, f"gguf-py {getattr(gguf, '__version__', '')}".strip()
    except ImportError:
        return kernels.dequantize, "clover_cpu.kernels.dequantize"


def compare(got: np.ndarray, want: np.ndarray, what: str) -> float:
    """Relative error max|got - want| / max|want|; raise CheckFailed with the first mismatches above REL_TOL."""
    got = np.asarray(got, np.float64)
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    diff = np.abs(got - want)
    err = float(diff.max(initial=0.0)) / scale if np.isfinite(got).all() else math.inf
    if not err <= REL_TOL:
        bad = np.argwhere(~(diff <= REL_TOL * scale))[:5]
        lines = [
            f"  at {tuple(int(j) for j in i)}: got {got[tuple(i)]!r}, want {want[tuple(i)]!r}" for i in bad
        ]
        raise CheckFailed(
            f"{what}: relative error {err:.3e} > {REL_TOL:.0e} (max diff {np.nanmax(diff):.3e}, "
            f"max |want| {scale:.3e})\n" + "\n".join(lines)
        )
    return err


def check_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    """Output columns checked: the first 16, the last 16 and 32 at random."""
    idx = np.concatenate([np.arange(min(16, n)), np.arange(max(0, n - 16), n), rng.integers(0, n, 32)])
    return np.unique(idx)


@dataclass
class Timing:
    sec: float  # median seconds per call
    runs: list  # seconds per call of each timed run
    calls_per_run: int

    @property
    def best(self) -> float:
        return min(self.runs)


def measure(call, n_items: int, args, done_s: float = 0.0) -> Timing:
    """Warm up, then time runs of `calls_per_run` calls cycling over n_items inputs; median per call.

    done_s: seconds of one call just made (the check); when it is >= args.warmup it is the warm-up.
    Runs continue until there are >= args.reps of them and >= args.min_time seconds, or, for slow
    calls, 3 runs and >= args.max_time seconds.
    """
    i = 0
    per_call = done_s
    if done_s < args.warmup:
        t0 = time.perf_counter()
        while True:
            call(i % n_items)
            i += 1
            warm = time.perf_counter() - t0
            if warm >= args.warmup:
                break
        per_call = warm / i
    batch = max(1, round(args.run_time / per_call))
    runs: list[float] = []
    total = 0.0
    while not (len(runs) >= args.reps and total >= args.min_time) and not (
        len(runs) >= 3 and total >= args.max_time
    ):
        t = time.perf_counter()
        for _ in range(batch):
            call(i % n_items)
            i += 1
        dt = time.perf_counter() - t
        runs.append(dt / batch)
        total += dt
    return Timing(statistics.median(runs), runs, batch)


# ---------------------------------------------------------------- cases


def est_seconds(flops: float, rates: dict) -> float | None:
    """Time a call would take at the rate of the largest M measured so far (rates grow with M: an upper bound)."""
    if not rates:
        return None
    return flops / (rates[max(rates)] * 1e9)


def bench_numpy(shape: Shape, tokens: list, llc: int, src: FloatSource, rng, args) -> dict:
    """numpy float32 x @ W.T on the same shape, cycling through >= 4x LLC of float32 weights."""
    n_mat = stack_count(shape.n * shape.k * 4, llc)
    w = float_weights(shape, n_mat, src, salt=5000)
    results, rates = {}, {}
    for m in tokens:
        flops = 2.0 * m * shape.n * shape.k
        est = est_seconds(flops, rates)
        if est is not None and est > args.max_call:
            print(f"  numpy  f32    {shape.label:>11} M={m:<4} skipped: about {est:.1f} s per call")
            continue
        x = rng.standard_normal((m, shape.k), dtype=np.float32)
        tm = measure(lambda i, x=x: x @ w[i].T, n_mat, args)
        gflops = flops / tm.sec / 1e9
        rates[m] = gflops
        results[m] = {
            "shape": shape.name,
            "n": shape.n,
            "k": shape.k,
            "m": m,
            "n_matrices": n_mat,
            "weight_set_bytes": int(w.nbytes),
            "sec": tm.sec,
            "best_sec": tm.best,
            "runs_sec": tm.runs,
            "calls_per_run": tm.calls_per_run,
            "gflops": gflops,
            "gbps": shape.n * shape.k * 4 / tm.sec / 1e9,
        }
        print(
            f"  numpy  f32    {shape.label:>11} M={m:<4} {tm.sec * 1e6:10.1f} us {gflops:8.1f} GFLOP/s "
            f"{results[m]['gbps']:7.1f} GB/s  ({n_mat} matrices, {w.nbytes / 1e6:.0f} MB)"
        )
    return results


TABLE_HEAD = (
    f"{'isa':<5} {'format':<6} {'shape':<15} {'NxK':>11} {'M':>4} {'set MB':>7} {'mats':>5} "
    f"{'us/call':>10} {'GFLOP/s':>8} {'GB/s':>7} {'%readBW':>7} {'np GFLOP/s':>10} {'x numpy':>7} {'rel.err':>8}"
)


def table_row(c: dict) -> str:
    head = (
        f"{c['isa']:<5} {c['format']:<6} {c['shape']:<15} {c['n']}x{c['k']:<{10 - len(str(c['n']))}} "
        f"{c['m']:>4} {c['weight_set_bytes'] / 1e6:7.0f} {c['n_matrices']:5d} "
    )
    if c["status"] != "ok":
        return head + c["status"]
    npg = c.get("numpy_gflops")
    return head + (
        f"{c['sec'] * 1e6:10.1f} {c['gflops']:8.1f} {c['gbps']:7.1f} {c['frac_read_bw'] * 100:6.0f}% "
        + (f"{npg:10.1f} {c['x_numpy']:7.2f}" if npg else f"{'-':>10} {'-':>7}")
        + f" {c['rel_err']:8.1e}"
    )


def bench_shape(shape: Shape, fmts, isas, tokens, peer, bw, llc, src, rng, deq, args) -> list:
    cases = []
    for fmt in fmts:
        rb = kernels.row_bytes(fmt, shape.k)
        n_mat = 1 if shape.name == "lm_head" else stack_count(shape.n * rb, llc)
        t = time.perf_counter()
        w = None  # free the previous format's weights first
        w = build_weights(shape, fmt, n_mat, src)
        print(
            f"# {shape.name} {shape.label} {fmt}: {n_mat} matrices, {w.nbytes / 1e6:.0f} MB "
            f"({w.nbytes / llc:.1f}x LLC), built in {time.perf_counter() - t:.1f} s"
        )
        rows = check_rows(shape.n, rng)
        want_w = np.asarray(deq(np.ascontiguousarray(w[0][rows]), fmt), np.float64)  # [rows, K]
        for isa in isas:
            rates = {}
            for m in tokens:
                flops = 2.0 * m * shape.n * shape.k
                case = {
                    "isa": isa,
                    "format": fmt,
                    "shape": shape.name,
                    "n": shape.n,
                    "k": shape.k,
                    "m": m,
                    "n_matrices": n_mat,
                    "weight_set_bytes": int(w.nbytes),
                    "bytes_per_call": shape.n * rb,
                }
                est = est_seconds(flops, rates)
                if est is not None and est > args.max_call:
                    case["status"] = f"skipped: about {est:.1f} s per call > --max-call {args.max_call:g}"
                    cases.append(case)
                    print(table_row(case), flush=True)
                    continue
                x = rng.standard_normal((m, shape.k), dtype=np.float32)
                t = time.perf_counter()
                y = kernels.matmul(x, w[0], fmt, isa=isa)
                done_s = time.perf_counter() - t
                err = compare(y[:, rows], x.astype(np.float64) @ want_w.T, f"{isa} {fmt} {shape.name} M={m}")
                tm = measure(
                    lambda i, x=x, w=w, fmt=fmt, isa=isa: kernels.matmul(x, w[i], fmt, isa=isa),
                    n_mat,
                    args,
                    done_s,
                )
                gflops = flops / tm.sec / 1e9
                rates[m] = gflops
                npg = peer.get(m, {}).get("gflops")
                case.update(
                    status="ok",
                    sec=tm.sec,
                    best_sec=tm.best,
                    runs_sec=tm.runs,
                    calls_per_run=tm.calls_per_run,
                    gflops=gflops,
                    gbps=shape.n * rb / tm.sec / 1e9,
                    rel_err=err,
                    numpy_gflops=npg,
                    x_numpy=gflops / npg if npg else None,
                )
                case["frac_read_bw"] = case["gbps"] / bw
                cases.append(case)
                print(table_row(case), flush=True)
    return cases


def silu(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-v) = inf for v << 0 gives the right limit, -0
        return v / (1 + np.exp(-v))


def bench_moe(isas, src, rng, deq, args) -> list:
    """One kernels.moe call vs the same experts as three kernels.matmul calls each (GEMM time summed)."""
    gf = uf = args.moe_gate
    df = args.moe_down
    up_shape = Shape("moe_gate_up", MOE_I, MOE_H, "")
    down_shape = Shape("moe_down", MOE_H, MOE_I, "")
    t = time.perf_counter()
    gate = build_weights(up_shape, gf, MOE_E, src, salt=100)
    up = build_weights(up_shape, uf, MOE_E, src, salt=200)
    down = build_weights(down_shape, df, MOE_E, src, salt=300)
    wset = gate.nbytes + up.nbytes + down.nbytes
    print(
        f"# moe: {MOE_TOKENS} tokens, top-{MOE_TOP_K} of {MOE_E} experts, H={MOE_H}, I={MOE_I}, "
        f"gate/up {gf}, down {df}: {wset / 1e6:.0f} MB, built in {time.perf_counter() - t:.1f} s"
    )
    x = rng.standard_normal((MOE_TOKENS, MOE_H), dtype=np.float32)
    logits = rng.standard_normal((MOE_TOKENS, MOE_E))
    ids = np.ascontiguousarray(np.argsort(-logits, axis=1)[:, :MOE_TOP_K].astype(np.int32))
    top = np.take_along_axis(logits, ids, axis=1)
    wts = np.exp(top - top.max(1, keepdims=True))
    wts = np.ascontiguousarray((wts / wts.sum(1, keepdims=True)).astype(np.float32))
    used = np.unique(ids)
    groups = []  # per used expert: (e, tokens, routing weights, x rows)
    for e in used:
        tok, slot = np.nonzero(ids == e)
        groups.append((int(e), tok, wts[tok, slot], np.ascontiguousarray(x[tok])))
    flops = 2.0 * MOE_TOKENS * MOE_TOP_K * 3 * MOE_H * MOE_I
    bytes_read = len(used) * (gate[0].nbytes + up[0].nbytes + down[0].nbytes)

    # float64 reference for the first tokens, on weights dequantized independently
    n_ref = 4
    want = np.zeros((n_ref, MOE_H))
    for t_ in range(n_ref):
        for j in range(MOE_TOP_K):
            e = ids[t_, j]
            g = np.asarray(deq(gate[e], gf), np.float64) @ x[t_]
            u = np.asarray(deq(up[e], uf), np.float64) @ x[t_]
            want[t_] += wts[t_, j] * (np.asarray(deq(down[e], df), np.float64) @ (silu(g) * u))

    def separate(isa):
        """Returns (seconds in the matmul calls, seconds in all, output)."""
        out = np.zeros((MOE_TOKENS, MOE_H), np.float32)
        gemm = 0.0
        t_all = time.perf_counter()
        for e, tok, w_e, x_e in groups:
            t0 = time.perf_counter()
            g = kernels.matmul(x_e, gate[e], gf, isa=isa)
            u = kernels.matmul(x_e, up[e], uf, isa=isa)
            t1 = time.perf_counter()
            h = np.ascontiguousarray(silu(g) * u, dtype=np.float32)
            t2 = time.perf_counter()
            d = kernels.matmul(h, down[e], df, isa=isa)
            t3 = time.perf_counter()
            gemm += (t1 - t0) + (t3 - t2)
            np.add.at(out, tok, w_e[:, None] * d)
        return gemm, time.perf_counter() - t_all, out

    results = []
    for isa in isas:
        out, n_used = kernels.moe(x, ids, wts, gate, up, down, gf, uf, df, isa=isa)
        err = compare(out[:n_ref], want, f"moe {isa}")
        if n_used != len(used):
            raise CheckFailed(f"moe {isa}: reports {n_used} distinct experts, the routing uses {len(used)}")
        _, _, out_sep = separate(isa)
        err_sep = compare(out, out_sep.astype(np.float64), f"moe {isa} vs separate matmuls")
        tm = measure(
            lambda i, isa=isa: kernels.moe(x, ids, wts, gate, up, down, gf, uf, df, isa=isa), 1, args
        )
        sep, sep_all, total = [], [], 0.0
        while not (len(sep) >= args.reps and total >= args.min_time) and not (
            len(sep) >= 3 and total >= args.max_time
        ):
            g_s, a_s, _ = separate(isa)
            sep.append(g_s)
            sep_all.append(a_s)
            total += a_s
        r = {
            "isa": isa,
            "gate_format": gf,
            "up_format": uf,
            "down_format": df,
            "tokens": MOE_TOKENS,
            "top_k": MOE_TOP_K,
            "experts": MOE_E,
            "hidden": MOE_H,
            "intermediate": MOE_I,
            "distinct_experts": int(n_used),
            "weight_set_bytes": int(wset),
            "bytes_read": int(bytes_read),
            "moe_sec": tm.sec,
            "moe_runs_sec": tm.runs,
            "separate_gemm_sec": statistics.median(sep),
            "separate_gemm_runs_sec": sep,
            "separate_wall_sec": statistics.median(sep_all),
            "moe_gflops": flops / tm.sec / 1e9,
            "moe_gbps": bytes_read / tm.sec / 1e9,
            "rel_err": err,
            "rel_err_vs_separate": err_sep,
        }
        r["ratio"] = r["moe_sec"] / r["separate_gemm_sec"]
        # one token (generation): its 8 experts' GEMVs in one call, a fresh routing per call over the
        # 256-expert set, so the weights come from memory as in decoding
        routes = [np.ascontiguousarray(rng.choice(MOE_E, MOE_TOP_K, replace=False)[None].astype(np.int32))
                  for _ in range(64)]
        x1, w1 = x[:1].copy(), wts[:1].copy()
        t1 = measure(lambda i, isa=isa: kernels.moe(x1, routes[i % 64], w1, gate, up, down, gf, uf, df, isa=isa),
                     64, args)
        r["gemv_sec"] = t1.sec
        r["gemv_bytes"] = int(MOE_TOP_K * (gate[0].nbytes + up[0].nbytes + down[0].nbytes))
        r["gemv_gbps"] = r["gemv_bytes"] / t1.sec / 1e9
        results.append(r)
        print(
            f"moe   {isa:<5} {gf}/{df}: {n_used} distinct experts; moe {tm.sec * 1e3:.2f} ms "
            f"({r['moe_gflops']:.1f} GFLOP/s, {r['moe_gbps']:.1f} GB/s); separate matmuls "
            f"{r['separate_gemm_sec'] * 1e3:.2f} ms (with numpy glue {r['separate_wall_sec'] * 1e3:.2f} ms); "
            f"moe/separate {r['ratio']:.2f}; rel.err {err:.1e}",
            flush=True,
        )
        print(
            f"moe   {isa:<5} 1 token, top-{MOE_TOP_K}: {r['gemv_sec'] * 1e6:.0f} us per call, "
            f"{r['gemv_bytes'] / 1e6:.1f} MB of experts: {r['gemv_gbps']:.1f} GB/s",
            flush=True,
        )
    return results


# ---------------------------------------------------------------- targets


def targets(cases, peers, moe, bw, llc, isa) -> list:
    def find(fmt, shape, m):
        for c in cases:
            if (c["isa"], c["format"], c["shape"], c["m"], c["status"]) == (isa, fmt, shape, m, "ok"):
                return c
        return None

    out = []
    shape_label = {s.name: s.label for s in SHAPES}
    for fmt in GEMV_FORMATS:
        found = False
        for s in SHAPES:
            c = find(fmt, s.name, 1)
            if c is None or c["weight_set_bytes"] < WSET_FACTOR * llc:
                continue
            found = True
            ratio = c["gbps"] / bw
            out.append(
                {
                    "target": "a",
                    "what": f"GEMV {fmt} {s.name} {s.label} M=1",
                    "ratio": ratio,
                    "need": f">= {GEMV_BW_FRACTION}",
                    "pass": ratio >= GEMV_BW_FRACTION,
                    "detail": f"{c['gbps']:.1f} GB/s (best run {c['bytes_per_call'] / c['best_sec'] / 1e9:.1f}) of "
                    f"{bw:.1f} GB/s read bandwidth, set {c['weight_set_bytes'] / 1e6:.0f} MB",
                }
            )
        if not found:
            out.append({"target": "a", "what": f"GEMV {fmt} M=1", "pass": None, "detail": "not measured"})
    for fmt in GEMM_FORMATS:
        for name in GEMM_SHAPES:
            c = find(fmt, name, GEMM_M)
            npg = peers.get(name, {}).get(GEMM_M, {}).get("gflops")
            what = f"GEMM {fmt} {name} {shape_label[name]} M={GEMM_M}"
            if c is None or not npg:
                out.append({"target": "b", "what": what, "pass": None, "detail": "not measured"})
                continue
            ratio = c["gflops"] / npg
            out.append(
                {
                    "target": "b",
                    "what": what,
                    "ratio": ratio,
                    "need": f">= {GEMM_VS_NUMPY}",
                    "pass": ratio >= GEMM_VS_NUMPY,
                    "detail": f"{c['gflops']:.1f} GFLOP/s (best run {c['gflops'] * c['sec'] / c['best_sec']:.1f}) "
                    f"vs numpy float32 {npg:.1f} GFLOP/s",
                }
            )
    r = next((r for r in moe if r["isa"] == isa), None)
    if r is not None:  # (a) as the model runs its expert GEMVs: one moe call per token
        ratio = r["gemv_gbps"] / bw
        out.append(
            {
                "target": "a",
                "what": f"GEMV in a MoE call, 1 token top-{MOE_TOP_K}/{MOE_E} {r['gate_format']}/{r['down_format']}",
                "ratio": ratio,
                "need": f">= {GEMV_BW_FRACTION}",
                "pass": ratio >= GEMV_BW_FRACTION,
                "detail": f"{r['gemv_gbps']:.1f} GB/s of {bw:.1f} GB/s read bandwidth, "
                f"set {r['weight_set_bytes'] / 1e6:.0f} MB",
            }
        )
    what = f"MoE {MOE_TOKENS} tokens top-{MOE_TOP_K}/{MOE_E}"
    if r is None:
        out.append({"target": "c", "what": what, "pass": None, "detail": "not measured"})
    else:
        out.append(
            {
                "target": "c",
                "what": f"{what} {r['gate_format']}/{r['down_format']}",
                "ratio": r["ratio"],
                "need": f"<= {MOE_VS_SEPARATE}",
                "pass": r["ratio"] <= MOE_VS_SEPARATE,
                "detail": f"moe {r['moe_sec'] * 1e3:.2f} ms vs separate {r['separate_gemm_sec'] * 1e3:.2f} ms, "
                f"{r['distinct_experts']} distinct experts",
            }
        )
    return out


def target_line(t: dict) -> str:
    verdict = {True: "PASS", False: "FAIL", None: "N/A "}[t["pass"]]
    ratio = f"ratio {t['ratio']:.2f} (need {t['need']})" if "ratio" in t else ""
    return f"{verdict} ({t['target']}) {t['what']:<40} {ratio:<26} {t['detail']}"


# ---------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="formats q4_k,q4_0,q8_0; M in {1,32}; no LM head")
    p.add_argument("--formats", help=f"comma-separated formats (default: all: {','.join(FORMATS)})")
    p.add_argument("--isas", help="comma-separated ISAs, or 'all' (default: all available on this machine)")
    p.add_argument("--threads", type=int, default=0, help="kernel and BLAS threads (default 0: one per core)")
    p.add_argument("--m", help=f"comma-separated token counts M (default: {','.join(map(str, TOKENS))})")
    p.add_argument(
        "--shapes", help=f"comma-separated shapes (default: all: {','.join(s.name for s in SHAPES)})"
    )
    p.add_argument("--skip-lm-head", action="store_true", help="leave out the 248320x2048 LM head")
    p.add_argument("--skip-moe", action="store_true", help="leave out the mixture-of-experts case")
    p.add_argument("--moe-gate", default="q4_k", help="format of the MoE gate and up experts (default q4_k)")
    p.add_argument("--moe-down", default="q6_k", help="format of the MoE down experts (default q6_k)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    p.add_argument("--reps", type=int, default=5, help="timed runs per case, at least (default 5)")
    p.add_argument(
        "--min-time", type=float, default=0.3, help="seconds of timed runs per case, at least (0.3)"
    )
    p.add_argument(
        "--max-time", type=float, default=2.0, help="stop slow cases after 3 runs and this many s (2)"
    )
    p.add_argument("--run-time", type=float, default=0.02, help="target seconds of one timed run (0.02)")
    p.add_argument("--warmup", type=float, default=0.1, help="seconds of warm-up calls per case (0.1)")
    p.add_argument(
        "--max-call", type=float, default=4.0, help="skip cases estimated slower than this per call (4 s)"
    )
    p.add_argument("--bw-mb", type=int, default=1024, help="array size for the read bandwidth (1024 MiB)")
    p.add_argument("--llc-mb", type=float, help="last-level cache size (default: what the OS reports)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import_clover()
    if args.threads:
        clover_cpu.set_num_threads(args.threads)
    info = clover_cpu.system_info()
    fmts = args.formats.split(",") if args.formats else QUICK_FORMATS if args.quick else FORMATS
    fmts = [f.strip().lower() for f in fmts]
    for f in fmts:
        if f not in kernels.FORMATS:
            sys.exit(f"unknown format {f!r} (known: {', '.join(kernels.FORMATS)})")
    tokens = sorted({int(m) for m in args.m.split(",")}) if args.m else QUICK_TOKENS if args.quick else TOKENS
    isas = info["available_isas"] if args.isas in (None, "all") else [s.strip() for s in args.isas.split(",")]
    for isa in isas:
        if isa not in info["available_isas"]:
            sys.exit(f"ISA {isa!r} is not available (available: {', '.join(info['available_isas'])})")
    target_isa = info["isa"] if info["isa"] in isas else isas[-1]
    names = args.shapes.split(",") if args.shapes else [s.name for s in SHAPES]
    shapes = [
        s
        for s in SHAPES
        if s.name in names and not (s.name == "lm_head" and (args.skip_lm_head or args.quick))
    ]
    if args.llc_mb:
        llc, llc_src = int(args.llc_mb * (1 << 20)), "--llc-mb"
    else:
        llc, llc_src = llc_bytes()

    deq, deq_name = dequantizer()
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "cpu": cpu_model(),
        "system_info": info,
        "llc_bytes": llc,
        "llc_source": llc_src,
        "loadavg_start": os.getloadavg(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas_info(),
        "reference_dequantizer": deq_name,
        "argv": sys.argv[1:],
        "settings": {
            "formats": fmts,
            "isas": isas,
            "tokens": tokens,
            "shapes": [s.name for s in shapes],
            "reps": args.reps,
            "min_time": args.min_time,
            "max_time": args.max_time,
            "run_time": args.run_time,
            "warmup": args.warmup,
            "max_call": args.max_call,
            "rel_tol": REL_TOL,
            "wset_factor": WSET_FACTOR,
        },
    }
    print(f"clover-cpu kernel benchmark  {meta['date']}  commit {meta['git_commit']}")
    print(f"cpu: {meta['cpu']}, {os.cpu_count()} cpus, LLC {llc / 2**20:.0f} MiB ({llc_src})")
    print(
        f"clover_cpu: isa {info['isa']} (available {', '.join(info['available_isas'])}), threads {info['threads']}, "
        f"native build {info.get('native_build')}"
    )
    print(f"numpy {np.__version__}, BLAS {meta['blas']}; reference dequantizer: {deq_name}")
    load = meta["loadavg_start"][0]
    if load > 0.5:
        print(
            f"WARNING: load average {load:.2f} before the start: other processes compete for the cores, "
            "so times are high and noisy (small calls wait for descheduled pool threads)"
        )
    print(
        f"formats {','.join(fmts)}; ISAs {','.join(isas)}; M {','.join(map(str, tokens))}; "
        f"shapes {','.join(s.name for s in shapes)}; targets judged on ISA {target_isa}"
    )

    results = {"meta": meta, "read_bandwidth": None, "numpy": {}, "cases": [], "moe": [], "targets": []}

    def write(status: str) -> None:
        results["status"] = status
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=float))

    t_start = time.perf_counter()
    try:
        bw = measure_read_bandwidth(info["threads"], args.bw_mb, max(args.reps, 5))
        results["read_bandwidth"] = bw
        print(
            f"\nread bandwidth: {bw['gbps']:.1f} GB/s  (best of, over a {bw['array_bytes'] / 2**30:.1f} GiB array:"
        )
        for name, v in bw["methods_gbps"].items():
            print(f"    {v:6.1f} GB/s  {name}")
        print("  )")

        rng = np.random.default_rng(args.seed)
        src = FloatSource(args.seed)
        print(
            "\nGFLOP/s = 2*M*N*K/time; GB/s = quantized weight bytes/time; %readBW = GB/s / read bandwidth;"
        )
        print(
            "x numpy = GFLOP/s / numpy float32 GFLOP/s (x @ W.T) on the same shape and M; set = weights cycled"
        )
        for shape in shapes:
            print(f"\n## {shape.name} {shape.label} ({shape.what})")
            peer = bench_numpy(shape, tokens, llc, src, rng, args)
            results["numpy"][shape.name] = peer
            print(TABLE_HEAD)
            results["cases"] += bench_shape(
                shape, fmts, isas, tokens, peer, bw["gbps"], llc, src, rng, deq, args
            )
        if not args.skip_moe:
            print()
            results["moe"] = bench_moe(isas, src, rng, deq, args)
    except CheckFailed as e:
        print(f"\nCHECK FAILED, benchmark aborted: {e}", file=sys.stderr, flush=True)
        write(f"aborted: {e}")
        return 2

    print(f"\n=== table (ISA, format, shape, M; times are the median per call)  [{args.out}]")
    print(TABLE_HEAD)
    for c in sorted(
        results["cases"],
        key=lambda c: (
            c["isa"],
            SHAPES.index(next(s for s in SHAPES if s.name == c["shape"])),
            fmts.index(c["format"]),
            c["m"],
        ),
    ):
        print(table_row(c))

    results["targets"] = targets(
        results["cases"], results["numpy"], results["moe"], bw["gbps"], llc, target_isa
    )
    print(f"\n=== targets (ISA {target_isa}; read bandwidth {bw['gbps']:.1f} GB/s)")
    for t in results["targets"]:
        print(target_line(t))
    n_pass = sum(t["pass"] is True for t in results["targets"])
    n_fail = sum(t["pass"] is False for t in results["targets"])
    results["elapsed_sec"] = time.perf_counter() - t_start
    meta["loadavg_end"] = os.getloadavg()
    print(f"{n_pass} pass, {n_fail} fail; {results['elapsed_sec']:.0f} s")
    write("ok")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
