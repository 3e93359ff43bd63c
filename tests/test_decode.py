"""Block-diffusion decoding: the pure policies, and the cached loop against a slow reference decoder."""

import json

import numpy as np
import pytest

import clover_cpu
from clover_cpu.convert.hf import convert
from clover_cpu.convert.synthetic import write_random_checkpoint
from clover_cpu.decode import (Options, choose, commit_by_threshold, commit_top_k, confidence, decode,
                               fixed_schedule, probabilities)

# ---- policies ----


def test_threshold_commits_at_least_one():
    conf = np.array([0.2, 0.97, 0.5, 0.96])
    assert commit_by_threshold(conf, 0.95).tolist() == [1, 3]
    assert commit_by_threshold(conf, 0.99).tolist() == [1]  # none pass: the most confident
    assert commit_by_threshold(np.array([0.3, 0.3]), 0.9).tolist() == [0]  # ties: the first
    assert commit_by_threshold(conf, 1.0).tolist() == [1]


def test_fixed_schedule_and_top_k():
    assert fixed_schedule(32, 32) == [1] * 32
    assert fixed_schedule(10, 4) == [3, 3, 2, 2]
    assert sum(fixed_schedule(7, 3)) == 7
    assert fixed_schedule(3, 8) == [1, 1, 1]
    assert commit_top_k(np.array([0.1, 0.9, 0.5, 0.9]), 2).tolist() == [1, 3]


def test_scorers():
    p = np.array([[0.7, 0.2, 0.1], [1 / 3, 1 / 3, 1 / 3]])
    tok = np.array([0, 2])
    np.testing.assert_allclose(confidence(p, tok, "prob"), [0.7, 1 / 3])
    np.testing.assert_allclose(confidence(p, tok, "margin"), [0.5, 0.0], atol=1e-12)
    h = -(0.7 * np.log(0.7) + 0.2 * np.log(0.2) + 0.1 * np.log(0.1))
    np.testing.assert_allclose(confidence(p, tok, "entropy"), [np.exp(-h), 1 / 3])
    assert confidence(np.array([[1.0, 0.0]]), np.array([0]), "entropy")[0] == 1.0
    with pytest.raises(ValueError):
        confidence(p, tok, "vibes")


def test_sampling():
    logits = np.array([[2.0, 1.0, 0.0, -1.0]])
    assert choose(probabilities(logits, 0.0), 0.0, None).tolist() == [0]
    assert choose(probabilities(np.array([[1.0, 1.0]]), 0.0), 0.0, None).tolist() == [0]  # argmax ties: lowest id
    p = probabilities(logits, 1.0, top_k=2)
    assert p[0, 2] == 0 and p[0, 3] == 0 and abs(p.sum() - 1) < 1e-12
    p = probabilities(logits, 1.0, top_p=0.5)
    assert p[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    rng = np.random.default_rng(0)
    draws = [int(choose(probabilities(logits, 1.0), 1.0, rng)[0]) for _ in range(2000)]
    freq = np.bincount(draws, minlength=4) / 2000
    np.testing.assert_allclose(freq, probabilities(logits, 1.0)[0], atol=0.03)


# ---- the loop ----


@pytest.fixture(scope="module")
def clover(tmp_path_factory):
    d = tmp_path_factory.mktemp("clover")
    write_random_checkpoint(d / "hf", model_type="clover", seed=7, dtype="f32", std=0.2,
                            overrides={"block_length": 4})
    convert(d / "hf", d / "m.gguf", out_type="f32", log=lambda s: None, progress=False)
    return clover_cpu.load(d / "m.gguf")


def reference_decode(model, prompt, opts):
    """Obviously correct and slow: every step recomputes the whole sequence from scratch. With a window
    w (unshifted logits), a step computes the block only up to its w-th masked position and those w are
    the candidates, with no step limit (every step commits at least one)."""
    c = model.config
    B = opts.block_length or c.block_length
    thr = opts.threshold if opts.threshold is not None else c.threshold
    w = opts.window if 0 < opts.window < B else 0
    steps = opts.max_steps or B
    seq = list(prompt)
    start = (len(prompt) // B) * B
    out = []
    while len(out) < opts.max_new_tokens:
        head = seq[start:]
        budget = min(B - len(head), opts.max_new_tokens - len(out))
        block = head + [c.mask_token_id] * (B - len(head))
        todo = list(range(len(head), len(head) + budget))
        step = 0
        while todo and (w or step < steps):
            cands = todo[:w] if w else todo
            end = cands[-1] + 1 if w else B
            full = model.run(model.new_cache(), seq[:start] + block[:end], commit=False, block=B)
            # row j predicts block position j (or, with shifted logits, the row before it does)
            if c.shift_logits:  # position 0 of the first block is always prompt when start == 0
                logits = np.concatenate([full[start - 1 : start] if start else full[:1] * 0, full[start : start + B - 1]])
            else:
                logits = full[start:]
            p = probabilities(logits[cands], 0.0)
            cand = p.argmax(-1)
            conf = p[np.arange(len(cands)), cand]
            pick = commit_by_threshold(conf, thr) if w or step < steps - 1 else np.arange(len(cands))
            for j in pick:
                block[cands[j]] = int(cand[j])
            picked = {cands[j] for j in pick.tolist()}
            todo = [t for t in todo if t not in picked]
            step += 1
        new = block[len(head) : len(head) + budget]
        if c.eos_token_id in new:
            out += new[: new.index(c.eos_token_id)]
            return out
        out += new
        seq = seq[:start] + block
        start += B
    return out


@pytest.fixture(scope="module")
def clover_shift(tmp_path_factory):
    d = tmp_path_factory.mktemp("clover_shift")
    write_random_checkpoint(d / "hf", model_type="clover", seed=8, dtype="f32", std=0.2,
                            overrides={"block_length": 8, "shift_logits": True})
    convert(d / "hf", d / "m.gguf", out_type="f32", log=lambda s: None, progress=False)
    return clover_cpu.load(d / "m.gguf")


@pytest.mark.parametrize("prompt_len,threshold,block", [(5, 0.3, None), (8, 0.05, None), (9, 0.9, 3), (2, 0.2, 2)])
def test_shifted_logits_and_block_lengths(clover_shift, prompt_len, threshold, block):
    m = clover_shift
    assert m.config.shift_logits and m.config.block_length == 8
    prompt = list(np.random.default_rng(prompt_len).integers(5, 500, prompt_len))
    opts = Options(max_new_tokens=11, threshold=threshold, block_length=block, stop_at_eos=False)
    toks, _ = collect(m, prompt, opts)
    assert toks == reference_decode(m, prompt, opts)


def collect(model, prompt, opts, cache=None):
    toks, stats = [], None
    for ev in decode(model, prompt, opts, cache=cache):
        if ev.kind == "tokens":
            toks += ev.tokens
        elif ev.kind == "done":
            stats = ev.stats
    return toks, stats


@pytest.mark.parametrize("prompt_len,threshold,max_new", [(5, 0.95, 13), (8, 0.3, 9), (3, 0.05, 16), (1, 0.5, 1)])
def test_cached_decoder_equals_reference(clover, prompt_len, threshold, max_new):
    prompt = list(np.random.default_rng(prompt_len).integers(5, 500, prompt_len))
    opts = Options(max_new_tokens=max_new, threshold=threshold, stop_at_eos=False)
    toks, stats = collect(clover, prompt, opts)
    assert toks == reference_decode(clover, prompt, opts)
    assert len(toks) == max_new and stats.generated_tokens == max_new
    assert stats.forwards >= 1 and stats.tokens_per_forward > 0


def test_low_threshold_commits_many_per_forward(clover):
    prompt = [10, 11, 12, 13]
    hi, s_hi = collect(clover, prompt, Options(max_new_tokens=12, threshold=1.0, stop_at_eos=False))
    lo, s_lo = collect(clover, prompt, Options(max_new_tokens=12, threshold=1e-9, stop_at_eos=False))
    assert s_hi.tokens_per_forward <= 1.0  # one token per step; commits fused with the next first step
    assert s_lo.tokens_per_forward > 1.5  # every position at once
    assert len(hi) == len(lo) == 12


def test_fused_commit_equals_unfused(clover):
    """run(block + next, commit=B) gives the same next-block logits as commit then a speculative run."""
    B = 4
    prompt = list(range(20, 28))
    blk = [30, 31, 32, 33]
    nxt = [clover.config.mask_token_id] * B
    c1 = clover.new_cache()
    clover.run(c1, prompt, commit=True, block=B)
    fused = clover.run(c1, blk + nxt, commit=B, block=B)
    c2 = clover.new_cache()
    clover.run(c2, prompt, commit=True, block=B)
    first = clover.run(c2, blk, commit=True, block=B)
    second = clover.run(c2, nxt, commit=False, block=B)
    np.testing.assert_allclose(fused[:B], first, atol=1e-5)
    np.testing.assert_allclose(fused[B:], second, atol=1e-5)
    assert c1.n == c2.n == len(prompt) + B


def test_eos_stops_and_drops_the_rest(clover):
    prompt = [40, 41, 42]
    free, _ = collect(clover, prompt, Options(max_new_tokens=12, threshold=0.5, stop_at_eos=False))
    # make the 6th generated token the EOS id: decoding must stop right before it
    eos = free[5]
    c = clover.config
    object.__setattr__(c, "eos_token_id", eos)
    try:
        toks, stats = collect(clover, prompt, Options(max_new_tokens=12, threshold=0.5))
    finally:
        object.__setattr__(c, "eos_token_id", 2)
    assert toks == free[: free.index(eos)]


def test_sampling_is_seeded(clover):
    prompt = [50, 51]
    o = Options(max_new_tokens=8, temperature=1.0, top_k=20, seed=3, stop_at_eos=False)
    a, _ = collect(clover, prompt, o)
    b, _ = collect(clover, prompt, Options(**{**o.__dict__}))
    assert a == b
    c, _ = collect(clover, prompt, Options(**{**o.__dict__, "seed": 4}))
    assert a != c


def test_fixed_policy(clover):
    toks, stats = collect(clover, [60, 61, 62, 63], Options(max_new_tokens=8, policy="fixed", max_steps=2,
                                                             stop_at_eos=False))
    assert len(toks) == 8
    assert stats.forwards == 2 + 1 + 1  # two steps a block; the commit forward is fused with the next first step


@pytest.mark.parametrize("bad,msg", [(dict(threshold=0.0), "threshold"), (dict(threshold=1.5), "threshold"),
                                     (dict(block_length=0), "block_length"), (dict(max_new_tokens=-1), "max_new_tokens"),
                                     (dict(top_p=0.0), "top_p"), (dict(policy="x"), "policy")])
def test_bad_options(clover, bad, msg):
    with pytest.raises(ValueError, match=msg):
        list(decode(clover, [1, 2], Options(**bad)))


def test_prompt_longer_than_context(clover):
    with pytest.raises(ValueError, match="context"):
        list(decode(clover, list(range(5000)), Options(max_new_tokens=4)))


def test_context_must_hold_the_last_block(clover):
    # forwards span whole blocks (B = 4 here), masks included: a request whose last block would pass the
    # context is refused before any forward, not with "context full" halfway through its tokens
    m = clover_cpu.load(clover.file.path, ctx_len=18)
    with pytest.raises(ValueError, match="whole blocks of 4, to position 20"):
        next(iter(decode(m, [1, 2, 3, 4, 5], Options(max_new_tokens=12))))  # 17 <= 18, its block ends at 20
    toks, _ = collect(m, [1, 2, 3, 4, 5], Options(max_new_tokens=11, stop_at_eos=False))  # block ends at 16
    assert len(toks) == 11
    m = clover_cpu.load(clover.file.path, ctx_len=20)
    toks, _ = collect(m, [1, 2, 3, 4, 5], Options(max_new_tokens=12, stop_at_eos=False))
    assert len(toks) == 12 and toks == collect(clover, [1, 2, 3, 4, 5], Options(max_new_tokens=12, stop_at_eos=False))[0]


def test_autoregressive_file_decodes_through_the_same_loop(tmp_path):
    """A qwen35moe file: block length 1, shifted logits, one forward per token, equal to greedy()."""
    write_random_checkpoint(tmp_path / "hf", model_type="qwen3_5_moe", seed=9, dtype="f32", std=0.2)
    convert(tmp_path / "hf", tmp_path / "q.gguf", out_type="f32", log=lambda s: None, progress=False)
    m = clover_cpu.load(tmp_path / "q.gguf")
    assert m.config.block_length == 1 and m.config.shift_logits and not m.config.is_diffusion
    prompt = [7, 8, 9, 10, 11]
    toks, stats = collect(m, prompt, Options(max_new_tokens=10, stop_at_eos=False))
    assert toks == list(m.greedy(prompt, 10, stop_at_eos=False))
    assert stats.forwards == 9  # the prefill gives the first token; then one forward per further token
    assert stats.tokens_per_forward == pytest.approx(10 / 9)


@pytest.mark.parametrize("chunk", [4, 8, 12])
def test_chunked_prefill_equals_one_forward(clover, monkeypatch, chunk):
    """A long prompt is prefilled in chunks of whole blocks; the caches make that exact."""
    import clover_cpu.decode as dec

    prompt = list(np.random.default_rng(3).integers(5, 500, 29))
    opts = Options(max_new_tokens=10, threshold=0.3, stop_at_eos=False)
    whole, _ = collect(clover, prompt, opts)
    monkeypatch.setattr(dec, "PREFILL_CHUNK", chunk)
    assert collect(clover, prompt, opts)[0] == whole == reference_decode(clover, prompt, opts)
    # each chunk of a prompt longer than one reports how far the prompt has been read (28 whole-block tokens)
    seen = [ev.progress for ev in decode(clover, prompt, opts) if ev.kind == "prefill"]
    steps = list(range(chunk, 28, chunk)) + [28]
    assert seen == [(n, 28) for n in steps]


def test_cli_shows_a_long_prompts_progress(clover, monkeypatch, capsys):
    # on a terminal, `run` draws the prompt's progress on one stderr line and clears it when the prompt is read
    import sys

    import clover_cpu.decode as dec
    from clover_cpu.commands.run import generate

    class Args:
        json, show_steps, reasoning = False, False, "raw"

    monkeypatch.setattr(dec, "PREFILL_CHUNK", 8)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    prompt = list(np.random.default_rng(3).integers(5, 500, 29))
    generate(clover, prompt, dict(max_new_tokens=4, stop_at_eos=False), Args())
    err = capsys.readouterr().err
    assert "[prompt] 8 / 28 tokens (28%" in err and "[prompt] 24 / 28 tokens (85%" in err
    assert err.endswith("\r\x1b[K") and "[prompt] 28 / 28" not in err


def test_cleared_cache_equals_a_fresh_one(clover):
    """Cache.clear keeps the memory but not the context: the next run equals one on a new cache."""
    c = clover.new_cache()
    clover.run(c, list(range(30, 42)), commit=True, block=4)
    c.clear()
    assert c.n == 0 and c.tokens == []
    got = clover.run(c, [7, 8, 9, 10, 11, 12, 13, 14], commit=True, block=4)
    want = clover.run(clover.new_cache(), [7, 8, 9, 10, 11, 12, 13, 14], commit=True, block=4)
    np.testing.assert_array_equal(got, want)


# ---- window and reuse (CPU scheduling; reuse is approximate) ----


@pytest.mark.parametrize("prompt_len,threshold,window,max_new", [(5, 0.3, 1, 9), (3, 0.05, 2, 13), (8, 0.2, 3, 10)])
def test_window_decoder_equals_reference(clover, prompt_len, threshold, window, max_new):
    prompt = list(np.random.default_rng(prompt_len).integers(5, 500, prompt_len))
    opts = Options(max_new_tokens=max_new, threshold=threshold, window=window, stop_at_eos=False)
    toks, stats = collect(clover, prompt, opts)
    assert toks == reference_decode(clover, prompt, opts)
    assert stats.generated_tokens == max_new


def test_window_of_a_whole_block_is_exact_decoding(clover):
    prompt = [7, 8, 9, 10, 11]
    exact, _ = collect(clover, prompt, Options(max_new_tokens=10, threshold=0.3, stop_at_eos=False))
    for w in (4, 9):  # >= the block length (4)
        toks, _ = collect(clover, prompt, Options(max_new_tokens=10, threshold=0.3, window=w, stop_at_eos=False))
        assert toks == exact


def test_reuse_equals_exact_when_each_block_decides_in_one_step(clover):
    """With every position committed in a block's first step, reuse's forwards are exact decoding's
    fused commits ([finished block | next block's masks], commit=B), so the tokens are the same."""
    prompt = [3, 4, 5, 6, 7, 8, 9, 10]  # two full blocks: the first block to decode starts clean
    o = dict(max_new_tokens=12, threshold=1e-9, stop_at_eos=False)
    exact, s_exact = collect(clover, prompt, Options(**o))
    reused, s_reuse = collect(clover, prompt, Options(**o, reuse=True))
    assert reused == exact and s_reuse.forwards == s_exact.forwards == 3


@pytest.mark.parametrize("window", [0, 1, 2])
def test_reuse_commits_the_final_tokens_as_they_form(clover, window):
    prompt = list(range(100, 107))
    cache = clover.new_cache()
    n_calls = []
    run = clover.run

    def counted(c, tokens, **kw):
        n_calls.append((len(tokens), len(tokens) if kw["commit"] is True else int(kw["commit"])))
        return run(c, tokens, **kw)

    clover.run = counted
    try:
        opts = Options(max_new_tokens=11, threshold=0.5, window=window, reuse=True, stop_at_eos=False)
        toks, stats = collect(clover, prompt, opts, cache)
    finally:
        del clover.run
    assert len(toks) == 11
    full = prompt + toks
    assert cache.tokens == full[: cache.n] and cache.n >= len(full) - clover.config.block_length
    # no forward recomputes a committed position: the commits add up to what the cache holds
    assert sum(c for _, c in n_calls) == cache.n
    if window:
        # a forward is the newly final tokens plus the block up to the window's last masked position
        assert all(T - c <= clover.config.block_length for T, c in n_calls)


def test_window_and_reuse_bad_options(clover, clover_shift):
    with pytest.raises(ValueError, match="window"):
        list(decode(clover, [1, 2], Options(window=-1)))
    with pytest.raises(ValueError, match="max_steps and window"):
        list(decode(clover, [1, 2], Options(window=2, max_steps=3)))
    with pytest.raises(ValueError, match="reuse needs a diffusion file"):
        list(decode(clover_shift, [1, 2, 3], Options(reuse=True)))


# ---- mode auto ----


def curve(body, head=None):
    from clover_cpu.costs import CostCurve

    return CostCurve(body, head or {1: 0.0, 4: 0.0})


def test_auto_window_follows_costs_and_acceptance():
    from clover_cpu.decode import AutoWindow

    B = 8
    steep = curve({1: 1.0, 2: 1.2, 16: 15.0})  # each position beyond two costs ~a whole forward
    flat = curve({1: 1.0, 16: 1.0})  # positions are free (a GPU, or a model that sits in the caches)
    a = AutoWindow(steep, B)
    assert a.window(1, list(range(8))) == 1  # nothing seen: the first position only
    for _ in range(30):
        a.observe(np.array([False]), 1.2, 2)  # unsure: below the threshold at one position
    assert a.window(1, list(range(8))) == 1
    rates = a.rates(8)
    assert (np.diff(rates) <= 0).all() and rates[0] < 0.1  # never rising with the offset
    # a sure model with free positions: the whole rest of the block
    b = AutoWindow(flat, B)
    assert b.window(1, [2, 3, 5, 7]) == 4
    # an unsure model turning sure: one position while unsure, then the window widens to the whole
    # block within a few forwards on a curve where positions cost something, and stays there
    mid = curve({1: 1.0, 2: 1.25, 4: 1.6, 8: 2.4, 16: 4.0})
    c = AutoWindow(mid, B)
    for _ in range(30):
        c.observe(np.array([False]), 1.0, 2)
    seen = []
    for _ in range(30):
        w = c.window(1, list(range(8)))
        seen.append(w)
        c.observe(np.ones(w, bool), 1.0, 1 + w)
    assert seen[0] == 1 and seen.index(8) <= 15 and seen == sorted(seen)
    # the step's own work (measured beyond the curve) makes wider windows pay sooner
    d = AutoWindow(steep, B)
    d.hits[:2], d.seen[:2] = [5.0, 1.0], [5.0, 5.0]  # the second candidate reaches the threshold 1 time in 4
    assert d.window(0, list(range(8))) == 1
    d.overhead = 10.0  # each step takes 10 s beyond its forward
    assert d.window(0, list(range(8))) >= 2
    e = AutoWindow(steep, B)
    for _ in range(40):
        e.observe(np.array([True]), 11.2, 2)  # the forward of 2 positions costs 1.2 s on the curve
    assert abs(e.overhead - 10.0) < 0.01


def test_cost_curve_interpolates_and_extrapolates():
    c = curve({1: 1.0, 2: 1.5, 4: 2.0}, {1: 0.1, 8: 0.8})
    assert c(1, 0) == 1.0 and c(3, 0) == 1.75 and c(6, 0) == 2.5  # beyond the last point: its slope
    assert abs(c(2, 4) - (1.5 + 0.4)) < 1e-12
    assert curve({2: 2.0})(4, 0) == 4.0  # one point: proportional


@pytest.mark.parametrize("threshold", [0.9, 0.3, 0.05])
def test_auto_is_reuse_with_the_window_its_costs_choose(clover, threshold):
    """mode auto is reuse with a window per forward: where positions beyond the first cost a fortune it
    decodes as --reuse --window 1, where more positions cost less as --reuse over the whole block, token
    for token."""
    prompt = [5, 6, 7, 8, 9, 10]
    o = dict(max_new_tokens=14, threshold=threshold, stop_at_eos=False)
    B = clover.config.block_length
    try:
        clover._costs[B] = curve({1: 1.0, 2: 1.0, 3: 1e6})
        assert collect(clover, prompt, Options(**o, mode="auto"))[0] == \
            collect(clover, prompt, Options(**o, reuse=True, window=1))[0]
        clover._costs[B] = curve({1: 10.0, 16: 1.0})  # wider is cheaper (never on a CPU): the widest
        auto, s_auto = collect(clover, prompt, Options(**o, mode="auto"))
        whole, s_whole = collect(clover, prompt, Options(**o, reuse=True))
        assert auto == whole and s_auto.forwards == s_whole.forwards
    finally:
        clover._costs.clear()


def test_auto_measures_its_costs_once_per_file_and_machine(clover, tmp_path, monkeypatch):
    from clover_cpu import costs

    monkeypatch.setenv("CLOVER_CACHE_DIR", str(tmp_path / "cache"))
    clover._costs.clear()
    toks, _ = collect(clover, [1, 2, 3], Options(max_new_tokens=6, mode="auto", stop_at_eos=False))
    assert len(toks) == 6
    saved = json.loads((tmp_path / "cache" / costs.FILE_NAME).read_text())
    (key, entry), = saved.items()
    assert str(clover.file.path.resolve()) in key and set(entry) == {"body", "head"}
    assert key == costs.key(clover, 4)
    # the weights' layouts are part of the key: the same file repacked (or not) costs differently
    w = next(w for w in clover.layers[0].values() if hasattr(w, "fmt"))
    fmt = w.fmt
    try:
        w.fmt = "q4_k_r16" if fmt != "q4_k_r16" else "q4_k"
        assert costs.key(clover, 4) != key
    finally:
        w.fmt = fmt
    assert [int(T) for T in entry["body"]] == [1, 2, 3, 4, 6, 8]  # up to twice the block (4)
    body, head = list(entry["body"].values()), list(entry["head"].values())
    assert body == sorted(body) and head == sorted(head) and len(head) == 2  # never cheaper with more
    # a new process (the model's memo gone) reads the file instead of measuring
    clover._costs.clear()
    monkeypatch.setattr(costs, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert clover.forward_costs(4).body == {int(T): v for T, v in entry["body"].items()}
    # a damaged file is measured again; a folder that cannot be written costs only the saving
    clover._costs.clear()
    (tmp_path / "cache" / costs.FILE_NAME).write_text("{not json")
    monkeypatch.setattr(costs, "measure", lambda m, b, p=None: curve({1: 2.0}))
    assert clover.forward_costs(4).body == {1: 2.0}
    clover._costs.clear()
    monkeypatch.setenv("CLOVER_CACHE_DIR", "/proc/no-such-folder")
    assert clover.forward_costs(4).body == {1: 2.0}
    clover._costs.clear()


def test_auto_bad_options_and_autoregressive_files(clover, clover_shift):
    for bad in (dict(window=2), dict(reuse=True), dict(max_steps=3), dict(policy="fixed")):
        with pytest.raises(ValueError, match="mode auto chooses"):
            list(decode(clover, [1, 2], Options(mode="auto", **bad)))
    with pytest.raises(ValueError, match="unknown mode"):
        list(decode(clover, [1, 2], Options(mode="fast")))
    # shifted logits: exact decoding, the same tokens
    o = dict(max_new_tokens=9, threshold=0.3, stop_at_eos=False)
    assert collect(clover_shift, [1, 2, 3], Options(**o, mode="auto"))[0] == \
        collect(clover_shift, [1, 2, 3], Options(**o))[0]


@pytest.fixture(scope="module")
def qwen_ar(tmp_path_factory):
    """A tiny random Qwen3.5-MoE (autoregressive) with the Qwen vocabulary."""
    import qwen_fixtures

    return clover_cpu.load(qwen_fixtures.converted_model(tmp_path_factory, chat_template=None), threads=1)


def test_logprobs_are_the_models(qwen_ar):
    """Options.logprobs: each new token's log-probability and the most likely alternatives, from the logits
    of the step that decided it: for an autoregressive model, log-softmax of the full forward's logits."""
    m = qwen_ar
    prompt = list(np.random.default_rng(3).integers(5, 500, 12))
    toks, lps = [], []
    for ev in decode(m, prompt, Options(max_new_tokens=6, stop_at_eos=False, logprobs=4)):
        if ev.kind == "tokens":
            toks += ev.tokens
            lps += ev.logprobs
    assert len(lps) == len(toks) == 6
    logits = m.forward(prompt + toks)[len(prompt) - 1 : -1].astype(np.float64)
    ref = logits - logits.max(axis=1, keepdims=True)
    ref -= np.log(np.exp(ref).sum(axis=1, keepdims=True))
    for j, (lp, top) in enumerate(lps):
        assert abs(lp - ref[j, toks[j]]) < 1e-4
        assert [i for i, _ in top] == list(np.argsort(-ref[j], kind="stable")[:4])
        assert top[0] == (toks[j], lp)  # greedy: the chosen token is the most likely
    with pytest.raises(ValueError, match="logprobs"):
        Options(logprobs=21).validate()


def test_logit_bias(qwen_ar):
    """Options.logit_bias on an autoregressive model: each chosen token is the argmax of the forward's
    logits plus the bias (so a -100 token never comes, a +100 one always does), while the log-probabilities
    stay those of the model's own logits (as llama-server reports them); bad biases are refused."""
    m = qwen_ar
    prompt = list(np.random.default_rng(4).integers(5, 500, 12))
    plain = m.generate_text(prompt, max_new_tokens=6, stop_at_eos=False)["token_ids"]
    bias = {plain[0]: -100.0, plain[2]: -100.0, 7: 3.5}
    toks, lps = [], []
    for ev in decode(m, prompt, Options(max_new_tokens=6, stop_at_eos=False, logprobs=0, logit_bias=bias)):
        if ev.kind == "tokens":
            toks += ev.tokens
            lps += ev.logprobs
    logits = m.forward(prompt + toks)[len(prompt) - 1 : -1].astype(np.float64)
    biased = logits.copy()
    for t, b in bias.items():
        biased[:, t] += b
    assert toks == [int(np.argmax(row)) for row in biased] and plain[0] not in toks and plain[2] not in toks
    ref = logits - logits.max(axis=1, keepdims=True)
    ref -= np.log(np.exp(ref).sum(axis=1, keepdims=True))
    assert all(abs(lp - ref[j, toks[j]]) < 1e-4 for j, (lp, _) in enumerate(lps))
    assert m.generate_text(prompt, max_new_tokens=5, logit_bias={9: 100})["token_ids"] == [9] * 5
    for bad, msg in (({-1: 1.0}, "integers >= 0"), ({"5": 1.0}, "integers"), ({5: 101}, "from -100 to 100"),
                     ({5: float("nan")}, "from -100 to 100"), ({i: 1.0 for i in range(1025)}, "at most 1024")):
        with pytest.raises(ValueError, match=msg):
            Options(logit_bias=bad).validate()
    with pytest.raises(ValueError, match="below the vocabulary size"):
        m.generate_text(prompt, max_new_tokens=2, logit_bias={m.config.vocab_size: 1.0})


def test_presence_and_frequency_penalties(qwen_ar):
    """OpenAI's penalties on an autoregressive model: each chosen token is the argmax of the forward's logits
    less presence x (the reply has the token) and frequency x (times it has it), the prompt not counted. (A
    random model seldom repeats a token, so a logit bias of 12 on one token makes it repeat until the
    frequency penalty wears its lead down.)"""
    m = qwen_ar
    prompt = list(np.random.default_rng(5).integers(5, 500, 12))
    bias = {1234: 12.0}
    got = {}
    for pres, freq in ((0.0, 0.0), (2.0, 0.0), (0.0, 2.0), (-1.0, 0.5)):
        toks = m.generate_text(prompt, max_new_tokens=16, stop_at_eos=False, presence_penalty=pres,
                               frequency_penalty=freq, logit_bias=bias)["token_ids"]
        logits = m.forward(prompt + toks)[len(prompt) - 1 : -1].astype(np.float64)
        logits[:, 1234] += 12.0
        counts = np.zeros(logits.shape[1])
        for j, t in enumerate(toks):
            assert t == int(np.argmax(logits[j] - pres * (counts > 0) - freq * counts)), (pres, freq, j)
            counts[t] += 1
        got[pres, freq] = toks
    assert got[0.0, 0.0] == [1234] * 16 and 1 < got[0.0, 2.0].count(1234) < 16
    for bad in ({"presence_penalty": 2.5}, {"frequency_penalty": float("nan")}, {"presence_penalty": "1"}):
        with pytest.raises(ValueError, match="from -2 to 2"):
            Options(**bad).validate()
