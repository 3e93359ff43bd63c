"""`clover-cpu run`: generate text with a Clover (block diffusion) or Qwen3.5-MoE (autoregressive) GGUF."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MASK_GLYPH = "\u2591"  # light shade: an undecided position in --show-steps


def shipped_model() -> Path | None:
    d = Path(__file__).resolve().parent.parent / "models"
    files = sorted(d.glob("*.gguf")) if d.exists() else []
    return files[0] if files else None


def add_parser(sub) -> None:
    p = sub.add_parser(
        "run",
        help="generate text (block diffusion for Clover files, autoregressive for Qwen3.5-MoE files)",
        description="Generate text from a prompt, streaming tokens as they become final. Clover files decode a "
        "block of tokens at a time by parallel denoising: each step commits every masked position whose "
        "confidence reaches --threshold (at least one), so lower thresholds commit more tokens per forward.",
        epilog='examples:\n  clover-cpu run -p "def fibonacci(n):"\n  clover-cpu run -m model.gguf -f prompt.txt -n 128 --stats\n'
        "  clover-cpu run -m model.gguf --chat",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-m", "--model", help="GGUF file (default: the small Clover shipped in the package)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="the prompt text")
    src.add_argument("-f", "--file", help="read the prompt from this file ('-' for stdin)")
    src.add_argument("--chat", action="store_true", help="interactive multi-turn chat with the file's chat template")
    p.add_argument("-n", "--max-new-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy argmax (default), > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default 1 = off)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling (repeatable runs)")
    p.add_argument("--threshold", type=float, default=None,
                   help="confidence needed to commit a position, in (0, 1] (default: the file's, 0.95 for Clover)")
    p.add_argument("--block-length", type=int, default=None, help="tokens per diffusion block (default: the file's)")
    p.add_argument("--max-steps", type=int, default=None, help="denoising steps per block at most (default: block length)")
    p.add_argument("--window", type=int, default=0,
                   help="positions per denoising forward: only the first N masked positions of the block are "
                   "computed and can commit (0 = the whole block, default). A forward's cost grows with its "
                   "positions on a CPU, so a small window is faster when the model commits few tokens per "
                   "step; the output can differ from whole-block decoding")
    p.add_argument("--reuse", action="store_true",
                   help="approximate, faster on a CPU: a block's tokens enter the cache as soon as they and all "
                   "before them are final, with the values computed while later positions were masks; no "
                   "separate forward to commit each block (output can differ from exact decoding)")
    p.add_argument("--policy", choices=["threshold", "fixed"], default="threshold",
                   help="threshold: commit every confident position (Fast-dLLM/LLaDA2); fixed: LLaDA's schedule, "
                   "the block spread evenly over --max-steps steps")
    p.add_argument("--scorer", choices=["prob", "margin", "entropy"], default="prob",
                   help="confidence of a position: candidate probability (default), top-2 margin, exp(-entropy)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--threads", type=int, default=None, help="threads (default: one per physical core)")
    p.add_argument("--ctx-len", type=int, default=None, help="context length to allow (default: the model's)")
    p.add_argument("--kv-type", choices=["f16", "q8_0", "f32"], default="f16",
                   help="attention cache element type (default f16; q8_0 halves its memory at long contexts)")
    p.add_argument("--prefetch", choices=["auto", "on", "off"], default="auto",
                   help="routed experts whose weights are not in memory are read from the disk together, "
                   "ahead of use: auto (default) does it when the model file is larger than the free memory "
                   "(it cannot stay in the page cache), on always, off leaves it to page faults")
    p.add_argument("--repack", choices=["auto", "on", "off"], default="auto",
                   help="copy the q4_k layer weights at load into the layout the AVX2, AVX-512 and NEON dot-product "
                   "kernels multiply fastest "
                   "(~3%% more memory, the file's pages released): auto (default) where the CPU has those kernels "
                   "and the model takes at most half the free memory, on whatever its size (an error without those "
                   "kernels), off keeps the file's layout")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout, nothing else")
    p.add_argument("--stats", action="store_true", help="print speed statistics at the end (to stderr)")
    p.add_argument("--show-steps", action="store_true", help="redraw the block as masks turn into tokens")


def options(args) -> dict:
    if args.max_new_tokens < 0:
        raise ValueError("--max-new-tokens must be >= 0")
    if args.threshold is not None and not 0 < args.threshold <= 1:
        raise ValueError("--threshold must be in (0, 1]")
    if args.block_length is not None and args.block_length < 1:
        raise ValueError("--block-length must be >= 1")
    if args.max_steps is not None and args.max_steps < 1:
        raise ValueError("--max-steps must be >= 1")
    if args.window < 0:
        raise ValueError("--window must be >= 0 (0 = the whole block)")
    if args.window and args.max_steps is not None:
        raise ValueError("--window and --max-steps do not combine")
    if args.temperature < 0:
        raise ValueError("--temperature must be >= 0")
    if args.top_k < 0:
        raise ValueError("--top-k must be >= 0")
    if not 0 < args.top_p <= 1:
        raise ValueError("--top-p must be in (0, 1]")
    if args.threads is not None and args.threads < 0:
        raise ValueError("--threads must be >= 0")
    return dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                seed=args.seed, threshold=args.threshold, block_length=args.block_length, max_steps=args.max_steps,
                policy=args.policy, scorer=args.scorer, stop_at_eos=not args.ignore_eos, window=args.window,
                reuse=args.reuse)


class Streamer:
    """Prints the decoded text of a growing id list, holding back incomplete UTF-8."""

    def __init__(self, model, out=sys.stdout):
        self.model, self.out = model, out
        self.ids: list[int] = []
        self.printed = ""

    def add(self, ids) -> None:
        self.ids.extend(ids)
        text = self.model.detokenize(self.ids)
        while text.endswith("\ufffd"):
            text = text[:-1]
        if text.startswith(self.printed):
            self.out.write(text[len(self.printed):])
            self.printed = text
        self.out.flush()


def render_block(model, block, mask_id) -> str:
    parts = [MASK_GLYPH if t == mask_id else model.detokenize([t]).replace("\n", "\u21b5") for t in block]
    return "".join(parts)


def generate(model, prompt, opts, args, out=sys.stdout, cache=None):
    """Run one generation, streaming to `out` unless --json; returns (token ids, stats, interrupted)."""
    streamer = None if args.json else Streamer(model, out)
    ids, stats, interrupted = [], None, False
    tty = sys.stderr.isatty()
    try:
        for ev in model.generate(prompt, cache=cache, **opts):
            if ev.kind == "tokens":
                ids.extend(ev.tokens)
                if streamer:
                    streamer.add(ev.tokens)
            elif ev.kind == "step" and args.show_steps:
                line = render_block(model, ev.block, model.config.mask_token_id)
                sys.stderr.write(("\r\x1b[K" if tty else "") + f"[block] {line}" + ("" if tty else "\n"))
                sys.stderr.flush()
            elif ev.kind == "done":
                stats = ev.stats
    except KeyboardInterrupt:
        interrupted = True
    if args.show_steps and tty:
        sys.stderr.write("\r\x1b[K")
    return ids, stats, interrupted


def print_stats(stats, model, file=sys.stderr) -> None:
    import clover_cpu

    info = clover_cpu.system_info()
    print(f"\n[stats] prompt {stats.prompt_tokens} tokens ({stats.prefill_tokens_per_second:.1f} tok/s prefill), "
          f"generated {stats.generated_tokens} tokens in {stats.seconds:.2f} s ({stats.tokens_per_second:.2f} tok/s), "
          f"{stats.forwards} forwards, {stats.tokens_per_forward:.2f} tokens/forward, "
          f"{info['isa']} x {info['threads']} threads", file=file)


def main(args: argparse.Namespace) -> int:
    import clover_cpu

    opts = options(args)
    path = args.model or shipped_model()
    if path is None:
        raise ValueError("no model: pass -m MODEL.gguf (this installation ships none)")
    if args.file:
        prompt = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    else:
        prompt = args.prompt
    t = time.perf_counter()
    model = clover_cpu.load(path, threads=args.threads, ctx_len=args.ctx_len, kv_type=args.kv_type,
                            prefetch=args.prefetch, repack=args.repack)
    load_s = time.perf_counter() - t
    if args.chat:
        return chat(model, opts, args)
    ids, stats, interrupted = generate(model, prompt, opts, args)
    if args.json:
        info = clover_cpu.system_info()
        d = {"text": model.detokenize(ids), "token_ids": ids}
        if stats is not None:
            d.update({k: v for k, v in stats.as_dict().items() if not k.startswith("prefill")})
        d.update(model=str(path), isa=info["isa"], threads=info["threads"], load_seconds=load_s,
                 interrupted=interrupted)
        print(json.dumps(d))
        return 130 if interrupted else 0
    print()
    if interrupted:
        print("[interrupted]", file=sys.stderr)
        return 130
    if args.stats and stats is not None:
        print_stats(stats, model)
    return 0


def chat(model, opts, args) -> int:
    """Multi-turn chat: the file's Jinja chat template renders the conversation; the caches are kept
    between turns as long as the new rendering extends what is already committed."""
    template = model.file.kv.get("tokenizer.chat_template")
    if not isinstance(template, str):
        raise ValueError(f"{model.file.path.name} has no chat template (tokenizer.chat_template); use -p instead")
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=False, lstrip_blocks=False)
    try:
        tpl = env.from_string(template)
    except jinja2.TemplateError as e:
        raise ValueError(f"the chat template cannot be parsed: {e}") from None
    messages: list[dict] = []
    cache = model.new_cache()
    history: list[int] = []  # the conversation's token ids so far: prompts and replies as generated
    history_text = ""  # the template's rendering that `history` stands for (up to the last reply)

    def render(msgs, gen):
        try:
            return tpl.render(messages=msgs, add_generation_prompt=gen, bos_token="", eos_token="")
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template failed: {e}") from None

    print("chat: type a message and press Enter; an empty line or Ctrl-D ends.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        text = render(messages, True)
        if history and text.startswith(history_text):
            # only the new turn is tokenized: the caches already hold the conversation's committed blocks
            ids = history + model.tokenize(text[len(history_text):])
        else:
            ids, cache = model.tokenize(text), model.new_cache()
        if ids[: cache.n] != cache.tokens:
            cache = model.new_cache()
        reused = cache.n
        out, stats, interrupted = generate(model, ids[cache.n :], opts, args, cache=cache)
        print()
        reply = model.detokenize(out)
        messages.append({"role": "assistant", "content": reply})
        # what follows the reply in the template's rendering (its end-of-turn marker) joins the history
        done = render(messages, False)
        if done.startswith(text + reply):
            history = ids + out + model.tokenize(done[len(text + reply):])
            history_text = done
        else:
            history, history_text = [], ""
        if args.stats and stats is not None:
            print_stats(stats, model)
            print(f"[chat] {reused} tokens of context reused from the caches", file=sys.stderr)
