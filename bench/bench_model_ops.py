#!/usr/bin/env python3
"""Model operators on Clover shapes: the gated delta rule (recurrent vs chunked) and attention.

Each case is checked first (chunked against recurrent; attention against a float64 numpy reference on
a few query rows), then timed after a warm-up: the minimum and the median of --reps runs, in wall time,
or in the calling thread's CPU time with --threads 1 (steadier when other jobs share the cores).

    python bench/bench_model_ops.py                       # avx2 (or the best ISA), all threads
    python bench/bench_model_ops.py --threads 1 --isas ref,avx2 --out /tmp/ops.json

Shapes: GDN Hk=16, Hv=32, dk=dv=128, T in {1, 8, 32, 128, 512}, speculative (update_state=False, as
while denoising a block) and committing runs; attention Hq=16, Hkv=2, D=256 over S cached rows with the
block-causal mask (B=32), fp16 and fp32 caches. Results go to bench/results/model_ops.json (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import clover_cpu
from clover_cpu import _core, ops

REPO = Path(__file__).resolve().parent.parent
GDN_T = [1, 8, 32, 128, 512]
HK, HV, DK, DV = 16, 32, 128, 128
HQ, HKV, D = 16, 2, 256
REL_TOL = 1e-4


CLOCK = time.perf_counter  # thread CPU time with --threads 1 (robust to a shared machine)


def timed(fn, reps: int) -> tuple[float, float]:
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t = CLOCK()
        fn()
        ts.append(CLOCK() - t)
    return min(ts), statistics.median(ts)


def rel_err(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def bench_gdn(isa: str, reps: int, rng, rows: list) -> None:
    for T in GDN_T:
        q = rng.standard_normal((T, HK, DK)).astype(np.float32)
        k = rng.standard_normal((T, HK, DK)).astype(np.float32)
        v = rng.standard_normal((T, HV, DV)).astype(np.float32)
        g = (-rng.random((T, HV))).astype(np.float32)
        beta = rng.random((T, HV)).astype(np.float32)
        state = (rng.standard_normal((HV, DK, DV)) * 0.1).astype(np.float32)
        want = ops.gated_delta_rule(q, k, v, g, beta, state, update_state=False, mode="recurrent", isa=isa)
        got = ops.gated_delta_rule(q, k, v, g, beta, state, update_state=False, mode="chunked", isa=isa)
        err = rel_err(got, want)
        assert err < REL_TOL, f"chunked vs recurrent T={T}: rel err {err:.2e}"
        for update in (False, True):
            for mode in ("recurrent", "chunked"):
                s = state.copy()
                best, med = timed(
                    lambda s=s, mode=mode, update=update: ops.gated_delta_rule(
                        q, k, v, g, beta, s, update_state=update, mode=mode, isa=isa
                    ),
                    reps,
                )
                rows.append(
                    dict(
                        op="gdn",
                        isa=isa,
                        T=T,
                        mode=mode,
                        update_state=update,
                        min_ms=best * 1e3,
                        median_ms=med * 1e3,
                    )
                )
                print(
                    f"gdn       {isa:5s} T={T:4d} {mode:9s} update={int(update)}  "
                    f"min {best * 1e3:8.3f} ms  median {med * 1e3:8.3f} ms  ({best * 1e6 / T:7.1f} us/token)"
                )


def bench_attention(isa: str, reps: int, S: int, rng, rows: list) -> None:
    for T in (1, 32):
        q = rng.standard_normal((T, HQ, D)).astype(np.float32)
        gate = rng.standard_normal((T, HQ, D)).astype(np.float32)
        k32 = rng.standard_normal((S, HKV, D)).astype(np.float32)
        v32 = rng.standard_normal((S, HKV, D)).astype(np.float32)
        pos = np.arange(S - T, S, dtype=np.int32)
        for kv in ("f16", "f32"):
            k, v = (k32.astype(np.float16), v32.astype(np.float16)) if kv == "f16" else (k32, v32)
            o = ops.attention(q, k, v, pos, S, mask="block_causal", block_length=32, gate=gate, isa=isa)
            # check token 0 of heads 0 and 9 against float64
            for h in (0, 9):
                g_ = h // (HQ // HKV)
                sc = k[: (pos[0] // 32 + 1) * 32, g_].astype(np.float64) @ q[0, h] / np.sqrt(D)
                e = np.exp(sc - sc.max())
                want = (
                    (e @ v[: len(e), g_].astype(np.float64))
                    / e.sum()
                    / (1 + np.exp(-gate[0, h].astype(np.float64)))
                )
                err = rel_err(o[0, h], want)
                assert err < REL_TOL, f"attention {kv} T={T} head {h}: rel err {err:.2e}"
            best, med = timed(
                lambda k=k, v=v: ops.attention(
                    q, k, v, pos, S, mask="block_causal", block_length=32, gate=gate, isa=isa
                ),
                reps,
            )
            flops = 4.0 * T * HQ * S * D  # q.k and p.v, 2 ops per multiply-add
            rows.append(
                dict(
                    op="attention",
                    isa=isa,
                    T=T,
                    S=S,
                    kv=kv,
                    min_ms=best * 1e3,
                    median_ms=med * 1e3,
                    gflops=flops / best / 1e9,
                )
            )
            print(
                f"attention {isa:5s} T={T:4d} S={S} {kv}        min {best * 1e3:8.3f} ms  median {med * 1e3:8.3f} ms"
                f"  ({flops / best / 1e9:6.1f} GFLOP/s)"
            )


def main(argv=None) -> int:
    info = clover_cpu.system_info()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--isas", default=info["isa"], help="comma-separated ISAs to time (default: the active one)"
    )
    p.add_argument("--threads", type=int, default=0, help="kernel threads (0: one per physical core)")
    p.add_argument("--reps", type=int, default=20, help="timed runs per case after one warm-up")
    p.add_argument("--seq", type=int, default=4096, help="cached rows S for attention")
    p.add_argument("--only", choices=["gdn", "attention"], default=None, help="run one operator only")
    p.add_argument(
        "--out", default=str(REPO / "bench" / "results" / "model_ops.json"), help="JSON results file"
    )
    args = p.parse_args(argv)

    clover_cpu.set_num_threads(args.threads)
    global CLOCK
    if _core.num_threads() == 1:
        CLOCK = time.thread_time  # the one kernel thread is this thread
    rng = np.random.default_rng(0)
    rows: list = []
    clock = "thread CPU time" if CLOCK is time.thread_time else "wall time"
    print(f"# threads {_core.num_threads()} ({clock}), cpu {platform.processor() or platform.machine()}")
    for isa in args.isas.split(","):
        if args.only in (None, "gdn"):
            bench_gdn(isa, args.reps, rng, rows)
        if args.only in (None, "attention"):
            bench_attention(isa, max(3, args.reps // 4), args.seq, rng, rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"threads": _core.num_threads(), "clock": clock, "system": info}
    out.write_text(json.dumps({**meta, "results": rows}, indent=1))
    print(f"# wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
