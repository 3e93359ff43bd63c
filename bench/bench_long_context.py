#!/usr/bin/env python3
"""Long context: prefill a standard-library prompt of 8K, 32K and 128K tokens, then decode.

For each length (`max`: the longest prompt the file's context holds with --new tokens after it; 128K
on the shipped model): the prompt is the interpreter's standard-library source (sorted files, concatenated)
tokenized with the model's tokenizer and cut to N tokens; `Model.generate` prefills it (in chunks of
clover_cpu.decode.PREFILL_CHUNK tokens) and decodes --new tokens at the file's defaults. Each length runs
in its own process so peak RSS is that length's alone. Reports prefill tokens/s, decode tokens/s and
tokens per forward, peak RSS and the KV cache held; and, analytically, KV bytes per token and at 128K
for the Clover-35B-A3B shape (10 full-attention layers of 2 KV heads x 256) at f16 and Q8_0.

    python bench/bench_long_context.py                        # the shipped model; 8K, 32K, 128K
    python bench/bench_long_context.py --lengths 8192 --new 16 -m other.gguf
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

CLOVER_35B = {"attention_layers": 10, "kv_heads": 2, "head_dim": 256, "gdn_layers": 30, "gdn_v_heads": 32,
              "gdn_k_dim": 128, "gdn_v_dim": 128, "conv_channels": 2 * 16 * 128 + 32 * 128, "conv_kernel": 4}
KV_BYTES_PER_VALUE = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}


def one(path: str, n: int, new: int, threads: int, kv_type: str) -> dict:
    import clover_cpu
    from clover_cpu.convert.synthetic import stdlib_text

    m = clover_cpu.load(path, threads=threads or None, ctx_len=n + new + 64, kv_type=kv_type)
    ids = m.tokenize(stdlib_text(n * 6))[:n]
    if len(ids) < n:
        raise SystemExit(f"the standard library gave only {len(ids)} tokens")
    stats, cache = None, m.new_cache()
    for ev in m.generate(ids, cache=cache, max_new_tokens=new, stop_at_eos=False):
        if ev.kind == "done":
            stats = ev.stats
    kv = sum(a.nbytes for a in (*cache.k.values(), *cache.v.values()))  # allocated (capacity doubles)
    kv_used = sum(a[: cache.n].nbytes for a in (*cache.k.values(), *cache.v.values()))
    gdn = sum(a.nbytes for a in (*cache.ssm.values(), *cache.conv.values()))
    return {"prompt_tokens": n, "new_tokens": stats.generated_tokens, "prefill_seconds": stats.prefill_seconds,
            "prefill_tokens_per_second": n / stats.prefill_seconds,
            "decode_tokens_per_second": stats.tokens_per_second, "tokens_per_forward": stats.tokens_per_forward,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "kv_cache_bytes": kv, "kv_used_bytes": kv_used, "kv_bytes_per_token": kv_used / cache.n,
            "gdn_state_bytes": gdn, "kv_type": kv_type}


def measured_kv(path: str, kv_type: str, n: int = 64) -> dict:
    """KV bytes per token held by the runtime's cache after an n-token prefill of a model file (the bench
    twin has the Clover-35B attention shape): the cache arrays themselves, not arithmetic."""
    import clover_cpu

    m = clover_cpu.load(path, ctx_len=n, kv_type=kv_type)
    cache = m.new_cache()
    m.run(cache, list(range(1, n + 1)), commit=True, logits=False)
    used = sum(a[: cache.n].nbytes for a in (*cache.k.values(), *cache.v.values()))
    return {"model": path, "kv_type": kv_type, "attention_layers": len(cache.k), "kv_bytes_per_token": used / cache.n,
            "kv_bytes_at_128k": used / cache.n * 131072}


def clover_35b_kv() -> dict:
    s = CLOVER_35B
    per_token = {t: s["attention_layers"] * 2 * s["kv_heads"] * s["head_dim"] * b for t, b in KV_BYTES_PER_VALUE.items()}
    gdn = s["gdn_layers"] * (s["gdn_v_heads"] * s["gdn_k_dim"] * s["gdn_v_dim"] + s["conv_channels"] * (s["conv_kernel"] - 1)) * 4
    return {"kv_bytes_per_token": per_token, "kv_bytes_at_128k": {t: v * 131072 for t, v in per_token.items()},
            "gdn_state_bytes": gdn}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="GGUF file (default: the model shipped in the package)")
    ap.add_argument("--lengths", default="8192,32768,max",
                    help="prompt lengths in tokens, comma-separated; max = the file's context less --new "
                         "(default 8192,32768,max)")
    ap.add_argument("--new", type=int, default=32, help="tokens to decode after each prompt (default 32)")
    ap.add_argument("--threads", type=int, default=0, help="kernel threads (default: one per core)")
    ap.add_argument("--json", type=Path, default=Path("bench/results/long_context.json"))
    ap.add_argument("--kv-type", default="f16", choices=["f16", "q8_0", "f32"], help="attention cache type")
    ap.add_argument("--shape-model", help="also measure KV bytes per token on this file (e.g. the bench twin)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a worker: one length, JSON on stdout
    args = ap.parse_args()
    if args.model is None:
        import clover_cpu

        args.model = str(Path(clover_cpu.__file__).parent / "models" / "clover-small.gguf")
    if args.one:
        print(json.dumps(one(args.model, args.one, args.new, args.threads, args.kv_type)))
        return 0
    from clover_cpu.config import Config
    from clover_cpu.decode import context_needed
    from clover_cpu.gguf_file import GGUFError, GGUFFile

    try:
        with GGUFFile(args.model) as f:
            c = Config.from_gguf(f)
    except GGUFError as e:
        raise SystemExit(f"error: {e}") from None
    if args.new < 1:
        raise SystemExit("error: --new must be >= 1")
    # the decoder's rule (whole blocks, the last new token's included): the longest prompt is the
    # context's whole blocks less --new
    ctx, B = c.context_length, max(1, c.block_length)
    longest = ctx // B * B - args.new
    if longest < 1:
        raise SystemExit(f"error: --new {args.new} leaves no room for a prompt in the file's context of {ctx}")
    lengths = []
    for x in args.lengths.split(","):
        x = x.strip()
        try:
            n = longest if x == "max" else int(x)
        except ValueError:
            n = 0
        if n < 1 or context_needed(0, n, args.new, B) > ctx:
            raise SystemExit(f"error: --lengths: {x!r} is not a prompt length of 1 to {longest} tokens (the file's "
                             f"context of {ctx} in blocks of {B}, less --new {args.new}), or max")
        lengths.append(n)
    rows, failed = [], 0
    for n in lengths:
        t0 = time.time()
        r = subprocess.run([sys.executable, __file__, "-m", args.model, "--one", str(n), "--new", str(args.new),
                            "--threads", str(args.threads), "--kv-type", args.kv_type], capture_output=True, text=True)
        if r.returncode:
            print(f"{n}: failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            failed += 1
            continue
        rows.append(json.loads(r.stdout))
        print(f"  {n} tokens done in {time.time() - t0:.0f} s", file=sys.stderr)
    print(f"model: {args.model}, KV cache {args.kv_type}")
    print(f"{'prompt':>8} {'prefill t/s':>12} {'prefill s':>10} {'decode t/s':>11} {'tok/fwd':>8} "
          f"{'peak RSS':>9} {'KV alloc':>9} {'KV B/tok':>9}")
    for r in rows:
        print(f"{r['prompt_tokens']:>8} {r['prefill_tokens_per_second']:>12.1f} {r['prefill_seconds']:>10.1f} "
              f"{r['decode_tokens_per_second']:>11.2f} {r['tokens_per_forward']:>8.2f} "
              f"{r['peak_rss_bytes'] / 2**20:>7.0f}Mi {r['kv_cache_bytes'] / 2**20:>7.0f}Mi {r['kv_bytes_per_token']:>9.0f}")
    kv = clover_35b_kv()
    print("Clover-35B-A3B shape, attention KV: " + ", ".join(
        f"{t} {b / 1024:.1f} KiB/token = {kv['kv_bytes_at_128k'][t] / 2**30:.2f} GiB at 128K"
        for t, b in kv["kv_bytes_per_token"].items()) + f"; GDN state {kv['gdn_state_bytes'] / 2**20:.0f} MiB (any length)")
    shape = None
    if args.shape_model:
        shape = measured_kv(args.shape_model, args.kv_type)
        print(f"measured on {args.shape_model} ({shape['attention_layers']} attention layers), {args.kv_type}: "
              f"{shape['kv_bytes_per_token']:.0f} B/token = {shape['kv_bytes_at_128k'] / 1e9:.2f} GB "
              f"({shape['kv_bytes_at_128k'] / 2**30:.2f} GiB) at 131072 tokens")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"model": args.model, "kv_type": args.kv_type, "rows": rows, "clover_35b": kv,
                                     "measured_shape": shape}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
