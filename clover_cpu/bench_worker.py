"""One engine's measurements for `clover-cpu bench`, in its own process (so peak RSS is its own).

    python -m clover_cpu.bench_worker --engine clover MODEL.gguf --threads 2 --tests pp1,pp32,tg
    /path/to/python .../clover_cpu/bench_worker.py --engine llama MODEL.gguf ...   # any Python with llama_cpp

The llama.cpp side imports nothing from clover_cpu (it may run under another interpreter, where
llama-cpp-python is installed). Prints one JSON object on stdout: tokens/s per test, peak RSS, load time.
With --serve it loads the model, prints {"ready": ..., "load_seconds": ...}, then runs one test per
line of JSON read from stdin ({"test": "pp32"}), printing {"test": ..., "tokens_per_second": ...} for
each, and at the end of its input the final object, its tokens/s a list per test (`clover-cpu bench
--interleave`). Only these lines go to stdout: anything else written there (an engine's own output)
goes to stderr.

ppN: N tokens forwarded into a fresh context (the median of --reps runs); tg: greedy autoregressive
generation of --tg-tokens tokens after a 16-token prompt, one token per forward.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time


def token_ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    """Deterministic pseudo-random ids in [10, vocab) (a linear congruential sequence: no numpy needed)."""
    out, x = [], seed * 2654435761 + 12345
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(10 + (x >> 33) % (vocab - 10))
    return out


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


class CloverEngine:
    def __init__(self, path: str, threads: int, ctx: int, repack: str = "auto"):
        import clover_cpu

        self.m = clover_cpu.load(path, threads=threads, ctx_len=ctx, repack=repack)
        if self.m.config.arch != "qwen35moe":
            raise SystemExit(f"{path} is a {self.m.config.arch} file; the AR benchmark needs qwen35moe")
        self.vocab = self.m.config.vocab_size
        self.cache = None

    def reset(self) -> None:
        if getattr(self, "cache", None) is None:
            self.cache = self.m.new_cache()
        else:
            self.cache.clear()  # as llama.cpp keeps its KV buffer: no fresh pages to fault in

    def eval(self, ids: list[int]):
        h = self.m.run(self.cache, ids, commit=True, logits=False, rows=[len(ids) - 1])
        return self.m.logits(h)[0]  # the last position's logits only, as llama.cpp computes them

    def info(self) -> dict:
        import clover_cpu

        i = clover_cpu.system_info()
        return {"isa": i["isa"], "threads": i["threads"]}


class LlamaEngine:
    def __init__(self, path: str, threads: int, ctx: int):
        import llama_cpp

        self.llm = llama_cpp.Llama(model_path=path, n_ctx=ctx, n_threads=threads, n_threads_batch=threads,
                                   n_batch=512, n_ubatch=512, verbose=False)
        self.vocab = self.llm.n_vocab()
        self.version = llama_cpp.__version__
        # the SIMD features its build uses (llama-cpp-python builds with GGML_NATIVE: AVX-512 where present)
        self.system = llama_cpp.llama_print_system_info().decode(errors="replace").strip()

    def reset(self) -> None:
        self.llm.reset()  # the next eval removes the KV cache entries past n_tokens = 0

    def eval(self, ids: list[int]):
        self.llm.eval(ids)
        return self.llm.scores[self.llm.n_tokens - 1]

    def info(self) -> dict:
        return {"llama_cpp_python": self.version, "system_info": self.system}


def argmax(row) -> int:
    best, bi = None, 0
    try:
        return int(row.argmax())
    except AttributeError:
        for i, v in enumerate(row):
            if best is None or v > best:
                best, bi = v, i
        return bi


def measure(engine, tests: list[str], reps: int, tg_tokens: int) -> dict:
    res = {}
    for test in tests:
        if test.startswith("pp"):
            n = int(test[2:])
            ids = token_ids(n, engine.vocab, seed=n)
            engine.reset()
            engine.eval(ids[: min(n, 8)])  # warm-up: pages of the weights touched once
            times = []
            for _ in range(reps):
                engine.reset()
                t = time.perf_counter()
                engine.eval(ids)
                times.append(time.perf_counter() - t)
            times.sort()
            res[test] = n / times[len(times) // 2]
        elif test == "tg":
            engine.reset()
            tok = argmax(engine.eval(token_ids(16, engine.vocab, seed=16)))
            t = time.perf_counter()
            for _ in range(tg_tokens):
                tok = argmax(engine.eval([tok]))
            res[test] = tg_tokens / (time.perf_counter() - t)
        else:
            raise SystemExit(f"unknown test {test!r}")
        print(f"[{type(engine).__name__}] {test}: {res[test]:.2f} tok/s", file=sys.stderr, flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--engine", choices=["clover", "llama"], required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--tests", default="pp1,pp32,pp128,pp512,tg")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tg-tokens", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--serve", action="store_true", help="run the tests named on stdin, one per line")
    ap.add_argument("--repack", choices=["auto", "on", "off"], default="auto",
                    help="clover: the loader's repack mode (off: the file's layout, for a before/after)")
    a = ap.parse_args(argv)
    out = sys.stdout
    if a.serve:  # the protocol keeps the real stdout; file descriptor 1 (the engines' own writes) -> stderr
        out = os.fdopen(os.dup(1), "w", buffering=1)
        sys.stdout.flush()
        os.dup2(2, 1)
    t = time.perf_counter()
    engine = (CloverEngine(a.model, a.threads, a.ctx, a.repack) if a.engine == "clover"
              else LlamaEngine(a.model, a.threads, a.ctx))
    load_s = time.perf_counter() - t
    if a.serve:
        res = {}
        print(json.dumps({"ready": a.engine, "load_seconds": load_s}), file=out, flush=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            test = json.loads(line)["test"]
            tps = measure(engine, [test], a.reps, a.tg_tokens)[test]
            res.setdefault(test, []).append(tps)
            print(json.dumps({"test": test, "tokens_per_second": tps}), file=out, flush=True)
    else:
        res = measure(engine, a.tests.split(","), a.reps, a.tg_tokens)
    print(json.dumps({"engine": a.engine, "load_seconds": load_s, "tokens_per_second": res,
                      "peak_rss_gb": peak_rss_gb(), **engine.info()}), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
