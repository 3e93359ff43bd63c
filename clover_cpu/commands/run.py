"""`clover-cpu run`: generate text with a Clover (block diffusion) or Qwen3.5-MoE (autoregressive) GGUF."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MASK_GLYPH = "\u2591"  # light shade: an undecided position in --show-steps


def shipped_model() -> Path | None:
    import clover_cpu

    try:
        return clover_cpu.shipped_model()
    except FileNotFoundError:
        return None


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
    p.add_argument("--think", choices=["auto", "on", "off"], default="auto",
                   help="chat: ask a reasoning model to think first (on) or not (off: enable_thinking=False "
                   "reaches the template); auto (default) leaves it to the template")
    p.add_argument("--reasoning", choices=["show", "hide", "raw"], default="show",
                   help="the model's reasoning (<think>...</think>): show it apart from the answer (dimmed on a "
                   "terminal; default), hide it, or raw: print the text as generated. --json gives it as "
                   "reasoning_content")


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
    """Prints the decoded text of a growing id list, holding back incomplete UTF-8. With a reasoning
    splitter, the reasoning is printed dimmed (on a terminal) or left out, apart from the answer."""

    DIM, RESET = "\x1b[2m", "\x1b[0m"

    def __init__(self, model, out=sys.stdout, splitter=None, reasoning: str = "show"):
        self.model, self.out = model, out
        self.text = model.tokenizer.stream()
        self.splitter, self.reasoning = splitter, reasoning
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.dimmed = False

    def add(self, ids) -> None:
        self._write(self.text.add(ids))
        self.out.flush()

    def finish(self) -> None:
        self._write(self.text.finish())
        if self.splitter is not None:
            self._show(self.splitter.finish())
        if self.dimmed:
            self.out.write(self.RESET)
            self.dimmed = False
        self.out.flush()

    def _write(self, delta: str) -> None:
        if self.splitter is None:
            self.out.write(delta)
        else:
            self._show(self.splitter.feed(delta))

    def _show(self, parts) -> None:
        for kind, text in parts:
            if kind == "reasoning":
                if self.reasoning == "hide":
                    continue
                if self.tty and not self.dimmed:
                    self.out.write(self.DIM)
                    self.dimmed = True
            elif self.dimmed:
                self.out.write(self.RESET + "\n")
                self.dimmed = False
            self.out.write(text)


def render_block(model, block, mask_id) -> str:
    parts = [MASK_GLYPH if t == mask_id else model.detokenize([t]).replace("\n", "\u21b5") for t in block]
    return "".join(parts)


def splitter_for(model, prompt_text: str, args):
    """A ReasoningSplitter when the model has <think> tokens and --reasoning is not raw, else None."""
    from clover_cpu.chat import ReasoningSplitter, opens_thinking

    if args.reasoning == "raw" or not model.has_thinking_tokens():
        return None
    return ReasoningSplitter(opens_thinking(prompt_text))


def generate(model, prompt, opts, args, out=sys.stdout, cache=None, prompt_text=None):
    """Run one generation, streaming to `out` unless --json; returns (token ids, stats, interrupted)."""
    text = prompt_text if prompt_text is not None else (prompt if isinstance(prompt, str) else "")
    streamer = None if args.json else Streamer(model, out, splitter_for(model, text, args), args.reasoning)
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
    if streamer:
        streamer.finish()
    if args.show_steps and tty:
        sys.stderr.write("\r\x1b[K")
    return ids, stats, interrupted


def reply_fields(model, ids, prompt_text: str, args) -> dict:
    """text (the answer) and, for a reasoning model, reasoning_content, as --json reports them."""
    from clover_cpu.chat import opens_thinking, split_reasoning

    text = model.detokenize(ids)
    if args.reasoning == "raw" or not model.has_thinking_tokens():
        return {"text": text}
    reasoning, answer = split_reasoning(text, opens_thinking(prompt_text))
    return {"text": answer} if reasoning is None else {"text": answer, "reasoning_content": reasoning}


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
        # bytes that are not UTF-8 become U+FFFD, as they do in -p (the tokenizer replaces them)
        raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        prompt = raw.decode("utf-8", errors="replace")
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
        d = {**reply_fields(model, ids, prompt, args), "token_ids": ids}
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
    """Multi-turn chat: the file's chat template (sandboxed, clover_cpu.chat) renders the conversation, and
    control tokens typed in a message stay text. The caches are kept between turns as long as the new
    rendering extends what is already committed. --json: one JSON object per turn on stdout."""
    tpl = model.chat_template
    if tpl is None:
        raise ValueError(f"{model.file.path.name} has no chat template (tokenizer.chat_template); use -p instead")
    kwargs = {} if args.think == "auto" else {"enable_thinking": args.think == "on"}
    messages: list[dict] = []
    cache = model.new_cache()
    history: list[int] = []  # the conversation's token ids so far: prompts and replies as generated
    history_text = ""  # the (marked) rendering that `history` stands for, up to the last reply's end

    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="surrogateescape")  # bytes that are not UTF-8 reach the tokenizer, which replaces them
    print("chat: type a message and press Enter; an empty line or Ctrl-D ends.", file=sys.stderr)
    while True:
        try:
            line = input("> ") if sys.stdin.isatty() else sys.stdin.readline()
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        line = line.rstrip("\n")
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        text = tpl.render(messages, add_generation_prompt=True, mark=True, **kwargs)
        if history and text.startswith(history_text):
            # only the new turn is tokenized: the caches already hold the conversation's committed blocks
            ids = history + tpl.encode(text[len(history_text):])
        else:
            ids = tpl.encode(text)
        if ids[: cache.n] != cache.tokens:
            cache = model.new_cache()
        reused = cache.n
        plain = tpl.unmark(text)
        out, stats, interrupted = generate(model, ids[cache.n :], opts, args, cache=cache, prompt_text=plain)
        fields = reply_fields(model, out, plain, args)
        if args.json:
            d = {"role": "assistant", **fields, "token_ids": out}
            if stats is not None:
                d.update({k: v for k, v in stats.as_dict().items() if not k.startswith("prefill")})
            d.update(reused_tokens=reused, interrupted=interrupted)
            print(json.dumps(d), flush=True)
        else:
            print()
        if interrupted:
            return 130
        reply = {"role": "assistant", "content": fields["text"]}
        if "reasoning_content" in fields:
            reply["reasoning_content"] = fields["reasoning_content"]
        messages.append(reply)
        # what follows the reply in the template's rendering (its end-of-turn marker) joins the history
        raw = model.detokenize(out)
        done = tpl.render(messages, add_generation_prompt=False, mark=True, **kwargs)
        if done.startswith(text + raw):
            history = ids + out + tpl.encode(done[len(text + raw):])
            history_text = done
        else:
            history, history_text = [], ""
        if args.stats and stats is not None:
            print_stats(stats, model)
            print(f"[chat] {reused} tokens of context reused from the caches", file=sys.stderr)
