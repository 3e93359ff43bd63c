"""Block-diffusion decoding (CLOVER.md section 4), with the caches of the runtime.

The schedule (how many tokens a step commits) and the scorer (which ones) are small pure functions;
`decode` is the loop: prefill the prompt's full blocks, then per block run speculative forwards until
no mask is left, commit the block (the commit forward fused with the next block's first step), and
stream every token as soon as all tokens before it are final. With block length 1 and shifted logits
the same loop is plain autoregressive decoding.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

SCORERS = ("prob", "margin", "entropy")
POLICIES = ("threshold", "fixed")
MODES = ("exact", "auto")
MAX_LOGIT_BIAS = 1024  # tokens an Options.logit_bias may name


# ---- sampling and scoring: pure functions over one step's logits ----


def probabilities(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """The distribution a position samples from: softmax(logits / T) restricted to the top-k tokens and
    the smallest set of top-p mass (T = 0 scores with T = 1; `choose` then takes the argmax)."""
    z = logits.astype(np.float64) / (temperature if temperature > 0 else 1.0)
    if top_k and top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[..., -top_k, None]
        z = np.where(z < kth, -np.inf, z)
    z -= z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sp = np.take_along_axis(p, order, axis=-1)
        keep_sorted = np.cumsum(sp, axis=-1) - sp < top_p  # keep until the mass reaches top_p (at least one)
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def choose(p: np.ndarray, temperature: float, rng: np.random.Generator | None) -> np.ndarray:
    """A candidate per row: argmax at temperature 0 (ties: the lowest id), else a sample."""
    if temperature <= 0 or rng is None:
        return np.argmax(p, axis=-1)
    u = rng.random(p.shape[0])[:, None]
    return np.minimum((np.cumsum(p, axis=-1) < u).sum(axis=-1), p.shape[-1] - 1)


def confidence(p: np.ndarray, tokens: np.ndarray, scorer: str = "prob") -> np.ndarray:
    """How sure a position is, in [0, 1]: the candidate's probability, the margin between the two most
    likely tokens, or exp(-entropy)."""
    if scorer == "prob":
        return p[np.arange(len(tokens)), tokens]
    if scorer == "margin":
        top2 = np.sort(np.partition(p, -2, axis=-1)[..., -2:], axis=-1)
        return top2[..., 1] - top2[..., 0]
    if scorer == "entropy":
        with np.errstate(divide="ignore", invalid="ignore"):
            h = -np.sum(np.where(p > 0, p * np.log(p), 0.0), axis=-1)
        return np.exp(-h)
    raise ValueError(f"unknown scorer {scorer!r} (choose from {', '.join(SCORERS)})")


def log_probs(logits: np.ndarray, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """token's log-probability under softmax(logits) (temperature 1), and the `top` most likely tokens with
    theirs, most likely first (ties: the lower id)."""
    z = logits.astype(np.float64)
    z -= z.max()
    lz = z - np.log(np.exp(z).sum())
    best = []
    if top:
        ids = np.argpartition(-lz, top - 1)[:top] if top < lz.size else np.arange(lz.size)
        best = [(int(i), float(lz[i])) for i in sorted(ids.tolist(), key=lambda i: (-lz[i], i))]
    return float(lz[token]), best


def commit_by_threshold(conf: np.ndarray, threshold: float) -> np.ndarray:
    """Indices (into conf) to commit: every position at or above the threshold, and always at least the
    most confident one (the first on ties)."""
    chosen = np.flatnonzero(conf >= threshold)
    if chosen.size == 0 and conf.size:
        chosen = np.array([int(np.argmax(conf))])
    return chosen


def fixed_schedule(n_masked: int, steps: int) -> list[int]:
    """LLaDA's schedule: n_masked tokens spread over `steps` steps, the remainder on the first ones."""
    steps = max(1, min(steps, n_masked)) if n_masked else 1
    base, extra = divmod(n_masked, steps)
    return [base + (1 if s < extra else 0) for s in range(steps)]


def commit_top_k(conf: np.ndarray, k: int) -> np.ndarray:
    """The k most confident positions (LLaDA's low-confidence remasking keeps the rest masked)."""
    return np.sort(np.argsort(-conf, kind="stable")[: max(1, min(k, conf.size))])


# ---- mode auto: the window of each forward ----


class AutoWindow:
    """`--mode auto`'s choice of how many masked positions a forward computes (its window), with reuse.

    A forward with window w computes the block's newly final tokens (they enter the caches with it) and
    the block from its first undecided position up to the w-th; it costs cost(positions, w rows of the
    head) on this machine (clover_cpu.costs) plus the step's own work around it (sampling, streaming: a
    running average of each step's wall time beyond its forward's cost), and commits every candidate
    whose confidence reaches the threshold, at least one. The expected tokens of window w are
    max(1, a_0 + ... + a_{w-1}), where a_j is the running rate at which the j-th candidate of a forward
    reached the threshold in this request (counts decayed by MEMORY per forward; PRIOR with the weight of
    one observation; where an offset was not seen lately, UNSEEN times the rate of the offset before it,
    so a window widens a few positions at a time as the model grows confident, and a window that went
    out of use is tried again once the positions before it promise enough). Each forward takes the
    window with the most expected tokens per second (the smallest on ties): one position where the model
    commits one token per step, wide where it is sure."""

    MEMORY = 0.9
    PRIOR = 0.5
    KNOWN = 0.3  # a single observation counts for about 11 forwards
    UNSEEN = 0.7  # an unseen offset: this share of the one before it

    def __init__(self, cost, block: int):
        self.cost = cost  # clover_cpu.costs.CostCurve
        self.body = cost.body_at(np.arange(2 * block + 1))  # a forward: at most a block's final tokens + a block
        self.head = cost.head_at(np.arange(block + 1))
        self.hits = np.zeros(block)
        self.seen = np.zeros(block)
        self.overhead = 0.0

    def rates(self, n: int) -> np.ndarray:
        """a_0 .. a_{n-1}: each offset's smoothed rate where it was seen lately (decayed count >= KNOWN),
        else UNSEEN times its predecessor's (2 x PRIOR before the first), never above its predecessor's.
        In logs: a_j = min(a_{j-1}, est_j) where known, a_{j-1} x UNSEEN where not; with c_j the sum of
        log UNSEEN over the unknown offsets up to j, log a_j - c_j is a running minimum."""
        known = self.seen[:n] >= self.KNOWN
        est = (self.hits[:n] + self.PRIOR) / (self.seen[:n] + 1.0)
        c = np.cumsum(np.where(known, 0.0, np.log(self.UNSEEN)))
        b = np.minimum.accumulate(np.where(known, np.log(est) - c, np.inf))
        return np.exp(np.minimum(b, np.log(2 * self.PRIOR)) + c)

    def window(self, new_final: int, undecided: list) -> int:
        """The window for a forward that carries `new_final` tokens into the caches, over the block's
        undecided positions (ascending)."""
        n = len(undecided)
        u = np.asarray(undecided)
        seconds = self.body[new_final + u - u[0] + 1] + self.head[1 : n + 1] + self.overhead
        rate = np.maximum(1.0, np.cumsum(self.rates(n))) / seconds
        return int(np.argmax(rate)) + 1  # the first maximum: the smallest window on ties

    def observe(self, reached, seconds: float, positions: int) -> None:
        """After a forward of `positions` positions whose step took `seconds` of wall time: reached[j],
        whether its j-th candidate reached the threshold."""
        n = len(reached)
        forward = self.body[positions] + self.head[n]
        self.overhead = 0.8 * self.overhead + 0.2 * max(0.0, seconds - forward)
        self.hits *= self.MEMORY
        self.seen *= self.MEMORY
        self.hits[:n] += np.asarray(reached, dtype=np.float64)
        self.seen[:n] += 1.0


# ---- options and results ----


PREFILL_CHUNK = 2048  # prompt tokens per prefill forward
MARK_BACK = 4  # decode_steps: the prefill cut (the checkpoint) this many tokens before the prompt's end (as llama-server's)
MARK_MIN = 64  # ... and, where that needs a forward of its own, only at a position past this many tokens


def context_needed(used: int, prompt: int, new: int, block: int) -> int:
    """Context positions decoding `new` tokens after `prompt` ones (the cache holding `used`, a multiple of
    `block`) occupies: a forward spans whole blocks, masks after the last token included, so the block
    the last new token falls in must fit."""
    total = used + prompt + new
    return -(-total // block) * block if new else total



MAX_TOP_LOGPROBS = 20  # (OpenAI's limit for top_logprobs)
MAX_BLOCK_LENGTH = 1024  # every denoising step runs the whole block: larger blocks only cost time


@dataclass
class Options:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    threshold: float | None = None  # None: the file's default (Clover ships 0.95)
    block_length: int | None = None  # None: the file's
    max_steps: int | None = None  # denoising steps per block; None: block length
    policy: str = "threshold"
    scorer: str = "prob"
    stop_at_eos: bool = True
    window: int = 0  # positions per denoising forward: the first `window` masked ones (0: the whole block)
    reuse: bool = False  # approximate: commit each block's final prefix as it forms, no block commit forward
    # exact: the reference decoder (window and reuse as given); auto: reuse, and each forward's window
    # chosen from this machine's cost curve and the request's running acceptance (AutoWindow; approximate)
    mode: str = "exact"
    # None: off; k >= 0: each new token's log-probability under the model (softmax of its logits at the step
    # that decided it, temperature 1), and the k most likely tokens there with theirs (Event.logprobs)
    logprobs: int | None = None
    # token id -> a number added to that token's logits wherever a token is chosen (OpenAI's logit_bias:
    # -100 keeps a token out, +100 all but forces it); the choice and its confidence follow it, the
    # log-probabilities stay the model's (as llama-server b11434 reports them)
    logit_bias: dict | None = None
    # OpenAI's penalties, from -2 to 2: subtracted from a token's logits once if it is among the reply's
    # tokens decided so far (presence), and once per time it is (frequency); the prompt does not count (as
    # in vLLM; llama-server counts the last 64 tokens, the prompt's included)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def validate(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        if self.seed is not None and self.seed < 0:
            raise ValueError("seed must be >= 0")
        if not 0 <= self.temperature < math.inf:
            raise ValueError("temperature must be a finite number >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.threshold is not None and not 0 < self.threshold <= 1:
            raise ValueError("threshold must be in (0, 1]")
        if self.block_length is not None and not 1 <= self.block_length <= MAX_BLOCK_LENGTH:
            raise ValueError(f"block_length must be from 1 to {MAX_BLOCK_LENGTH}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        if self.window < 0:
            raise ValueError("window must be >= 0 (0 = the whole block)")
        if self.window and self.max_steps is not None:
            raise ValueError("max_steps and window do not combine (a window step commits at least one token)")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r} (choose from {', '.join(MODES)})")
        if self.mode == "auto" and (self.window or self.reuse or self.max_steps is not None or self.policy != "threshold"):
            raise ValueError("mode auto chooses the window and reuse itself: leave window, reuse, max_steps and "
                             "policy out")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r} (choose from {', '.join(POLICIES)})")
        if self.scorer not in SCORERS:
            raise ValueError(f"unknown scorer {self.scorer!r} (choose from {', '.join(SCORERS)})")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be from 0 to {MAX_TOP_LOGPROBS}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not -2 <= v <= 2:
                raise ValueError(f"{name} must be a number from -2 to 2")
        if self.logit_bias:
            if len(self.logit_bias) > MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias may name at most {MAX_LOGIT_BIAS} tokens")
            for t, b in self.logit_bias.items():
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
                    raise ValueError(f"logit_bias token ids must be integers >= 0, not {t!r}")
                if isinstance(b, bool) or not isinstance(b, (int, float, np.number)) or not -100 <= b <= 100:
                    raise ValueError(f"logit_bias values must be numbers from -100 to 100 (token {t})")


@dataclass
class Stats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    forwards: int = 0  # decoding forwards, commit forwards included (dInfer's count)
    prefill_tokens: int = 0  # the prompt's whole blocks, run before decoding (the rest heads the first block)
    prefill_seconds: float = 0.0
    seconds: float = 0.0  # decoding time, after the prefill
    experts_touched: list = field(default_factory=list)

    @property
    def tokens_per_forward(self) -> float:
        return self.generated_tokens / self.forwards if self.forwards else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_tokens and self.prefill_seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens, "forwards": self.forwards,
            "tokens_per_forward": self.tokens_per_forward, "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second, "prefill_tokens": self.prefill_tokens,
            "prefill_seconds": self.prefill_seconds,
            "prefill_tokens_per_second": self.prefill_tokens_per_second,
        }


@dataclass
class Event:
    """tokens: ids that just became final (a left-contiguous continuation of what came before), with
    Options.logprobs their `logprobs`: per token (log-probability, [(id, log-probability) of the most likely
    tokens, most likely first]); block: the current block (mask id where undecided), for --show-steps;
    prefill: `progress` = (prompt tokens read, prompt tokens to read), after each chunk of a prompt longer
    than one chunk; done: the end."""

    kind: str  # "tokens", "step", "prefill" or "done"
    tokens: list[int] = field(default_factory=list)
    logprobs: list | None = None
    block: list[int] = field(default_factory=list)
    stats: Stats | None = None
    progress: tuple[int, int] | None = None


@dataclass
class Forward:
    """A forward the decoding loop asks its driver for: model.run(cache, tokens, commit=commit,
    block=block) and the output head on `rows` of the span's final hidden states. The driver sends
    back the logits [len(rows), vocab] (None where rows is empty). One sequence's driver runs it alone
    (`decode`); the server's scheduler runs the Forwards of several sequences as one batch."""

    cache: object
    tokens: list
    commit: int
    block: int | None
    rows: list


def span_rows(rows) -> tuple[np.ndarray, np.ndarray]:
    """A Forward's rows as Model.run takes them (ascending, each once), and where each of `rows` is
    among them."""
    r = np.asarray(rows, dtype=np.int64).reshape(-1)
    srt = np.unique(r)
    return srt, np.searchsorted(srt, r)


def run_forward(model, f: Forward):
    """What a driver answers to one Forward, run alone (the last layer's output only for its rows)."""
    srt, where = span_rows(f.rows)
    h = model.run(f.cache, f.tokens, commit=f.commit, block=f.block, logits=False, rows=srt)
    return model.logits(np.ascontiguousarray(h[where])) if f.rows else None


# ---- the loop ----


def block_grid(config, opts: Options) -> tuple[int, int | None]:
    """The decoder's block length B for these options and the attention it commits with: `block` of
    Model.run (B for a diffusion file; None, causal, for an autoregressive one, whatever B is)."""
    B = opts.block_length or config.block_length
    return B, (B if config.is_diffusion else None)


def first_user_turn(model, prompt: list[int], context: int) -> int:
    """Where the first user message's content begins in `prompt`: the end of the first run of
    Model.user_turn_ids in it. 0: nowhere, or the model's chat template does not show it, or the prompt
    is too short for a checkpoint to pay, or it continues a context (`context` committed tokens: a
    conversation's next turn, whose first user message the context holds)."""
    if context or len(prompt) < MARK_MIN:
        return 0  # (and the template is not rendered for a short prompt)
    opener = model.user_turn_ids
    if not opener or len(prompt) < len(opener):
        return 0
    ids = np.asarray(prompt, dtype=np.int64)
    for i in np.flatnonzero(ids[: len(ids) - len(opener) + 1] == opener[0]):
        if prompt[i : i + len(opener)] == opener:
            return int(i) + len(opener)
    return 0


def decode(model, prompt_ids, opts: Options, cache=None, *, mark: bool = False):
    """Generate after prompt_ids; yields Events. `cache` may hold an earlier conversation (its committed
    length must be a multiple of the block length); it is extended in place (mark: decode_steps)."""
    steps = decode_steps(model, prompt_ids, opts, cache, mark=mark)
    msg = next(steps)
    while True:
        if isinstance(msg, Forward):
            out = run_forward(model, msg)
        else:
            yield msg
            out = None
        try:
            msg = steps.send(out)
        except StopIteration:
            return


def decode_steps(model, prompt_ids, opts: Options, cache=None, *, mark: bool = False):
    """The decoding loop as a coroutine: yields Events, and Forwards whose logits the driver sends back
    (see Forward). Checks its arguments before the first yield. The prompt's prefill ends a forward
    MARK_BACK tokens before the prompt's end and where its first user message begins (first_user_turn),
    both on the block grid; mark=True checkpoints the cache there (Cache.mark), where a later request that
    shares the prompt but not what came after it (a chat's next turn, the same prompt again, another
    conversation with the same system prompt) can resume. (The cuts are made either way, so that a request
    decodes the same with and without checkpoints: a forward over fewer tokens may round differently.)"""
    c = model.config
    opts.validate()
    B, block_mode = block_grid(c, opts)
    threshold = opts.threshold if opts.threshold is not None else c.threshold
    max_steps = opts.max_steps or B
    shift = c.shift_logits
    mask = c.mask_token_id if c.mask_token_id is not None else 0
    eos = c.eos_token_id if opts.stop_at_eos else None
    rng = np.random.default_rng(opts.seed) if opts.temperature > 0 else None
    bias = None
    if opts.logit_bias:
        if max(opts.logit_bias) >= c.vocab_size:
            raise ValueError(f"logit_bias token ids must be below the vocabulary size, {c.vocab_size}")
        bias = (np.fromiter(opts.logit_bias, np.int64), np.fromiter(opts.logit_bias.values(), np.float32))
    # presence / frequency penalties: what each token's logits lose, grown as the reply decides tokens
    penalty = np.zeros(c.vocab_size, np.float32) if opts.presence_penalty or opts.frequency_penalty else None
    decided: set[int] = set()
    prompt = [int(t) for t in prompt_ids]
    if not c.is_diffusion and not shift:
        raise ValueError("an autoregressive file needs shifted logits")
    if c.is_diffusion and mask is None:
        raise ValueError("a diffusion file needs a mask token")
    cache = cache if cache is not None else model.new_cache()
    if cache.n % B:
        raise ValueError("the cache must end on a block boundary")
    if cache.n and cache.block != block_mode:
        grid = lambda b: f"blocks of {b}" if b else "causal attention"  # noqa: E731
        raise ValueError(f"the cache was written with {grid(cache.block)}, not {grid(block_mode)}")
    end = context_needed(cache.n, len(prompt), opts.max_new_tokens, B)
    if end > model.ctx_len:
        rounded = end > cache.n + len(prompt) + opts.max_new_tokens
        blocks = f"; decoding runs whole blocks of {B}, to position {end}" if rounded else ""
        raise ValueError(f"prompt ({len(prompt)} tokens) and {opts.max_new_tokens} new tokens do not fit the "
                         f"context of {model.ctx_len} ({cache.n} already used{blocks})")
    if not prompt and cache.n == 0 and shift:
        raise ValueError("the prompt is empty")
    if opts.reuse and shift:
        raise ValueError("reuse needs a diffusion file (unshifted logits); autoregressive files decode exactly")
    stats = Stats(prompt_tokens=len(prompt))
    # mode auto: reuse, and a window per forward (AutoWindow); files with shifted logits (autoregressive
    # ones included) decode exactly. The cost curve is measured (once per file and machine) before the clock.
    chooser = None
    if opts.mode == "auto" and not shift:
        chooser = AutoWindow(model.forward_costs(B), B)

    # prefill the prompt's full blocks; the tail heads the first block to decode
    t0 = time.perf_counter()
    cache.block = block_mode
    n_full = (len(prompt) // B) * B
    # the checkpoint: on the grid, MARK_BACK tokens before the prompt's end; where that needs a forward of
    # its own (it is not where the prompt's full blocks end), only past MARK_MIN tokens of context (a short
    # context costs little to read again)
    at = (len(prompt) - MARK_BACK) // B * B
    if at <= 0 or (at < n_full and cache.n + at < MARK_MIN):
        at = 0
    # and, reading a conversation from its start, where its first user message begins (its system prompt
    # and tools end there, which other conversations may share: the engine starts them from this
    # checkpoint), on the grid, before `at`
    cuts_at = {at} - {0}
    user = first_user_turn(model, prompt, cache.n) // B * B
    if MARK_MIN <= user <= n_full and user < (at or n_full + 1):
        cuts_at.add(user)
    carry = None  # logits of the last committed position (predicts the next token when shift)
    if n_full:
        # in chunks (whole blocks) so a long prompt's activations stay small; the caches make it exact
        step = max(B, PREFILL_CHUNK // B * B)
        cuts = sorted({*range(step, n_full, step), n_full} | cuts_at)
        s0 = 0
        for s1 in cuts:
            chunk = prompt[s0:s1]
            # only the last position's logits are ever used, and only with shifted logits
            last = shift and s1 == n_full
            out = yield Forward(cache, chunk, len(chunk), block_mode, [len(chunk) - 1] if last else [])
            if last:
                carry = out[0]
            if s1 in cuts_at and mark:
                cache.mark()
            if n_full > step:  # a long prompt: how far it has been read (the CLI shows it)
                yield Event("prefill", progress=(s1, n_full))
            s0 = s1
    stats.prefill_tokens = n_full
    stats.prefill_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    head = prompt[n_full:]
    if shift and carry is None and not head:
        # nothing predicts the first token: run the prompt's last token again (cache ends on a block)
        raise ValueError("with shifted logits the prompt must not be empty")

    # window: each denoising forward computes the block only up to its w-th masked position, and only
    # those w positions are candidates (the masks after them are left out of the forward): a forward
    # costs what its positions cost, which on a CPU grows with them (bench/NOTES.md, the cost curve).
    # It changes what the model sees, so its output can differ from whole-block decoding.
    w = opts.window if 0 < opts.window < B else 0
    # reuse (opt-in, approximate): a block's left-contiguous final tokens go into the caches with the
    # next forward (commit=k) instead of the whole block being recomputed clean once it is done; their
    # keys/values and the GDN states keep what the model computed while later positions were still
    # masks. Each forward is then [newly final tokens | the block's rest up to the window], and a block
    # needs no commit forward of its own. Output agreement with exact decoding: bench/NOTES.md.
    reuse = opts.reuse or chooser is not None  # (not with shifted logits: checked above)
    tail: list[int] = []  # final tokens of the previous block not yet in the caches (reuse)

    V = c.vocab_size

    def predict(tokens, commit, cands, first=0):
        """model.run over `tokens` (token row r is block position first + r) with the output head only
        on the rows that predict the block positions `cands`: their logits, one row per candidate. With
        shifted logits position u is predicted by the row before it, and the row before the span is
        `carry`. The head is a large share of a forward (248K x 2048 on Clover-35B): a step never needs
        the rows of positions already decided, nor those of the committed half of a fused commit."""
        rows = [u - first - (1 if shift else 0) for u in cands]
        out = np.empty((len(cands), V), np.float32)
        inside = [i for i, r in enumerate(rows) if r >= 0]
        commit = len(tokens) if commit is True else int(commit)
        got = yield Forward(cache, tokens, commit, block_mode, [rows[i] for i in inside])
        if inside:
            out[inside] = got
        for i, r in enumerate(rows):
            if r < 0:
                out[i] = carry
        return out

    def lp_of(lps, first, n):
        return [lps[u] for u in range(first, first + n)] if opts.logprobs is not None else None

    remaining = opts.max_new_tokens
    pending = None  # logits of the next block's first step, from a fused commit forward
    while remaining > 0:
        span = head + [mask] * (B - len(head))
        budget = min(B - len(head), remaining)  # positions of this block we will keep
        undecided = list(range(len(head), len(head) + budget))
        schedule = fixed_schedule(len(undecided), max_steps) if opts.policy == "fixed" else None
        emitted = len(head)  # block positions already streamed (the prompt tail counts as streamed)
        lps: dict[int, tuple] = {}  # Options.logprobs: block position -> log_probs() of its token
        in_cache = 0  # block positions committed to the caches (reuse)
        step = 0
        while undecided and (step < max_steps or w or reuse):
            if chooser is not None:
                w = chooser.window(len(tail) + undecided[0] - in_cache, undecided)
                step_start = time.perf_counter()
                positions = len(tail) + undecided[w - 1] - in_cache + 1
            cands = undecided[:w] if w else undecided
            if pending is not None:  # from the fused commit: this block's first positions
                rows, pending = pending[: len(cands)], None
            elif reuse:
                f = undecided[0]  # the final prefix ends here
                new_final = tail + span[in_cache:f]
                rows = yield from predict(new_final + span[f : cands[-1] + 1], len(new_final), cands,
                                          f - len(new_final))
                stats.forwards += 1
                in_cache, tail = f, []
            elif shift and cands == [0]:
                rows = carry[None]  # position 0 is predicted by `carry` alone: no forward
            else:
                end = cands[-1] + (0 if shift else 1) if w else B
                rows = yield from predict(span[: max(1, end)], False, cands)
                stats.forwards += 1
            raw = rows  # the model's logits (the log-probabilities are reported from them)
            if bias is not None or penalty is not None:
                rows = rows.copy()  # (a fused commit's pending rows, `carry`: not changed in place)
            if bias is not None:
                rows[:, bias[0]] += bias[1]
            if penalty is not None:
                rows -= penalty
            p = probabilities(rows, opts.temperature, opts.top_k, opts.top_p)
            cand = choose(p, opts.temperature, rng)
            conf = confidence(p, cand, opts.scorer)
            if schedule is not None:
                pick = commit_top_k(conf, schedule[min(step, len(schedule) - 1)])
            else:
                pick = commit_by_threshold(conf, threshold)
            if step == max_steps - 1 and not w:
                pick = np.arange(len(undecided))  # out of steps: commit every remaining candidate
            for j in pick:
                t = int(cand[j])
                span[cands[j]] = t
                if penalty is not None:
                    penalty[t] += opts.frequency_penalty + (0.0 if t in decided else opts.presence_penalty)
                    decided.add(t)
                if opts.logprobs is not None:
                    lps[cands[j]] = log_probs(raw[j], t, opts.logprobs)
            picked = {cands[j] for j in pick.tolist()}
            undecided = [u for u in undecided if u not in picked]
            step += 1
            yield Event("step", block=list(span))
            # stream the left-contiguous final prefix; stop at EOS with no mask before it
            new, first_new = [], emitted
            while emitted < len(head) + budget and emitted not in undecided:
                new.append(span[emitted])
                emitted += 1
            if eos is not None and eos in new:
                new = new[: new.index(eos)]
                stats.generated_tokens += len(new)
                if new:
                    yield Event("tokens", tokens=new, logprobs=lp_of(lps, first_new, len(new)))
                stats.seconds = time.perf_counter() - t0
                yield Event("done", stats=stats)
                return
            if new:
                stats.generated_tokens += len(new)
                yield Event("tokens", tokens=new, logprobs=lp_of(lps, first_new, len(new)))
            if chooser is not None:
                chooser.observe(conf >= threshold, time.perf_counter() - step_start, positions)
        remaining -= budget
        if remaining <= 0:
            break
        if reuse:  # the block's last final tokens go in with the next block's first forward
            tail, head = span[in_cache:], []
            continue
        # commit the finished block, fused with the first denoising step of the next one (unless that
        # step needs no forward: one-token blocks with shifted logits, i.e. autoregressive decoding)
        fuse = not (shift and B == 1)
        nxt = (w or B) if fuse else 0
        # logits for the next block's first step (for one-token AR blocks, only what predicts position 0)
        out = yield from predict(span + [mask] * nxt, B, list(range(nxt)) or [0], -B)
        stats.forwards += 1
        if shift:
            carry = out[0]  # the block's last row: it predicts the next block's position 0
        pending = out if fuse else None
        head = []
    stats.seconds = time.perf_counter() - t0
    yield Event("done", stats=stats)

