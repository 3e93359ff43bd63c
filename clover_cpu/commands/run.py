"""`clover-cpu run`: generate text with a Clover (block diffusion) or Qwen3.5-MoE (autoregressive) GGUF."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
import unicodedata
from pathlib import Path

MASK_GLYPH = "\u2591"  # light shade: an undecided position in --show-steps


def shipped_model() -> Path | None:
    import clover_cpu

    try:
        return clover_cpu.shipped_model()
    except FileNotFoundError:
        return None


def threads_arg(value: str) -> int:
    """argparse type for --threads: 1 to the CPUs this process may use (clover_cpu.parse_threads)."""
    import clover_cpu

    try:
        return clover_cpu.parse_threads(value, "--threads")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--threads ")) from None


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
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract this (-2 to 2) from the logits of every token the reply already has (default 0)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract this (-2 to 2) from a token's logits once per time the reply has it (default 0)")
    p.add_argument("--logit-bias", metavar="ID=BIAS", action="append", default=[],
                   help="add BIAS (-100 to 100) to token ID's logits wherever a token is chosen: -100 keeps the "
                        "token out, 100 all but forces it (repeatable; --json shows a reply's token ids)")
    p.add_argument("--threshold", type=float, default=None,
                   help="confidence needed to commit a position, in (0, 1] (default: the file's own, "
                   "clover.diffusion.threshold: 0.9 in the shipped model; `clover-cpu info FILE` shows it). Clover "
                   "files only: autoregressive files decode one token per forward")
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
    p.add_argument("--mode", choices=["exact", "auto"], default="exact",
                   help="exact (default): the reference decoder, every step over the whole block (or --window). "
                   "auto: approximate and faster on a CPU: --reuse, and each forward computes as many masked "
                   "positions as pays on this machine, from the model's forward costs (measured once per file "
                   "and machine, kept in ~/.cache/clover-cpu) and how many tokens the model has been committing "
                   "per step: about one where it is unsure, more where it is confident. Output can differ from "
                   "exact decoding")
    p.add_argument("--policy", choices=["threshold", "fixed"], default="threshold",
                   help="threshold: commit every confident position (Fast-dLLM/LLaDA2); fixed: LLaDA's schedule, "
                   "the block spread evenly over --max-steps steps")
    p.add_argument("--scorer", choices=["prob", "margin", "entropy"], default="prob",
                   help="confidence of a position: candidate probability (default), top-2 margin, exp(-entropy)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--threads", type=threads_arg, default=None,
                   help="threads, from 1 to the CPUs available (default: one per physical core)")
    p.add_argument("--ctx-len", type=int, default=None, help="context length to allow (default: the model's)")
    p.add_argument("--kv-type", choices=["f16", "q8_0", "f32"], default="f16",
                   help="attention cache element type (default f16; q8_0 halves its memory at long contexts)")
    p.add_argument("--prefetch", choices=["auto", "on", "off"], default="auto",
                   help="routed experts whose weights are not in memory are read from the disk together, "
                   "ahead of use: auto (default) does it when the model file is larger than the free memory "
                   "(it cannot stay in the page cache), on always, off leaves it to page faults")
    p.add_argument("--repack", choices=["auto", "on", "off"], default="auto",
                   help="copy layer weights at load into a layout of 16 rows per group that this CPU's kernels "
                   "multiply faster: q4_k, iq4_xs, iq4_nl, mxfp4, iq3_xxs and iq3_s on AVX2, AVX-512 and NEON "
                   "dot-product; q3_k on AVX2 and AVX-512; q2_k on AVX-512; q5_k and q6_k on AVX2 (0-4%% more "
                   "memory, iq3_xxs 41%% and "
                   "iq3_s 25%% more, the file's pages released). auto (default): where the CPU has those kernels "
                   "and the model takes at most half the free memory; on: whatever its size (an error without those "
                   "kernels); off: the file's layout")
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
    """The decoding options of the flags, checked before the model loads: decode.Options.validate (the one
    set of rules the Python API and the server also go through), its messages naming the flags."""
    from clover_cpu.decode import Options

    if args.ctx_len is not None and args.ctx_len < 1:
        raise ValueError("--ctx-len must be >= 1")
    opts = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                seed=args.seed, threshold=args.threshold, block_length=args.block_length, max_steps=args.max_steps,
                policy=args.policy, scorer=args.scorer, stop_at_eos=not args.ignore_eos, window=args.window,
                reuse=args.reuse, mode=args.mode, presence_penalty=args.presence_penalty,
                frequency_penalty=args.frequency_penalty)
    if args.logit_bias:
        opts["logit_bias"] = dict(_bias_arg(a) for a in args.logit_bias)
    try:
        Options(**opts).validate()
    except ValueError as e:
        raise ValueError(_OPTION_NAME.sub(lambda m: "--" + m.group(1).replace("_", "-"), str(e))) from None
    return opts


def _bias_arg(text: str) -> tuple[int, float]:
    """--logit-bias ID=BIAS (llama.cpp's ID+BIAS / ID-BIAS too)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:=\s*([+-]?[\d.]+(?:[eE][+-]?\d+)?)|([+-][\d.]+(?:[eE][+-]?\d+)?))\s*", text)
    try:
        return int(m.group(1)), float(m.group(2) or m.group(3))
    except (AttributeError, ValueError):
        raise ValueError(f"--logit-bias {text!r}: give TOKEN_ID=BIAS, e.g. --logit-bias 42=-100") from None


_OPTION_NAME = re.compile(r"\b(presence_penalty|frequency_penalty|logit_bias|max_new_tokens|seed|temperature|top_k|top_p|threshold|block_length|max_steps|window|reuse|mode|policy)\b")


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


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _clip_tail(text: str, columns: int) -> str:
    """The end of `text` that fits `columns` terminal cells (wide characters take two)."""
    out, used = [], 0
    for ch in reversed(text):
        w = 2 if unicodedata.east_asian_width(ch) in "WF" else 0 if unicodedata.combining(ch) else 1
        if used + w > columns:
            break
        out.append(ch)
        used += w
    return "".join(reversed(out))


class LineHold:
    """A text stream that writes only whole lines to `out` and holds the line being written."""

    def __init__(self, out):
        self.out, self.partial = out, ""

    def write(self, text: str) -> None:
        text = self.partial + text
        cut = text.rfind("\n") + 1
        if cut:
            self.out.write(text[:cut])
        self.partial = text[cut:]

    def flush(self) -> None:
        self.out.flush()

    def isatty(self) -> bool:
        return self.out.isatty()


class StepView:
    """--show-steps where the text and the steps share one terminal (stdout and stderr both on it): the
    text is printed in whole lines, and the line being written, followed by the current block (undecided
    positions as \u2591), is a status line that each step redraws, so the steps never overwrite text.
    Elsewhere the block goes to stderr: redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, model, out, shared: bool):
        self.model, self.shared = model, shared
        self.tty = sys.stderr.isatty()
        self.held = LineHold(out) if shared else None
        self.drawn = False

    def stream(self, out):
        return self.held if self.shared else out

    def clear(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.drawn = False

    def step(self, block) -> None:
        line = render_block(self.model, block, self.model.config.mask_token_id)
        if not self.tty:
            sys.stderr.write(f"[block] {line}\n")
        else:
            head = _ANSI.sub("", self.held.partial) if self.shared else "[block] "
            if self.shared:
                sys.stdout.flush()
            visible = _clip_tail(head + line, shutil.get_terminal_size((80, 24)).columns - 1)
            cut = len(visible) - min(len(line), len(visible))  # the block itself in reverse video
            sys.stderr.write(f"\r\x1b[K{visible[:cut]}\x1b[7m{visible[cut:]}\x1b[0m")
            self.drawn = True
        sys.stderr.flush()

    def finish(self, out) -> None:
        self.clear()
        if self.shared and self.held.partial:
            out.write(self.held.partial)
            self.held.partial = ""
        out.flush()


def splitter_for(model, prompt_text: str, args):
    """A ReasoningSplitter when the model has <think> tokens and --reasoning is not raw, else None."""
    from clover_cpu.chat import ReasoningSplitter, opens_thinking

    if args.reasoning == "raw" or not model.has_thinking_tokens():
        return None
    return ReasoningSplitter(opens_thinking(prompt_text))


def generate(model, prompt, opts, args, out=sys.stdout, cache=None, prompt_text=None, mark=False):
    """Run one generation, streaming to `out` unless --json; returns (token ids, stats, interrupted).
    Interrupted (Ctrl-C), the stats hold what is known: the prompt's and the generated tokens and the
    seconds so far (forwards is 0)."""
    from clover_cpu.decode import Stats

    text = prompt_text if prompt_text is not None else (prompt if isinstance(prompt, str) else "")
    prompt_ids = model.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    view = None
    if args.show_steps:
        shared = not args.json and out.isatty() and sys.stderr.isatty()
        view = StepView(model, out, shared)
    sink = view.stream(out) if view else out
    streamer = None if args.json else Streamer(model, sink, splitter_for(model, text, args), args.reasoning)
    ids, stats, interrupted = [], None, False
    t0 = time.perf_counter()
    # a long prompt's progress, on a terminal: one line on stderr, redrawn per chunk, gone when it is read
    progress = not args.json and sys.stderr.isatty()
    shown = False  # a progress line is on the terminal now
    try:
        for ev in model.generate(prompt_ids, cache=cache, mark=mark, **opts):
            if ev.kind == "prefill" and progress:
                done, total = ev.progress
                rate = done / max(time.perf_counter() - t0, 1e-9)
                shown = done < total
                sys.stderr.write(f"\r\x1b[K[prompt] {done} / {total} tokens ({100 * done // total}%, {rate:.1f} tok/s)"
                                 if shown else "\r\x1b[K")
                sys.stderr.flush()
            elif ev.kind == "tokens":
                ids.extend(ev.tokens)
                if streamer:
                    if view:
                        view.clear()
                    streamer.add(ev.tokens)
            elif ev.kind == "step" and view:
                view.step(ev.block)
            elif ev.kind == "done":
                stats = ev.stats
    except KeyboardInterrupt:
        if shown:  # (Ctrl-C while the prompt was read: the line goes, "[interrupted]" follows)
            sys.stderr.write("\r\x1b[K")
        interrupted = True
        stats = Stats(prompt_tokens=len(prompt_ids), generated_tokens=len(ids), seconds=time.perf_counter() - t0)
    if view:
        view.clear()
    if streamer:
        streamer.finish()
    if view:
        view.finish(out)
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
    if stats.prefill_tokens:
        prompt = (f"prompt {stats.prompt_tokens} tokens ({stats.prefill_tokens} prefilled at "
                  f"{stats.prefill_tokens_per_second:.1f} tok/s")
        rest = stats.prompt_tokens - stats.prefill_tokens
        prompt += f", {rest} decoded with the first block)" if rest else ")"
    else:  # shorter than a block: the whole prompt heads the first block and has no prefill of its own
        prompt = f"prompt {stats.prompt_tokens} tokens (decoded with the first block)"
    print(f"\n[stats] {prompt}, "
          f"generated {stats.generated_tokens} tokens in {stats.seconds:.2f} s ({stats.tokens_per_second:.2f} tok/s), "
          f"{stats.forwards} forwards, {stats.tokens_per_forward:.2f} tokens/forward, "
          f"{info['isa']} x {info['threads']} threads", file=file)


MAX_PROMPT_BYTES = 16 << 20  # far more text than a 128K-token context holds (bytes of -f, characters of a chat line)


def read_prompt_file(name: str) -> bytes:
    """-f FILE (or - for stdin), at most MAX_PROMPT_BYTES: an endless source (/dev/zero, a pipe that never
    ends) is refused instead of filling the memory."""
    with (open(sys.stdin.fileno(), "rb", closefd=False) if name == "-" else open(name, "rb")) as f:
        raw = f.read(MAX_PROMPT_BYTES + 1)
    if len(raw) > MAX_PROMPT_BYTES:
        raise ValueError(f"the prompt {'on stdin' if name == '-' else name} is longer than "
                         f"{MAX_PROMPT_BYTES >> 20} MiB (more than any context holds)")
    return raw


def json_stats(stats, interrupted: bool) -> dict:
    """The statistics --json reports: all of them, or after Ctrl-C what is known (prompt_tokens,
    generated_tokens, seconds, tokens_per_second)."""
    if stats is None:
        return {}
    d = {k: v for k, v in stats.as_dict().items() if not k.startswith("prefill")}
    if interrupted:
        d = {k: d[k] for k in ("prompt_tokens", "generated_tokens", "seconds", "tokens_per_second")}
    return d


def warn_unused(model, args) -> None:
    """A one-line note for diffusion flags given with an autoregressive file (they change nothing there)."""
    if model.config.is_diffusion:
        return
    given = [f for f, v in (("--threshold", args.threshold), ("--block-length", args.block_length),
                            ("--max-steps", args.max_steps), ("--window", args.window or None),
                            ("--reuse", args.reuse or None), ("--mode", args.mode if args.mode != "exact" else None),
                            ("--show-steps", args.show_steps or None))
             if v is not None]
    if given:
        print(f"clover-cpu run: note: {model.file.path.name} decodes autoregressively (one token per forward); "
              f"{', '.join(given)} only apply to Clover (diffusion) files", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    import clover_cpu

    opts = options(args)
    path = args.model or shipped_model()
    if path is None:
        raise ValueError("no model: pass -m MODEL.gguf (this installation ships none)")
    if args.file:
        # bytes that are not UTF-8 become U+FFFD, as they do in -p (the tokenizer replaces them)
        raw = read_prompt_file(args.file)
        prompt = raw.decode("utf-8", errors="replace")
    else:
        prompt = args.prompt
    t = time.perf_counter()
    model = clover_cpu.load(path, threads=args.threads, ctx_len=args.ctx_len, kv_type=args.kv_type,
                            prefetch=args.prefetch, repack=args.repack)
    load_s = time.perf_counter() - t
    warn_unused(model, args)
    if args.chat:
        return chat(model, opts, args)
    ids, stats, interrupted = generate(model, prompt, opts, args)
    if args.json:
        info = clover_cpu.system_info()
        d = {**reply_fields(model, ids, prompt, args), "token_ids": ids, **json_stats(stats, interrupted)}
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
    rendering extends what is already committed, else back to a checkpoint before the last prompt's end.
    --json: one JSON object per turn on stdout."""
    tpl = model.chat_template
    if tpl is None:
        name = model.file.path.name
        shipped = shipped_model()
        if shipped is not None and Path(model.file.path).resolve() == shipped.resolve():
            raise ValueError(f"{name}, the model shipped in the package, is a small code-completion model with no "
                             "chat template: give it code to continue with -p (e.g. -p \"def fibonacci(n):\"), "
                             "or chat with a converted Clover or Qwen3.5-MoE file: -m FILE --chat")
        raise ValueError(f"{name} has no chat template (tokenizer.chat_template), so it cannot chat: continue "
                         "text with -p or -f, or convert a checkpoint whose tokenizer_config.json has one")
    from clover_cpu.decode import Options, block_grid

    kwargs = {} if args.think == "auto" else {"enable_thinking": args.think == "on"}
    messages: list[dict] = []
    cache = model.new_cache()
    B, block = block_grid(model.config, Options(**opts))
    history: list[int] = []  # the conversation's token ids so far: prompts and replies as generated
    history_text = ""  # the (marked) rendering that `history` stands for, up to the last reply's end

    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="surrogateescape")  # bytes that are not UTF-8 reach the tokenizer, which replaces them
    print("chat: type a message and press Enter; an empty line or Ctrl-D ends.", file=sys.stderr)
    while True:
        try:
            line = input("> ") if sys.stdin.isatty() else sys.stdin.readline(MAX_PROMPT_BYTES + 1)
            if len(line) > MAX_PROMPT_BYTES:
                raise ValueError(f"a chat message is longer than {MAX_PROMPT_BYTES >> 20} Mi characters (more than "
                                 "any context holds)")
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
        # all the caches hold, or, where the rendering changed what came before (a template that drops an
        # earlier turn's reasoning), their checkpoint a few tokens before the last prompt's end
        cache.rewind(cache.reusable(ids, block, B, leave_last=model.config.shift_logits))
        reused = cache.n
        plain = tpl.unmark(text)
        out, stats, interrupted = generate(model, ids[cache.n :], opts, args, cache=cache, prompt_text=plain,
                                           mark=True)
        fields = reply_fields(model, out, plain, args)
        if args.json:
            d = {"role": "assistant", **fields, "token_ids": out, **json_stats(stats, interrupted)}
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
