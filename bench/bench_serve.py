"""Serving benchmark: `clover-cpu serve` against llama.cpp's llama-server on the same GGUF, the same threads
and the same --parallel, driven by the same client code (raw HTTP streaming on 127.0.0.1).

Per concurrency level N (default 1, 2, 4, 8) each server is started with --parallel N; N client threads
each send `--requests` streaming /v1/completions requests one after another (distinct random token-id
prompts, so no prompt cache helps, temperature 0, ignore_eos, `--max-tokens` tokens each). Reported:
aggregate generated tokens/s (all tokens over the wall time of the level), the median time to first
token, and the server's peak RSS (VmHWM). Then, at one stream, the time to first token of a 512-token
prompt (median of `--ttft-runs`), and for clover-cpu its share of a request's time outside the model's
forwards (HTTP, JSON, scheduling and sampling: 1 - busy seconds from /metrics / request wall time).
With `--conversation N`, at --parallel 1: N requests, each the last one's prompt and `--turn-tokens` new
tokens (a chat or an agent resending its context), with prompt caching (both servers' default) and, for
clover-cpu, without it (`cache_prompt: false`); each request's time to first token. With
`--shared-system N`, at --parallel 1, through /v1/chat/completions (a file with a chat template): `--chats`
new conversations that share an N-token system prompt, each with its own question, then each one's second
turn; each request's time to first token and cached tokens, with and without prompt caching. With `--mixed-prompt N`, at --parallel 2: while one stream generates, a second request brings an N-token
prompt; reported are that request's time to first token and the longest wait between the first stream's
tokens while the prompt is read (a server that reads the whole prompt in one forward stalls the stream
for all of it; llama-server's token chunks mark them, and clover-cpu's token counter in /metrics, polled
every 20 ms, which also counts the prompt request's own token at the window's end). clover-cpu runs it
with its --prefill-slice default and, as the no-slicing baseline, with --prefill-slice 2048.

    python bench/bench_serve.py --model twin-q4_k_m.gguf \
        --llama-server /path/to/llama.cpp/build/bin/llama-server --json bench/results/serve.json

The engines run one after the other, level by level (clover-cpu, then llama-server), so bandwidth
drift between them stays small; rerun for the noise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from bench_kernels import cpu_model  # (this folder is on sys.path when a script of it runs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, kind: str, cmd: list[str], port: int, log: Path):
        self.kind, self.port, self.url = kind, port, f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kind} exited ({self.proc.returncode}); see {log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            time.sleep(0.25)
        else:
            raise RuntimeError(f"{kind} did not become healthy in 600 s; see {log}")
        with urllib.request.urlopen(self.url + "/v1/models", timeout=30) as r:  # both put n_vocab in "meta"
            self.vocab = int(json.loads(r.read())["data"][0]["meta"]["n_vocab"])

    def peak_rss_gb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1e6
        return float("nan")

    def metric(self, name: str) -> float | None:
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith(name + " "):
                        return float(line.split()[1])
        except Exception:
            return None
        return None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def start(kind: str, model: Path, parallel: int, threads: int, ctx: int, llama_server: Path | None,
          logdir: Path, extra: list[str] = ()) -> Server:
    port = free_port()
    if kind == "clover-cpu":
        cmd = [sys.executable, "-m", "clover_cpu", "serve", "-m", str(model), "--port", str(port), "--parallel",
               str(parallel), "--threads", str(threads), "--ctx-len", str(ctx), "--log-level", "warning",
               "--max-queue", "64", *extra]
    else:
        cmd = [str(llama_server), "-m", str(model), "--port", str(port), "--host", "127.0.0.1", "-np", str(parallel),
               "-t", str(threads), "-tb", str(threads), "-c", str(ctx * parallel), "--no-webui"]
    return Server(kind, cmd, port, logdir / f"serve-{kind}-p{parallel}.log")


def sse_events(url: str, path: str, body: dict):
    """POST `body` to a streaming endpoint; yields the JSON object of each server-sent event until [DONE]."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1800) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


def stream_request(url: str, prompt: list[int], max_tokens: int, times: list | None = None,
                   stop: threading.Event | None = None, temperature: float = 0.0, extra: dict | None = None) -> dict:
    """One streaming /v1/completions request: time to first text, tokens, seconds, prompt tokens the
    server had cached (usage.prompt_tokens_details, where it says). `times` gets the arrival time
    (perf_counter) of every chunk; `stop` set ends the request (the connection closes) at its next chunk;
    `extra`: more body fields."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "seed": 1, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}, **(extra or {})}
    t0 = time.perf_counter()
    first, chunks, usage = None, 0, None
    with contextlib.closing(sse_events(url, "/v1/completions", body)) as events:  # (closed: the connection too)
        for obj in events:
            if obj.get("usage"):
                usage = obj["usage"]
            for c in obj.get("choices") or []:
                if times is not None:  # (llama-server streams a chunk per token, with text or without)
                    times.append(time.perf_counter())
                if c.get("text"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - t0
            if stop is not None and stop.is_set():
                break
    t = time.perf_counter() - t0
    n = usage["completion_tokens"] if usage else chunks
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"ttft": first if first is not None else t, "tokens": n, "seconds": t, "cached": cached}


def random_prompt(rng, n: int, vocab: int) -> list[int]:
    return [int(x) for x in rng.integers(min(1000, vocab // 4), min(100000, vocab), size=n)]


def run_level(server: Server, streams: int, requests: int, prompt_tokens: int, max_tokens: int, seed: int) -> dict:
    import numpy as np

    results: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(i):
        rng = np.random.default_rng(seed * 1000 + i)
        for _ in range(requests):
            try:
                r = stream_request(server.url, random_prompt(rng, prompt_tokens, server.vocab), max_tokens)
            except Exception as e:  # a failed request is reported, not hidden
                detail = e.read().decode(errors="replace")[:200] if hasattr(e, "read") else ""
                with lock:
                    errors.append(f"{type(e).__name__}: {e} {detail}")
                return
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    return {"streams": streams, "requests": len(results), "errors": errors, "tokens": tokens, "seconds": wall,
            "tokens_per_second": tokens / wall if wall > 0 else 0.0,
            "ttft_median": statistics.median(r["ttft"] for r in results) if results else None,
            "peak_rss_gb": server.peak_rss_gb()}


def mixed(server: Server, prompt_tokens: int, ctx: int, seed: int) -> dict:
    """A stream generating while a second request's long prompt is read (see the module's doc)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    times: list[float] = []
    stop = threading.Event()
    failed: list[BaseException] = []
    first = random_prompt(rng, 32, server.vocab)

    counter = server.kind == "clover-cpu"

    def stream():
        try:
            # sampled: a random-weight model's greedy tokens may all be ones without text (no chunks to time);
            # clover-cpu's tokens are marked by its counter alone (its text chunks would mark some twice)
            stream_request(server.url, first, ctx - 64, None if counter else times, stop, temperature=1.0)
        except BaseException as e:  # (reported below)
            failed.append(e)

    def poll():  # clover-cpu streams text only, and a random-weight model's tokens rarely have any: its
        # tokens/s counter (updated as tokens are made) marks them instead
        last = server.metric("clover_generated_tokens_total")
        while not stop.is_set():
            time.sleep(0.02)
            v = server.metric("clover_generated_tokens_total")
            if v is not None and last is not None and v > last:
                times.append(time.perf_counter())
            last = v

    a = threading.Thread(target=stream)
    a.start()
    probe = threading.Thread(target=poll) if counter else None
    if probe:
        probe.start()
    deadline = time.perf_counter() + 600
    while len(times) < 3 and a.is_alive() and time.perf_counter() < deadline:
        time.sleep(0.01)
    t0 = time.perf_counter()
    b = stream_request(server.url, random_prompt(rng, prompt_tokens, server.vocab), 1)
    t1 = time.perf_counter()
    while time.perf_counter() < t1 + 1 and a.is_alive():  # (the chunk after the prompt's end closes the window)
        time.sleep(0.01)
    stop.set()
    a.join(600)
    if probe:
        probe.join(60)
    if failed:
        raise RuntimeError(f"the generating stream failed: {failed[0]}")
    times.sort()
    # the first stream's waits that overlap the second request's time in the server
    marks = [t for t in times if t <= t0][-1:] + [t for t in times if t0 < t <= t1] + [t for t in times if t > t1][:1]
    gaps = [y - x for x, y in zip(marks, marks[1:])]
    return {"prompt_tokens": prompt_tokens, "ttft": b["ttft"], "max_gap": max(gaps) if gaps else None,
            "tokens_during_prompt": sum(t0 < t <= t1 for t in times)}


def conversation(server: Server, turns: int, turn_tokens: int, max_tokens: int, seed: int,
                 cache_prompt: bool = True) -> dict:
    """One stream, `turns` requests: the first a `turn_tokens`-token prompt, each next one the last prompt
    and `turn_tokens` new tokens (an agent's context growing by a tool's output; the replies left out, so
    that both servers see the same token ids). Each request's time to first token; `max_tokens` each."""
    import numpy as np

    rng = np.random.default_rng(seed)
    prompt: list[int] = []
    rows = []
    for _ in range(turns):
        prompt = prompt + random_prompt(rng, turn_tokens, server.vocab)
        r = stream_request(server.url, prompt, max_tokens, extra={"cache_prompt": cache_prompt})
        rows.append({"prompt_tokens": len(prompt), "ttft": r["ttft"], "seconds": r["seconds"], "cached": r["cached"]})
    return {"turns": rows, "seconds": sum(r["seconds"] for r in rows)}


def chat_request(url: str, messages: list, max_tokens: int, extra: dict | None = None) -> dict:
    """One streaming /v1/chat/completions request: time to the first chunk that carries text (content or
    reasoning), seconds, and the prompt tokens the server had cached (usage.prompt_tokens_details)."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "seed": 1, "stream": True,
            "stream_options": {"include_usage": True}, **(extra or {})}
    t0 = time.perf_counter()
    first, usage = None, None
    for obj in sse_events(url, "/v1/chat/completions", body):
        if obj.get("usage"):
            usage = obj["usage"]
        for c in obj.get("choices") or []:
            d = c.get("delta") or {}
            if first is None and (d.get("content") or d.get("reasoning_content")):
                first = time.perf_counter() - t0
    t = time.perf_counter() - t0
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"ttft": first if first is not None else t, "seconds": t, "cached": cached,
            "prompt_tokens": (usage or {}).get("prompt_tokens")}


def system_text(server: Server, n: int) -> str:
    """About n tokens of real text (the standard library's source), cut at a token through the server's
    /tokenize and /detokenize."""
    import inspect
    import json as json_mod
    import textwrap

    text = "".join(inspect.getsource(m) for m in (textwrap, json_mod.decoder, json_mod.encoder, inspect))

    def post(path, obj):
        req = urllib.request.Request(server.url + path, data=json.dumps(obj).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    ids = post("/tokenize", {"content": text})["tokens"]
    if len(ids) < n:
        raise SystemExit(f"--shared-system {n}: more than the {len(ids)} tokens of text at hand")
    return post("/detokenize", {"tokens": ids[:n]})["content"]


def shared_system(server: Server, system: str, chats: int, max_tokens: int, cache_prompt: bool = True) -> dict:
    """`chats` new conversations, one after another, each a system prompt they all share (an agent's
    instructions and tools) and a question of its own; then each one's second turn. Time to first token and
    cached prompt tokens per request."""
    rows = []
    convs = [[{"role": "system", "content": system},
              {"role": "user", "content": f"Question {i + 1}: which function above would you test first, and why?"}]
             for i in range(chats)]
    for turn in (1, 2):
        for i, msgs in enumerate(convs):
            r = chat_request(server.url, msgs, max_tokens, extra={"cache_prompt": cache_prompt})
            rows.append({"chat": i + 1, "turn": turn, **r})
            msgs += [{"role": "assistant", "content": f"Answer {i + 1}."},
                     {"role": "user", "content": "And the second one?"}]
    return {"requests": rows, "seconds": sum(r["seconds"] for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="GGUF file both servers load")
    ap.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary (omit: clover-cpu only)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", default="1,2,4,8", help="concurrency levels (comma list)")
    ap.add_argument("--requests", type=int, default=2, help="requests per stream per level")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="prompt length of the throughput requests")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ttft-prompt", type=int, default=512)
    ap.add_argument("--ttft-runs", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=2048, help="context per sequence")
    ap.add_argument("--mixed-prompt", type=int, default=0,
                    help="also the mixed test with a prompt of this many tokens (0: skip; --ctx must hold it)")
    ap.add_argument("--conversation", type=int, default=0,
                    help="also the growing-context test with this many turns (0: skip; --ctx must hold them)")
    ap.add_argument("--turn-tokens", type=int, default=512, help="new prompt tokens per turn of --conversation")
    ap.add_argument("--shared-system", type=int, default=0,
                    help="also the shared-system-prompt test: --chats conversations whose system prompt is this many "
                         "tokens (0: skip; needs a file with a chat template)")
    ap.add_argument("--chats", type=int, default=3, help="conversations of --shared-system")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "serve.json")
    a = ap.parse_args()
    if not a.model.is_file():
        ap.error(f"{a.model}: no such file")
    kinds = ["clover-cpu"] + (["llama-server"] if a.llama_server else [])
    logdir = a.json.parent
    logdir.mkdir(parents=True, exist_ok=True)
    levels = [int(x) for x in a.streams.split(",") if x]
    out: dict = {"model": str(a.model), "threads": a.threads, "max_tokens": a.max_tokens, "cpu": cpu_model(),
                 "levels": {k: [] for k in kinds}, "ttft_512": {}, "overhead": None}
    import numpy as np

    for n in levels:
        for kind in kinds:
            s = start(kind, a.model, n, a.threads, a.ctx, a.llama_server, logdir)
            try:
                stream_request(s.url, random_prompt(np.random.default_rng(7), 8, s.vocab), 4)  # warm: pages mapped in
                busy0 = s.metric("clover_busy_seconds_total")
                r = run_level(s, n, a.requests, a.prompt_tokens, a.max_tokens, seed=n)
                if kind == "clover-cpu" and n == 1 and busy0 is not None:
                    busy = s.metric("clover_busy_seconds_total") - busy0
                    out["overhead"] = {"busy_seconds": busy, "wall_seconds": r["seconds"],
                                       "outside_forwards": 1 - busy / r["seconds"]}
                if n == 1:
                    rng = np.random.default_rng(11)
                    ts = [stream_request(s.url, random_prompt(rng, a.ttft_prompt, s.vocab), 1)["ttft"]
                          for _ in range(a.ttft_runs)]
                    out["ttft_512"][kind] = statistics.median(ts)
            finally:
                s.stop()
            out["levels"][kind].append(r)
            print(f"{kind:13s} streams {n}: {r['tokens_per_second']:7.2f} t/s aggregate, ttft median "
                  f"{r['ttft_median']:.2f} s, peak RSS {r['peak_rss_gb']:.2f} GB"
                  f"{', ERRORS: ' + '; '.join(r['errors'][:2]) if r['errors'] else ''}", flush=True)
    if a.mixed_prompt:
        out["mixed"] = {}
        runs = [("clover-cpu", []), ("clover-cpu", ["--prefill-slice", "2048"])] + \
            ([("llama-server", [])] if a.llama_server else [])
        for kind, extra in runs:
            s = start(kind, a.model, 2, a.threads, a.ctx, a.llama_server, logdir, extra)
            try:
                stream_request(s.url, random_prompt(np.random.default_rng(7), 8, s.vocab), 4)
                r = mixed(s, a.mixed_prompt, a.ctx, seed=5)
            finally:
                s.stop()
            name = kind + (" " + " ".join(extra) if extra else "")
            out["mixed"][name] = r
            gap = "n/a (the stream ended first)" if r["max_gap"] is None else f"{r['max_gap']:.2f} s"
            print(f"mixed, {name}: {a.mixed_prompt}-token prompt TTFT {r['ttft']:.2f} s beside a stream whose "
                  f"longest wait was {gap} ({r['tokens_during_prompt']} token marks meanwhile)", flush=True)
    if a.conversation:
        out["conversation"] = {}
        runs = [("clover-cpu", True), ("clover-cpu", False)] + ([("llama-server", True)] if a.llama_server else [])
        for kind, cached in runs:
            s = start(kind, a.model, 1, a.threads, a.ctx, a.llama_server, logdir)
            try:
                stream_request(s.url, random_prompt(np.random.default_rng(7), 8, s.vocab), 4)
                r = conversation(s, a.conversation, a.turn_tokens, 16, seed=9, cache_prompt=cached)
            finally:
                s.stop()
            name = kind + ("" if cached else ", cache_prompt off")
            out["conversation"][name] = r
            ttfts = ", ".join(f"{t['ttft']:.2f}" for t in r["turns"])
            held = ", ".join(str(t["cached"]) for t in r["turns"])
            print(f"conversation, {name}: TTFT per turn {ttfts} s (cached prompt tokens {held}); "
                  f"{r['seconds']:.1f} s in all", flush=True)
    if a.shared_system:
        out["shared_system"] = {}
        runs = [("clover-cpu", True), ("clover-cpu", False)] + ([("llama-server", True)] if a.llama_server else [])
        system = None
        for kind, cached in runs:
            # clover-cpu keeps --chats conversations (llama-server keeps finished prompts in its --cache-ram)
            extra = ["--cache-slots", str(a.chats)] if kind == "clover-cpu" else []
            s = start(kind, a.model, 1, a.threads, a.ctx, a.llama_server, logdir, extra)
            try:
                system = system or system_text(s, a.shared_system)
                chat_request(s.url, [{"role": "user", "content": "Hello."}], 4)  # warm: pages mapped in
                r = shared_system(s, system, a.chats, 16, cache_prompt=cached)
            finally:
                s.stop()
            name = kind + ("" if cached else ", cache_prompt off")
            out["shared_system"][name] = r
            for row in r["requests"]:
                print(f"shared system prompt, {name}: chat {row['chat']} turn {row['turn']}: TTFT {row['ttft']:.2f} s, "
                      f"{row['prompt_tokens']} prompt tokens, {row['cached']} cached", flush=True)
            print(f"shared system prompt, {name}: {r['seconds']:.1f} s in all", flush=True)
    _table(out, kinds, levels)
    a.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {a.json}")
    return 0


def _table(out: dict, kinds: list[str], levels: list[int]) -> None:
    lv = out["levels"]
    print(f"\n{out['model']}, {out['threads']} threads, {out['max_tokens']} tokens per request, {out['cpu']}")
    head = "| streams | " + " | ".join(f"{k} t/s | {k} TTFT" for k in kinds)
    head += " | ratio |" if len(kinds) == 2 else " |"
    print(head)
    print("|---" * (1 + 2 * len(kinds) + (1 if len(kinds) == 2 else 0)) + "|")
    for i, n in enumerate(levels):
        cells = [f"{lv[k][i]['tokens_per_second']:.2f} | {lv[k][i]['ttft_median']:.2f} s" for k in kinds]
        row = f"| {n} | " + " | ".join(cells)
        if len(kinds) == 2:
            row += f" | {lv[kinds[0]][i]['tokens_per_second'] / lv[kinds[1]][i]['tokens_per_second']:.2f}x"
        print(row + " |")
    # 4 streams / 1 stream: each 4-stream level against each 1-stream level next to it in the run (with
    # --streams 1,4,1,4,... the memory's drift between levels shows as the spread of these ratios)
    pairs = [(i, j) for i, n in enumerate(levels) if n == 4 for j in (i - 1, i + 1) if 0 <= j < len(levels)
             and levels[j] == 1]
    for k in kinds:
        if not pairs:
            break
        r = [lv[k][i]["tokens_per_second"] / lv[k][j]["tokens_per_second"] for i, j in pairs]
        rss = [lv[k][i]["peak_rss_gb"] / lv[k][j]["peak_rss_gb"] for i, j in pairs if lv[k][j]["peak_rss_gb"]]
        out.setdefault("four_over_one", {})[k] = {"ratios": r, "median": statistics.median(r)}
        print(f"{k}: 4 streams / 1 stream aggregate {', '.join(f'{x:.2f}x' for x in r)} (median "
              f"{statistics.median(r):.2f}x)" + (f", peak RSS {max(rss):.2f}x at most" if rss else ""))
    for k, v in out["ttft_512"].items():
        print(f"TTFT, {k}, 512-token prompt: {v:.2f} s")
    if out["overhead"]:
        print(f"clover-cpu at 1 stream: {100 * out['overhead']['outside_forwards']:.1f}% of the time outside forwards")


if __name__ == "__main__":
    sys.exit(main())
