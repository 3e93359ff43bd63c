#!/usr/bin/env python3
"""Diffusion decoding on a CPU: record the forwards a real Clover makes, replay them on a big model.

1. record: the shipped small Clover decodes 20 held-out prompts (train/train_clover.py's eval_prompts)
   at its defaults (threshold, block length from the file) and every forward is logged: how many
   positions it computed, how many it committed, where the context stood.
2. replay: the same forwards, in the same order, on the benchmark-shaped model (-m; a qwen35moe or
   clover file; attention runs block-causal with the recorded block length either way, so the work is
   what a Clover of that shape would do). Against it: the same runtime decoding the same number of
   tokens one per forward (AR through the caches), and a cost curve: time of one forward of T
   positions over a cached context, T = 1, 2, 4, 8, 16, 32.

Reports committed tokens/s of both, tokens per forward, time per forward against positions computed,
and distinct experts touched per forward (average over MoE layers); and each forward's bandwidth floor:
the weight bytes it must read (dense tensors, the head, the experts it touched) at the best measured
read bandwidth, with what that allows diffusion against AR. Prints a table and writes JSON.

    python bench/bench_diffusion.py record --out bench/results/traces.json
    python bench/bench_diffusion.py replay -m bench.gguf --traces bench/results/traces.json --threads 2
    python bench/bench_diffusion.py record --mode auto --costs-model bench.gguf --out auto.json
    python bench/bench_diffusion.py compare exact.json auto.json window1.json   (replays of one threshold)
    python bench/bench_diffusion.py experts    (distinct experts over consecutive positions)
    python bench/bench_diffusion.py synth --per-step 3 --out s3.json   (a model that finalizes 3 per step)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


class StackProbe:
    """Model._stack (the fused sub-layers) with each feed-forward's distinct experts passed to log."""

    def __init__(self, stack, log):
        self.stack, self.log = stack, log

    def __getattr__(self, name):  # the token mixers (gdn, attn) as they are
        return getattr(self.stack, name)

    def moe(self, *a):
        n = self.stack.moe(*a)
        self.log(int(n))
        return n


class Recorder:
    """Wraps Model.run, Model.logits, and the feed-forwards (Model._stack.moe, or Model._moe on the
    operator path): logs (positions, committed, context, rows of the output head) per forward and the
    distinct experts each MoE layer touched; the time of an output head applied after a run (the decoder
    computes only the rows it needs) counts to that run. close() puts the model back."""

    def __init__(self, model):
        self.model, self.calls, self._experts = model, [], []
        run, moe, head = model.run, model._moe, model.logits
        self.stack = model._stack
        model._stack = StackProbe(self.stack, lambda n: self._experts.append(n))

        def logged_run(cache, tokens, *, commit, block=None, logits=True, rows=None):
            self._experts = []
            n0 = cache.n
            t0 = time.perf_counter()
            out = run(cache, tokens, commit=commit, block=block, logits=logits, rows=rows)
            dt = time.perf_counter() - t0
            T = len(tokens)
            self.calls.append({"T": T, "commit": T if commit is True else int(commit), "n": n0, "seconds": dt,
                               "rows": (T if rows is None else len(rows)) if logits else 0,
                               "experts_by_layer": list(self._experts)})
            return out

        def logged_head(h):
            t0 = time.perf_counter()
            out = head(h)
            if self.calls:
                self.calls[-1]["seconds"] += time.perf_counter() - t0
                self.calls[-1]["rows"] += len(h)
            return out

        def logged_moe(L, x, prefetch):
            out = moe(L, x, prefetch)
            self._experts.append(int(model.last_experts_used))
            return out

        model.run, model._moe, model.logits = logged_run, logged_moe, logged_head

    def close(self):
        del self.model.run, self.model._moe, self.model.logits  # the class methods again
        self.model._stack = self.stack


def bandwidth_floor(res: dict, calls: list, w: dict, gbps: float, threads: int, B: int) -> dict:
    """What the read bandwidth alone allows (no kernel can beat it: a forward must stream its weights
    from DRAM, which no cache here holds): each cost-curve point's floor; the replayed diffusion at its
    floor, against AR at its floor and against AR as measured; and the tokens a block step must commit
    to tie or reach 1.5x AR when both run at their floors. `calls`: the replayed decoding forwards
    (prefill left out), each with its `floor_bytes`. `bound` says whether the weights are too big for
    the caches (1 GiB and more): otherwise none of this bounds anything."""
    from clover_cpu.commands.bench import forward_bytes

    bps = gbps * 1e9
    ar_bytes = forward_bytes(w, res["cost_curve"][0]["experts_by_layer"], True)  # T=1, the head on its one row
    curve = []
    for r in res["cost_curve"]:
        floor = forward_bytes(w, r["experts_by_layer"], True) / bps
        curve.append({"T": r["T"], "floor_seconds": floor, "measured_over_floor": r["seconds"] / floor})
    d, a = res["diffusion"], res["ar"]
    diff_floor = sum(c["floor_bytes"] for c in calls) / bps
    step = next((r for r in res["cost_curve"] if r["T"] == B), None)
    total = w["dense"] + w["head"] + sum(w["expert_by_layer"]) * w["n_expert"]
    out = {"read_gbps": gbps, "threads": threads, "all_weight_bytes": total, "bound": total >= 1 << 30,
           "weight_bytes": w, "ar_forward_bytes": ar_bytes, "curve": curve,
           "diffusion_floor_seconds": diff_floor,
           "diffusion_floor_tokens_per_second": d["generated"] / diff_floor,
           "ar_floor_tokens_per_second": bps / ar_bytes,
           # the ceilings on the target ratio: diffusion at its floor against AR at its floor / as measured
           "ceiling_vs_ar_at_floor": d["generated"] / diff_floor / (bps / ar_bytes),
           "ceiling_vs_ar_measured": d["generated"] / diff_floor / a["tokens_per_second"]}
    if step:
        k = forward_bytes(w, step["experts_by_layer"], True) / ar_bytes
        out["block_step"] = {"T": B, "bytes_over_ar": k, "tokens_to_tie": k, "tokens_for_1_5x": 1.5 * k}
    return out


def train_module():
    if "train_clover" in sys.modules:
        return sys.modules["train_clover"]
    spec = importlib.util.spec_from_file_location("train_clover", ROOT / "train" / "train_clover.py")
    tc = importlib.util.module_from_spec(spec)
    sys.modules["train_clover"] = tc  # (its dataclasses look their module up)
    spec.loader.exec_module(tc)
    return tc


def load_eval_prompts(model, n: int):
    tc = train_module()

    class SP:  # the runtime's tokenizer in SentencePiece's clothes
        encode = staticmethod(model.tokenize)
        decode = staticmethod(model.detokenize)

    return [p for p, _ in tc.eval_prompts(n, SP())]


def record(args) -> int:
    import clover_cpu

    path = args.model or str(Path(clover_cpu.__file__).parent / "models" / "clover-small.gguf")
    m = clover_cpu.load(path, threads=args.threads or None)
    B = m.config.block_length
    if args.costs_model:  # mode auto chooses its windows by the cost curve of the model replayed later
        big = clover_cpu.load(args.costs_model, threads=args.threads or None)
        m._costs[B] = big.forward_costs(B)
        big.close()
        print(f"mode auto with {args.costs_model}'s forward costs: " + ", ".join(
            f"T={T} {1e3 * s:.1f} ms" for T, s in sorted(m._costs[B].body.items())))
    elif args.mode == "auto":
        m.forward_costs(B)  # measured now, not inside the recorded decoding
    prompts = load_eval_prompts(m, args.prompts)
    parses = train_module().parses
    traces = []
    mode = {"window": args.window, "reuse": args.reuse, "mode": args.mode}
    identical, agree, parsed, parsed_exact = 0, [], 0, 0
    approximate = args.window or args.reuse or args.mode != "exact"
    for p in prompts:
        rec = Recorder(m)
        ids = m.tokenize(p)
        out = m.generate_text(ids, max_new_tokens=args.new, threshold=args.threshold, **mode)
        traces.append({"prompt_tokens": len(ids), "generated": out["generated_tokens"],
                       "forwards": [{"T": c["T"], "commit": c["commit"], "n": c["n"], "rows": c["rows"]}
                                    for c in rec.calls]})
        rec.close()
        parsed += parses(p, out["text"])
        if approximate:  # agreement with exact (whole-block) decoding of the same prompt
            ex = m.generate_text(ids, max_new_tokens=args.new, threshold=args.threshold)
            parsed_exact += parses(p, ex["text"])
            exact = ex["token_ids"]
            got = out["token_ids"]
            k = 0
            while k < min(len(exact), len(got)) and exact[k] == got[k]:
                k += 1
            identical += exact == got
            agree.append(k / max(1, len(exact)))
    gen = sum(t["generated"] for t in traces)
    fwd = sum(len(t["forwards"]) - (1 if t["prompt_tokens"] >= m.config.block_length else 0) for t in traces)
    doc = {"model": path, "block_length": m.config.block_length,
           "threshold": round(float(args.threshold or m.config.threshold), 4),
           "new_tokens": args.new, "generated": gen, "decode_forwards": fwd, **mode, "traces": traces}
    doc["parse_rate"] = parsed / max(1, len(prompts))
    if agree:
        doc["agreement"] = {"identical_completions": int(identical), "prompts": len(agree),
                            "mean_common_prefix": float(np.mean(agree)),
                            "exact_parse_rate": parsed_exact / max(1, len(prompts))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc))
    how = ("mode auto: window per forward, reuse on" if args.mode == "auto" else
           f"window {args.window or 'off'}, reuse {'on' if args.reuse else 'off'}")
    print(f"{len(traces)} prompts, {gen} tokens in {fwd} decoding forwards: {gen / max(1, fwd):.2f} tokens per "
          f"forward (block {doc['block_length']}, threshold {doc['threshold']}, {how}); parse rate "
          f"{doc['parse_rate']:.2f}; traces in {args.out}")
    if agree:
        a = doc["agreement"]
        print(f"agreement with exact decoding: {a['identical_completions']} of {a['prompts']} completions identical, "
              f"on average the first {100 * a['mean_common_prefix']:.0f}% of a completion; exact's parse rate "
              f"{a['exact_parse_rate']:.2f}")
    return 0


def replay(args) -> int:
    import clover_cpu
    from clover_cpu.commands.bench import forward_bytes, read_bandwidth_gbps, weight_bytes

    doc = json.loads(args.traces.read_text())
    B = doc["block_length"]
    m = clover_cpu.load(args.model, threads=args.threads or None)
    V = m.config.vocab_size
    rng = np.random.default_rng(0)
    traces = doc["traces"][: args.limit or None]
    rec = Recorder(m)

    def toks(k):
        return rng.integers(0, V, k).tolist()

    # warm-up (page in the weights); the read bandwidth, now and after the cost curve
    c = m.new_cache()
    m.run(c, toks(8), commit=True, block=B)
    rec.calls.clear()
    threads = clover_cpu.system_info()["threads"]
    bandwidth = [read_bandwidth_gbps(threads)]
    # diffusion: exactly the recorded forwards; the prompt prefill is timed apart
    diff = {"seconds": 0.0, "forwards": 0, "generated": 0, "prefill_seconds": 0.0}
    for t in traces:
        c = m.new_cache()
        for i, f in enumerate(t["forwards"]):
            rows = f.get("rows", f["T"])  # (traces recorded before the decoder chose its rows: all of them)
            # the trace keeps how many rows were read, not which: the span's last ones (a fused commit reads
            # the next block's; the last layer's cost depends on the count alone)
            h = m.run(c, toks(f["T"]), commit=f["commit"], block=B, logits=False, rows=range(f["T"] - rows, f["T"]))
            if rows:
                m.logits(h)
            call = rec.calls[-1]
            if i == 0 and t["prompt_tokens"] >= B and f["commit"] == f["T"]:
                diff["prefill_seconds"] += call["seconds"]
                call["prefill"] = True
            else:
                diff["seconds"] += call["seconds"]
                diff["forwards"] += 1
        diff["generated"] += t["generated"]
    diff_calls = list(rec.calls)
    rec.calls.clear()
    # AR on the same runtime: prefill, then one committed token per forward, as many tokens
    ar = {"seconds": 0.0, "forwards": 0, "generated": 0}
    for t in traces:
        c = m.new_cache()
        m.run(c, toks(t["prompt_tokens"]), commit=True, logits=False, rows=[])
        for _ in range(t["generated"]):
            h = m.run(c, toks(1), commit=True, logits=False)
            m.logits(h)
            ar["seconds"] += rec.calls[-1]["seconds"]
            ar["forwards"] += 1
        ar["generated"] += t["generated"]
    rec.calls.clear()
    # cost curve: one forward of T positions over a 64-token context, median of --reps
    curve = []
    for T in (1, 2, 4, 8, 16, 32):
        ts, by_layer = [], []
        for _ in range(args.reps):
            c = m.new_cache()
            m.run(c, toks(64), commit=True, block=B, logits=False)
            m.run(c, toks(T), commit=False, block=B)
            ts.append(rec.calls[-1]["seconds"])
            by_layer.append(rec.calls[-1]["experts_by_layer"])
        by_layer = np.mean(by_layer, axis=0)
        curve.append({"T": T, "seconds": statistics.median(ts), "experts": float(by_layer.mean()),
                      "experts_by_layer": by_layer.tolist()})
    bandwidth.append(read_bandwidth_gbps(threads))
    gbps = max(bandwidth)  # the best reading: the floor stays a lower bound
    w = weight_bytes(args.model)
    for call in diff_calls:
        call["floor_bytes"] = forward_bytes(w, call["experts_by_layer"], call["rows"] > 0)
    by_T: dict[int, list] = {}
    for call in diff_calls:
        if call.get("prefill"):
            continue
        by_T.setdefault(call["T"], []).append(call)
    res = {
        "model": args.model, "traces": str(args.traces), "threads": clover_cpu.system_info()["threads"],
        "diffusion": {**diff, "tokens_per_second": diff["generated"] / diff["seconds"],
                      "tokens_per_forward": diff["generated"] / max(1, diff["forwards"])},
        "ar": {**ar, "tokens_per_second": ar["generated"] / ar["seconds"]},
        "forwards_by_positions": {T: {"count": len(v), "seconds": statistics.median(x["seconds"] for x in v),
                                      "experts": statistics.mean(np.mean(x["experts_by_layer"]) for x in v)} for T, v in sorted(by_T.items())},
        "cost_curve": curve,
    }
    res["speedup_vs_ar"] = res["diffusion"]["tokens_per_second"] / res["ar"]["tokens_per_second"]
    res["bandwidth_floor"] = bandwidth_floor(res, [c for c in diff_calls if not c.get("prefill")], w, gbps,
                                             threads, B)
    res["mode"] = {"mode": doc.get("mode", "exact"), "window": doc.get("window", 0), "reuse": doc.get("reuse", False),
                   "agreement": doc.get("agreement"), "parse_rate": doc.get("parse_rate")}
    print(f"model {args.model}, {res['threads']} threads, {len(traces)} traces (block {B}, mode "
          f"{res['mode']['mode']}, window "
          f"{res['mode']['window'] or 'off'}, reuse {'on' if res['mode']['reuse'] else 'off'})")
    print(f"{'decoding':<22} {'tokens':>7} {'forwards':>9} {'tok/fwd':>8} {'tok/s':>8} {'vs AR':>6}")
    d, a = res["diffusion"], res["ar"]
    print(f"{'diffusion (replayed)':<22} {d['generated']:>7} {d['forwards']:>9} {d['tokens_per_forward']:>8.2f} "
          f"{d['tokens_per_second']:>8.2f} {res['speedup_vs_ar']:>5.2f}x")
    print(f"{'AR, same runtime':<22} {a['generated']:>7} {a['forwards']:>9} {1.0:>8.2f} {a['tokens_per_second']:>8.2f} {1.0:>5.2f}x")
    bf = res["bandwidth_floor"]
    print(f"{'T':>4} {'ms/forward':>11} {'ms/position':>12} {'experts/layer':>14} {'floor ms':>9} {'x floor':>8}"
          f"   (cost curve, 64-token context; floor: its weight bytes at {gbps:.1f} GB/s, {threads} threads)")
    for r, f in zip(curve, bf["curve"]):
        print(f"{r['T']:>4} {1e3 * r['seconds']:>11.1f} {1e3 * r['seconds'] / r['T']:>12.2f} {r['experts']:>14.1f} "
              f"{1e3 * f['floor_seconds']:>9.1f} {f['measured_over_floor']:>7.2f}x")
    print("replayed forwards by positions computed: " + ", ".join(
        f"T={T}: {v['count']} x {1e3 * v['seconds']:.0f} ms, {v['experts']:.0f} experts" for T, v in res["forwards_by_positions"].items()))
    if not bf["bound"]:
        print(f"(the weights, {bf['all_weight_bytes'] / 2**20:.0f} MiB, may sit in the caches here: the floor below is no bound)")
    print(f"bandwidth floor: these forwards at {gbps:.1f} GB/s decode {bf['diffusion_floor_tokens_per_second']:.2f} "
          f"tokens/s at most, {bf['ceiling_vs_ar_at_floor']:.2f}x AR at its own floor "
          f"({bf['ar_floor_tokens_per_second']:.1f} t/s), {bf['ceiling_vs_ar_measured']:.2f}x AR as measured")
    if "block_step" in bf:
        k = bf["block_step"]
        print(f"a {B}-position step reads {k['bytes_over_ar']:.2f}x an AR step's weights: at the floor it ties AR "
              f"when it commits {k['tokens_to_tie']:.2f} tokens and reaches 1.5x at {k['tokens_for_1_5x']:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1))
    return 0


def compare(args) -> int:
    """Several replays of one threshold (e.g. exact, auto and fixed window/reuse settings), each priced at
    the same per-forward times: every replay's forwards at the median time of all forwards of their
    positions across the replays, AR at the median AR time per token. The VM's speed drifts between
    replays (the same 2-position forward 255 ms in one, 293 in the next), which the runs' own ratios
    to AR carry; this compares what the modes' forwards cost, not when they ran."""
    runs = {p.stem: json.loads(p.read_text()) for p in args.replays}
    pool: dict[int, list] = {}
    for r in runs.values():
        for T, v in r["forwards_by_positions"].items():
            pool.setdefault(int(T), []).extend([v["seconds"]] * v["count"])
    med = {T: statistics.median(v) for T, v in pool.items()}
    ar = statistics.median(r["ar"]["seconds"] / r["ar"]["generated"] for r in runs.values())
    print(f"{'replay':<28} {'tok/fwd':>8} {'vs AR (own run)':>16} {'vs AR (pooled times)':>21}")
    for name, r in runs.items():
        d = r["diffusion"]
        secs = sum(v["count"] * med[int(T)] for T, v in r["forwards_by_positions"].items())
        print(f"{name:<28} {d['tokens_per_forward']:>8.2f} {r['speedup_vs_ar']:>15.2f}x "
              f"{d['generated'] / secs * ar:>20.2f}x")
    return 0


def random_union(n_expert: int, used: int, positions: int) -> float:
    """Expected distinct experts that `positions` tokens touch when each picks `used` of `n_expert` at
    random (without replacement): n (1 - (1 - k/n)^T)."""
    return n_expert * (1 - (1 - used / n_expert) ** positions)


def experts(args) -> int:
    """Distinct experts per MoE layer that T consecutive positions touch with a trained router (the
    shipped model reading the held-out prompts and their true continuations), against random routing
    of the same shape and against the same forwards with the router's choices shuffled between tokens."""
    import clover_cpu

    path = args.model or str(Path(clover_cpu.__file__).parent / "models" / "clover-small.gguf")
    m = clover_cpu.load(path, threads=args.threads or None)
    c = m.config
    tc = train_module()

    class SP:
        encode = staticmethod(m.tokenize)
        decode = staticmethod(m.detokenize)

    texts = [p + t for p, t in tc.eval_prompts(args.prompts, SP())]
    rec = Recorder(m)
    counts = {T: [] for T in args.positions}
    for text in texts:
        ids = m.tokenize(text)
        for T in args.positions:
            for s0 in range(0, len(ids) - T + 1, T):  # consecutive, non-overlapping windows from the start
                cache = m.new_cache()
                if s0:
                    m.run(cache, ids[:s0], commit=True, logits=False)
                rec.calls.clear()
                m.run(cache, ids[s0:s0 + T], commit=False, logits=False)
                counts[T].append(float(np.mean(rec.calls[-1]["experts_by_layer"])))
    rec.close()
    res = {"model": path, "n_expert": c.n_expert, "n_expert_used": c.n_expert_used, "prompts": len(texts),
           "by_positions": {T: {"windows": len(v), "trained": float(np.mean(v)),
                                "random": random_union(c.n_expert, c.n_expert_used, T)}
                            for T, v in counts.items() if v}}
    print(f"{path}: {c.n_expert} experts, {c.n_expert_used} per token; {len(texts)} held-out texts")
    print(f"{'positions':>9} {'windows':>8} {'trained router':>15} {'random routing':>15} {'ratio':>6}")
    for T, r in res["by_positions"].items():
        print(f"{T:>9} {r['windows']:>8} {r['trained']:>15.2f} {r['random']:>15.2f} {r['trained'] / r['random']:>6.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1))
    return 0


def synthetic_trace(B: int, prompt: int, new: int, per_step: int, chooser=None) -> dict:
    """The forwards clover_cpu.decode makes for one prompt when the model finalizes `per_step` tokens per
    denoising step (the last step of a block what is left), as record logs them. Exact decoding (chooser
    None): every step computes the whole block and the finished block is committed by a forward fused
    with the next block's first step. Auto (chooser: a decode.AutoWindow): reuse, and each forward's
    window is the chooser's; the model is taken to be surest left to right, so a window of w commits
    min(w, per_step) tokens, the first ones, and the chooser observes exactly that."""
    prefill = prompt // B * B
    forwards = [{"T": prefill, "commit": prefill, "n": 0, "rows": 0}] if prefill else []
    n, head, tail, remaining = prefill, prompt - prefill, 0, new
    commit_pending = False  # exact: the previous block waits for its commit (fused with this block's first step)
    while remaining > 0:
        budget = min(B - head, remaining)
        undecided = list(range(head, head + budget))
        in_cache = 0
        while undecided:
            if chooser is None:
                if commit_pending:
                    forwards.append({"T": 2 * B, "commit": B, "n": n - B, "rows": len(undecided)})
                    commit_pending = False
                else:
                    forwards.append({"T": B, "commit": 0, "n": n, "rows": len(undecided)})
                k = min(per_step, len(undecided))
            else:
                new_final = tail + undecided[0] - in_cache
                w = chooser.window(new_final, undecided)
                positions = new_final + undecided[w - 1] - undecided[0] + 1
                forwards.append({"T": positions, "commit": new_final, "n": n, "rows": w})
                n += new_final
                in_cache, tail = undecided[0], 0
                k = min(per_step, w)
                reached = np.arange(w) < k
                reached[0] = True  # at least one commits
                chooser.observe(reached, chooser.cost(positions, w), positions)
            undecided = undecided[k:]
        remaining -= budget
        if chooser is None:
            n += B
            commit_pending = True
        else:  # the block's last final tokens go in with the next block's first forward
            tail = B - in_cache
        head = 0
    return {"prompt_tokens": prompt, "generated": new, "forwards": forwards}


def synth(args) -> int:
    """Synthetic traces: a model that finalizes --per-step tokens per denoising step, blocks of --block,
    decoded exact or auto (auto choosing by --costs-model's forward costs on this machine)."""
    chooser = None
    if args.mode == "auto":
        import clover_cpu
        from clover_cpu.decode import AutoWindow

        m = clover_cpu.load(args.costs_model, threads=args.threads or None)
        cost = m.forward_costs(args.block)
        m.close()
        print(f"mode auto with {args.costs_model}'s forward costs: " + ", ".join(
            f"T={T} {1e3 * s:.1f} ms" for T, s in sorted(cost.body.items())))
    traces = []
    for _ in range(args.prompts):
        if args.mode == "auto":
            chooser = AutoWindow(cost, args.block)  # each request learns afresh, as in decoding
        traces.append(synthetic_trace(args.block, args.prompt_tokens, args.new, args.per_step, chooser))
    gen = sum(t["generated"] for t in traces)
    fwd = sum(len(t["forwards"]) - (1 if t["prompt_tokens"] >= args.block else 0) for t in traces)
    doc = {"model": f"synthetic: {args.per_step} tokens per step", "block_length": args.block, "threshold": None,
           "new_tokens": args.new, "generated": gen, "decode_forwards": fwd, "window": 0,
           "reuse": args.mode == "auto", "mode": args.mode, "synthetic_per_step": args.per_step, "traces": traces}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc))
    print(f"{len(traces)} synthetic prompts ({args.prompt_tokens} tokens), {gen} tokens in {fwd} decoding forwards: "
          f"{gen / max(1, fwd):.2f} tokens per forward (block {args.block}, {args.per_step} per step, mode "
          f"{args.mode}); traces in {args.out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="decode held-out prompts with the small Clover and log its forwards")
    r.add_argument("-m", "--model", help="a clover GGUF (default: the shipped model)")
    r.add_argument("--prompts", type=int, default=20)
    r.add_argument("--new", type=int, default=64, help="tokens per prompt (default 64)")
    r.add_argument("--threads", type=int, default=0)
    r.add_argument("--threshold", type=float, default=None, help="confidence threshold (default: the file's)")
    r.add_argument("--window", type=int, default=0, help="decode with this window (run --window; default off)")
    r.add_argument("--reuse", action="store_true", help="decode with run --reuse (approximate)")
    r.add_argument("--mode", choices=["exact", "auto"], default="exact", help="decode with run --mode")
    r.add_argument("--costs-model", help="mode auto: choose windows by this model's forward costs (the model "
                   "the traces will be replayed on) instead of the recording model's")
    r.add_argument("--out", type=Path, default=Path("bench/results/traces.json"))
    p = sub.add_parser("replay", help="replay recorded forwards on another model, with AR and a cost curve")
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--traces", type=Path, default=Path("bench/results/traces.json"))
    p.add_argument("--limit", type=int, default=0, help="replay only the first N traces")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", type=Path, default=Path("bench/results/diffusion_replay.json"))
    e = sub.add_parser("experts", help="distinct experts per layer over consecutive positions: trained router "
                       "against random routing")
    e.add_argument("-m", "--model", help="a clover GGUF (default: the shipped model)")
    e.add_argument("--prompts", type=int, default=20)
    e.add_argument("--positions", type=int, nargs="+", default=[1, 2, 4, 8])
    e.add_argument("--threads", type=int, default=0)
    e.add_argument("--json", type=Path, default=Path("bench/results/diffusion_experts.json"))
    y = sub.add_parser("synth", help="synthetic traces: a model that finalizes N tokens per denoising step")
    y.add_argument("--per-step", type=int, required=True, help="tokens the model finalizes per step")
    y.add_argument("--block", type=int, default=32, help="block length (default 32, Clover's)")
    y.add_argument("--prompts", type=int, default=4)
    y.add_argument("--prompt-tokens", type=int, default=64)
    y.add_argument("--new", type=int, default=128, help="tokens per prompt (default 128)")
    y.add_argument("--mode", choices=["exact", "auto"], default="exact")
    y.add_argument("--costs-model", help="mode auto: the model whose forward costs choose the windows (the one "
                   "the traces will be replayed on)")
    y.add_argument("--threads", type=int, default=0)
    y.add_argument("--out", type=Path, default=Path("bench/results/synthetic_traces.json"))
    c = sub.add_parser("compare", help="replays of one threshold priced at the same per-forward times")
    c.add_argument("replays", type=Path, nargs="+", help="replay JSON files (replay --json)")
    args = ap.parse_args()
    if args.cmd == "synth" and (args.per_step < 1 or args.block < 1 or args.new < 1 or args.prompt_tokens < 1):
        ap.error("--per-step, --block, --new and --prompt-tokens must be >= 1")
    if args.cmd == "synth" and args.mode == "auto" and not args.costs_model:
        ap.error("synth --mode auto needs --costs-model (the model the traces will be replayed on)")
    return {"record": record, "replay": replay, "experts": experts, "compare": compare, "synth": synth}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
