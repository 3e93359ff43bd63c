"""Prompt caching: Cache.mark / rewind, the decoder's checkpoint before a prompt's end, and the server
engine starting a request from a finished one's caches. Every reply must equal the one decoded from an
empty cache; the tests also check how many prompt tokens were not read again."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import clover_cpu
from clover_cpu import engine as engine_mod
from clover_cpu.decode import MARK_BACK, Options, decode_steps, run_forward

SHIPPED = clover_cpu.shipped_model()


@pytest.fixture(scope="module")
def model():
    return clover_cpu.load(SHIPPED, threads=1)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    import qwen_fixtures

    path = qwen_fixtures.converted_model(tmp_path_factory, chat_template=qwen_fixtures.template())
    return clover_cpu.load(path, threads=1)


@pytest.fixture(scope="module")
def qwen_clover(tmp_path_factory):
    # a diffusion model (blocks of 8) with the same vocabulary and template: checkpoints on its block grid
    import qwen_fixtures

    path = qwen_fixtures.converted_model(tmp_path_factory, chat_template=qwen_fixtures.template(),
                                         model_type="clover")
    return clover_cpu.load(path, threads=1)


def states(cache):
    return ({i: a.copy() for i, a in cache.ssm.items()}, {i: a.copy() for i, a in cache.conv.items()},
            {i: a[: cache.n].copy() for i, a in cache.k.items()}, {i: a[: cache.n].copy() for i, a in cache.v.items()})


def same(a, b):
    return all(a[j].keys() == b[j].keys() and all(np.array_equal(a[j][i], b[j][i]) for i in a[j]) for j in range(4))


def test_mark_and_rewind(model):
    B = model.config.block_length
    rng = np.random.default_rng(0)
    cache = model.new_cache()
    model.run(cache, rng.integers(5, 500, 3 * B), commit=True, block=B)
    cache.mark()
    at_mark, tokens = states(cache), list(cache.tokens)
    model.run(cache, rng.integers(5, 500, 2 * B), commit=True, block=B)
    with pytest.raises(ValueError, match="a checkpoint"):
        cache.rewind(4 * B)
    cache.rewind(3 * B)
    assert cache.n == 3 * B and cache.tokens == tokens and same(states(cache), at_mark)
    # the mark stays: on again, and back again
    model.run(cache, rng.integers(5, 500, B), commit=True, block=B)
    cache.rewind(3 * B)
    assert same(states(cache), at_mark)
    # a snapshot keeps the mark; clear drops it
    snap = cache.snapshot()
    assert snap.mark_n == 3 * B and snap.block == cache.block
    cache.rewind(0)
    assert cache.n == 0 and cache.mark_n is None and not cache.tokens
    with pytest.raises(ValueError):
        cache.rewind(3 * B)


def drive(model, prompt, opts, cache, **kw):
    """decode_steps run to the end: (tokens, the cache length after each forward)."""
    steps, toks, lengths = decode_steps(model, prompt, opts, cache, **kw), [], []
    msg = next(steps)
    while True:
        out = None
        if hasattr(msg, "commit"):
            out = run_forward(model, msg)
            lengths.append(cache.n)
        elif msg.kind == "tokens":
            toks += msg.tokens
        try:
            msg = steps.send(out)
        except StopIteration:
            return toks, lengths


@pytest.mark.parametrize("n_prompt", [70, 100, 3])
def test_decoder_marks_before_the_prompt_end(model, n_prompt):
    B = model.config.block_length
    prompt = list(np.random.default_rng(n_prompt).integers(5, 500, n_prompt))
    opts = Options(max_new_tokens=12, stop_at_eos=False)
    want, _ = drive(model, prompt, opts, model.new_cache())
    cache = model.new_cache()
    got, lengths = drive(model, prompt, opts, cache, mark=True)
    assert got == want
    at = (n_prompt - MARK_BACK) // B * B
    if at <= 0:
        assert cache.mark_n is None
    else:
        assert cache.mark_n == at and at in lengths  # (70: a forward of its own ends there; 100: the prefill's end)
        assert cache.tokens[:at] == prompt[:at]


@pytest.mark.parametrize("which", ["model", "qwen"])
def test_the_checkpoint_does_not_change_decoding(which, request):
    # the prefill is cut where the checkpoint goes whether or not one is taken, so a request decodes the same
    # (bit for bit: the same forwards) from the server, which marks, and from run / the Python API
    m = request.getfixturevalue(which)
    for n in (70, 131, 200):
        prompt = some_ids(m, np.random.default_rng(n), n)
        opts = Options(max_new_tokens=10, stop_at_eos=False)
        a, b = m.new_cache(), m.new_cache()
        got_a, _ = drive(m, prompt, opts, a)
        got_b, _ = drive(m, prompt, opts, b, mark=True)
        assert got_a == got_b and a.mark_n is None and b.mark_n
        assert same(states(a), states(b))


def test_a_cache_written_on_another_grid_is_refused(model):
    cache = model.new_cache()
    drive(model, list(range(5, 30)), Options(max_new_tokens=4, stop_at_eos=False), cache)
    with pytest.raises(ValueError, match="blocks of 8, not blocks of 4"):
        drive(model, [7, 8, 9], Options(max_new_tokens=4, block_length=4), cache)


class Runner:
    """One engine; `ask` submits a job and waits for it: (tokens, cached prompt tokens)."""

    def __init__(self, model, **kw):
        self.eng = engine_mod.Engine(model, **kw)

    def ask(self, prompt, timeout=120, cache_prompt=True, **opts):
        got, done, err = [], threading.Event(), []

        def emit(kind, payload):
            if kind == "event" and payload.kind == "tokens":
                got.extend(payload.tokens)
            elif kind == "error":
                err.append(payload)
            elif kind == "end":
                done.set()

        job = engine_mod.Job(list(prompt), Options(**opts), emit, cache_prompt=cache_prompt)
        self.eng.submit(job)
        assert done.wait(timeout)
        if err:
            raise err[0]
        return got, job.cached_tokens


@pytest.fixture
def runner(request):
    made = []

    def make(model, **kw):
        made.append(Runner(model, **kw))
        return made[-1]

    yield make
    for r in made:
        r.eng.shutdown(30)


def fresh(model, prompt, **opts):
    return model.generate_text(list(prompt), **opts)["token_ids"]


_CODE: list = []


def some_ids(m, rng, n):
    """n prompt tokens: for the shipped code model, a window of real Python (it is sure of its next tokens
    there, so float rounding cannot flip a near tie); for the random qwen model, random ids."""
    if not m.config.is_diffusion:
        return [int(x) for x in rng.integers(5, 500, n)]
    if not _CODE:
        import inspect
        import json.encoder
        import textwrap

        _CODE.extend(m.tokenize(inspect.getsource(json.encoder) + inspect.getsource(textwrap)))
    s = int(rng.integers(0, len(_CODE) - n))
    return _CODE[s : s + n]


def assert_reply(m, prompt, got, **opts):
    """got equals the reply from an empty cache. A prompt read in other parts can round differently (a
    product over fewer tokens may take another kernel path), so for an autoregressive model a difference is
    allowed where the reference's choice was a near tie (its logits within 1e-3 of each other)."""
    want = fresh(m, prompt, **opts)
    if got == want or m.config.is_diffusion:
        assert got == want
        return
    j = next(i for i, (x, y) in enumerate(zip(got, want)) if x != y)
    logits = m.forward(list(prompt) + want[:j])[-1]
    assert 0 <= logits[want[j]] - logits[got[j]] < 1e-3, (j, got, want)


@pytest.mark.parametrize("which", ["model", "qwen"])
def test_engine_reuses_a_conversation(which, request, runner):
    """A chat's turns: each prompt is the last one, its reply and a new message; the same prompt again; a
    prompt that shares only the first prompt's start. Each reply equals the one from an empty cache."""
    m = request.getfixturevalue(which)
    B = m.config.block_length if m.config.is_diffusion else 1
    rng = np.random.default_rng(1)
    opts = dict(max_new_tokens=10, stop_at_eos=False)
    r = runner(m, parallel=2)
    p1 = some_ids(m, rng, 90)
    a1, cached = r.ask(p1, **opts)
    assert_reply(m, p1, a1, **opts)
    assert cached == 0
    # turn 2: the conversation so far and a new message: the whole cache is kept
    p2 = p1 + a1 + some_ids(m, rng, 75)
    a2, cached = r.ask(p2, **opts)
    assert_reply(m, p2, a2, **opts)
    assert cached >= len(p1) // B * B and cached % B == 0
    # the same prompt again: back to the checkpoint MARK_BACK tokens before its end
    a2b, cached = r.ask(p2, **opts)
    assert a2b == a2 and cached == (len(p2) - MARK_BACK) // B * B
    # a reply the client changed: the last turn's checkpoint still holds the conversation before it
    p3 = p2 + [a2[0] + 1 if a2[0] < 499 else 5] + some_ids(m, rng, 20)
    a3, cached = r.ask(p3, **opts)
    assert_reply(m, p3, a3, **opts)
    assert cached == (len(p2) - MARK_BACK) // B * B
    # cache_prompt off: read whole
    a3b, cached = r.ask(p3, cache_prompt=False, **opts)
    assert a3b == a3 and cached == 0
    # another prompt entirely
    p4 = some_ids(m, rng, 40)
    a4, cached = r.ask(p4, **opts)
    assert_reply(m, p4, a4, **opts)
    assert cached == 0


def test_engine_pool_keeps_several_conversations(model, runner):
    rng = np.random.default_rng(2)
    opts = dict(max_new_tokens=8, stop_at_eos=False)
    r = runner(model, parallel=2)
    convs = [some_ids(model, rng, 80) for _ in range(2)]
    answers = [r.ask(p, **opts)[0] for p in convs]
    for p, a in zip(convs, answers):  # each next turn finds its own conversation's cache in the pool
        nxt = p + a + some_ids(model, rng, 30)
        got, cached = r.ask(nxt, **opts)
        assert_reply(model, nxt, got, **opts)
        assert cached >= 72


def test_engine_cache_slots_beyond_parallel(model, runner):
    # one slot decoding, three conversations kept: each next turn finds its own; with the default (as many
    # kept as decode) the three evict each other
    rng = np.random.default_rng(6)
    opts = dict(max_new_tokens=8, stop_at_eos=False)
    convs = [some_ids(model, rng, 80) for _ in range(3)]
    for slots, kept in ((3, True), (None, False)):
        r = runner(model, parallel=1, cache_slots=slots)
        answers = [r.ask(p, **opts)[0] for p in convs]
        for p, a in zip(convs, answers):
            nxt = p + a + some_ids(model, rng, 30)
            got, cached = r.ask(nxt, **opts)
            assert_reply(model, nxt, got, **opts)
            assert (cached >= 72) == kept, (slots, cached)
    with pytest.raises(ValueError, match="cache_slots"):
        engine_mod.Engine(model, parallel=2, cache_slots=1)


def test_engine_block_length_and_approximate_decoding(model, runner):
    rng = np.random.default_rng(3)
    B = model.config.block_length
    r = runner(model, parallel=1)
    p = some_ids(model, rng, 85)
    r.ask(p, max_new_tokens=8, stop_at_eos=False)
    # another block length: the cache's grid does not fit, so nothing is kept
    got, cached = r.ask(p + [9, 10], max_new_tokens=8, stop_at_eos=False, block_length=4)
    assert cached == 0 and got == fresh(model, p + [9, 10], max_new_tokens=8, stop_at_eos=False, block_length=4)
    # approximate decoding (reuse): what it committed after the prompt is dropped at its end
    a, _ = r.ask(p, max_new_tokens=16, stop_at_eos=False, reuse=True)
    nxt = p + a + [11, 12, 13]
    got, cached = r.ask(nxt, max_new_tokens=8, stop_at_eos=False)
    assert cached == (len(p) - MARK_BACK) // B * B
    assert got == fresh(model, nxt, max_new_tokens=8, stop_at_eos=False)


def test_engine_bad_request_keeps_the_cache(model, runner):
    # a request refused by the decoder's checks (before any forward) leaves the cache it took as it was
    rng = np.random.default_rng(7)
    p = some_ids(model, rng, 80)
    r = runner(model, parallel=1)
    a, _ = r.ask(p, max_new_tokens=8, stop_at_eos=False)
    with pytest.raises(ValueError, match="window"):
        r.ask(p + a, max_new_tokens=8, window=2, max_steps=3)
    nxt = p + a + some_ids(model, rng, 10)
    got, cached = r.ask(nxt, max_new_tokens=8, stop_at_eos=False)
    assert cached >= 72
    assert_reply(model, nxt, got, max_new_tokens=8, stop_at_eos=False)


def test_engine_failed_forward_leaves_no_cache(model, runner):
    rng = np.random.default_rng(4)
    p = some_ids(model, rng, 80)
    r = runner(model, parallel=1)
    r.ask(p, max_new_tokens=4, stop_at_eos=False)
    calls = []
    run_batch = model.run_batch

    def failing(spans):
        calls.append(1)
        if len(calls) == 2:  # the second forward of the next request fails
            raise MemoryError("out of memory")
        return run_batch(spans)

    model.run_batch = failing
    try:
        with pytest.raises(engine_mod.ForwardFailed):
            r.ask(p + [5, 6, 7, 8, 9], max_new_tokens=8, stop_at_eos=False)
    finally:
        del model.run_batch
    got, cached = r.ask(p + [5, 6, 7, 8, 9], max_new_tokens=8, stop_at_eos=False)
    assert cached == 0 and got == fresh(model, p + [5, 6, 7, 8, 9], max_new_tokens=8, stop_at_eos=False)


def test_engine_concurrent_conversations(model, runner):
    """Three conversations of three turns each, their turns sent concurrently to three slots: every reply
    equals its reply from an empty cache, and every next turn finds its conversation's cache. (Code the shipped model
    is sure of: batched forwards equal serial ones up to float rounding, which can flip a near tie.)"""
    import inspect
    import json as json_mod
    import textwrap

    opts = dict(max_new_tokens=8, stop_at_eos=False)
    r = runner(model, parallel=3)
    code = [textwrap.dedent(inspect.getsource(f)) for f in (json_mod.dumps, json_mod.loads, textwrap.dedent)]
    convs = [model.tokenize(c[:300]) for c in code]
    news = [[model.tokenize(c[300 + 80 * t : 380 + 80 * t]) for t in range(3)] for c in code]
    results: dict = {}
    errors = []

    def talk(i):
        try:
            p = convs[i]
            for t in range(3):
                a, cached = r.ask(p, **opts)
                results[i, t] = (list(p), a, cached)
                p = p + a + news[i][t]
        except BaseException as e:  # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=talk, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and len(results) == 9
    for k, (p, a, _) in results.items():
        assert a == fresh(model, p, **opts), k
    assert all((c > 0) == (t > 0) for (_, t), (_, _, c) in results.items())


# ---- several checkpoints: a conversation's start shared with other conversations ----


def test_marks_keep_the_first_and_the_newest(model):
    B = model.config.block_length
    rng = np.random.default_rng(10)
    cache = model.new_cache()
    at = {}
    for n in (2, 3, 5):
        model.run(cache, rng.integers(5, 500, n * B - cache.n), commit=True, block=B)
        cache.mark()
        at[n] = states(cache)
    assert sorted(cache.marks) == [2 * B, 5 * B]  # (3 * B, the second oldest, gave way to 5 * B)
    model.run(cache, rng.integers(5, 500, B), commit=True, block=B)
    with pytest.raises(ValueError, match="16, 40"):
        cache.rewind(3 * B)
    cache.rewind(5 * B)
    assert same(states(cache), at[5])
    # a copy of the first checkpoint, in another cache, leaves this one as it was
    before, tokens = states(cache), list(cache.tokens)
    other = model.new_cache()
    model.run(other, rng.integers(5, 500, 3 * B), commit=True, block=B)
    other.copy_prefix(cache, 2 * B)
    assert other.n == 2 * B and other.tokens == tokens[: 2 * B] and other.marks.keys() == {2 * B}
    assert same(states(other), at[2]) and same(states(cache), before) and cache.tokens == tokens
    with pytest.raises(ValueError, match="neither"):
        other.copy_prefix(cache, 3 * B)
    # back to the first: the later checkpoint goes, and its buffers serve the next one
    cache.rewind(2 * B)
    assert same(states(cache), at[2]) and sorted(cache.marks) == [2 * B] and len(cache.spare) == 1
    spare = cache.spare[0]
    model.run(cache, rng.integers(5, 500, B), commit=True, block=B)
    cache.mark()
    assert cache.marks[3 * B][0] is spare[0] and not cache.spare
    snap = cache.snapshot()
    assert sorted(snap.marks) == [2 * B, 3 * B] and snap.marks[2 * B][0] is not cache.marks[2 * B][0]


def test_user_turn_ids(qwen, model):
    assert qwen.user_turn_ids == qwen.tokenize("<|im_start|>user\n")
    from clover_cpu.chat import ChatTemplate

    # a template whose messages follow no control token: the start of a message cannot be told
    plain = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
                         tokenizer=qwen.tokenizer, isolate=False)
    assert plain.user_turn_ids() is None
    assert model.user_turn_ids is None  # (the shipped code model has no chat template)
    # Llama 3's template: the last control token before a message (<|end_header_id|>) also ends the system
    # message's header; the opener goes back to the one before the role's name
    import realfiles
    from clover_cpu.decode import first_user_turn
    from clover_cpu.tokenizer import load_tokenizer

    models = realfiles.llama_cpp() / "models"
    tok = load_tokenizer(models / "ggml-vocab-llama-bpe.gguf")
    llama3 = ChatTemplate((models / "templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text(),
                          tokenizer=tok, special_tokens=tok.special_token_strings())
    opener = llama3.user_turn_ids()
    assert tok.decode(opener, skip_special=False) == "<|start_header_id|>user<|end_header_id|>\n\n"
    text = llama3.render([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
                         add_generation_prompt=True, mark=True)
    ids = llama3.encode(text)

    class Llama3:
        user_turn_ids = opener

    user = first_user_turn(Llama3, ids, 0)
    head = tok.decode(ids[:user], skip_special=False)
    assert head.endswith(SYSTEM + "<|eot_id|>" + tok.decode(opener, skip_special=False))
    assert first_user_turn(Llama3, ids, 64) == 0  # (a context holds the conversation's start)


SYSTEM = ("You are a careful assistant for a team that maintains a Python library. Answer in short "
          "paragraphs, quote code in fenced blocks, and say when you are unsure. ") * 4 + "Be brief."


def next_turn(m, prompt, reply, message):
    """The ids of a conversation's next turn: the prompt, the reply, and a new user message."""
    return prompt + reply + m.tokenize(f"<|im_end|>\n<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n")


def chat_ids(m, system, user):
    return m.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                 tokenize=True)


@pytest.mark.parametrize("which", ["qwen", "qwen_clover"])
def test_decoder_marks_where_the_first_user_message_begins(which, request):
    qwen = request.getfixturevalue(which)
    B = qwen.config.block_length if qwen.config.is_diffusion else 1
    ids = chat_ids(qwen, SYSTEM, "What does functools.partial do, and when is a lambda better?")
    opener = qwen.tokenize("<|im_start|>user\n")
    user = next(i for i in range(len(ids)) if ids[i : i + len(opener)] == opener) + len(opener)
    assert user >= 64 and (B == 1 or user % B)  # (on the grid: the block boundary before it)
    user = user // B * B
    opts = Options(max_new_tokens=6, stop_at_eos=False)
    plain, marked = qwen.new_cache(), qwen.new_cache()
    got, lengths = drive(qwen, ids, opts, marked, mark=True)
    want, _ = drive(qwen, ids, opts, plain)
    assert got == want and same(states(plain), states(marked))
    end = (len(ids) - MARK_BACK) // B * B
    assert sorted(marked.marks) == [user, end] and user in lengths and end in lengths
    # from the decoder's own reading of a raw prompt (run, the Python API) the same cuts: the same forwards
    _, raw_lengths = drive(qwen, ids, opts, qwen.new_cache())
    assert raw_lengths == lengths
    # the next turn goes on from the cache, which holds the first user message: no cut where the second
    # one begins, only before the prompt's end (which replaces the newest checkpoint; the first stays)
    reply = qwen.tokenize(" It binds arguments ahead of the call." * 12 + "<|im_end|>\n")  # (a long reply)
    nxt = ids + got + reply + qwen.tokenize("<|im_start|>user\nAnd a partial of a partial?<|im_end|>\n"
                                            "<|im_start|>assistant\n")
    marked.rewind(marked.reusable(nxt, marked.block, B, leave_last=qwen.config.shift_logits))
    second = (len(ids) + len(got) + len(reply) + len(opener)) // B * B
    n0 = marked.n
    assert second - n0 >= 64  # (far enough into the new tokens for a cut there to be made if it were sought)
    _, lengths = drive(qwen, nxt[n0:], opts, marked, mark=True)
    end = (len(nxt) - MARK_BACK) // B * B
    assert second not in lengths and end in lengths and sorted(marked.marks) == [user, end]


@pytest.mark.parametrize("which", ["qwen", "qwen_clover"])
def test_engine_shares_a_system_prompt_across_conversations(which, request, runner):
    """Two conversations with the same system prompt: the second starts from the first's checkpoint where
    its user message begins, copied into a cache of its own, so the first conversation's next turn still
    finds its whole cache; each reply equals the one from an empty cache."""
    qwen = request.getfixturevalue(which)
    B = qwen.config.block_length if qwen.config.is_diffusion else 1
    opts = dict(max_new_tokens=8, stop_at_eos=False)
    opener = qwen.tokenize("<|im_start|>user\n")
    r = runner(qwen, parallel=1, cache_slots=2)
    a = chat_ids(qwen, SYSTEM, "How do I read a file line by line?")
    b = chat_ids(qwen, SYSTEM, "Why is my dict ordered?")
    user = (next(i for i in range(len(a)) if a[i : i + len(opener)] == opener) + len(opener)) // B * B
    got_a, cached = r.ask(a, **opts)
    assert cached == 0
    assert_reply(qwen, a, got_a, **opts)
    got_b, cached = r.ask(b, **opts)
    assert cached == user
    assert_reply(qwen, b, got_b, **opts)
    a2 = next_turn(qwen, a, got_a, "And in binary mode?")
    got_a2, cached = r.ask(a2, **opts)
    # all it holds: the prompt and the reply (an autoregressive cache holds all but the reply's last token,
    # a diffusion one its whole blocks)
    assert cached == (len(a) + len(got_a) - 1 if B == 1 else (len(a) + len(got_a)) // B * B)
    assert_reply(qwen, a2, got_a2, **opts)
    # a third conversation with the same start, with both slots held: the least recently used one (b's)
    # takes the copy; a's conversation goes on from its own cache again
    c = chat_ids(qwen, SYSTEM, "What is a generator?")
    got_c, cached = r.ask(c, **opts)
    assert cached == user
    assert_reply(qwen, c, got_c, **opts)
    a3 = next_turn(qwen, a2, got_a2, "Thanks.")
    _, cached = r.ask(a3, **opts)
    assert cached >= len(a2)
    # one slot only: the conversation that shares the start takes the cache itself, rewound
    r1 = runner(qwen, parallel=1)
    r1.ask(a, **opts)
    got_b1, cached = r1.ask(b, **opts)
    assert cached == user and got_b1 == got_b


def test_engine_copies_a_single_checkpoint_where_a_slot_is_free(qwen_clover, runner):
    """A short first message: the checkpoint where it begins and the one before the prompt's end fall on
    the same block boundary, so the cache holds one checkpoint, its newest. Another conversation that shares
    only that start gets a copy while a slot is free, and the first conversation's next turn finds its
    whole cache."""
    m, B = qwen_clover, qwen_clover.config.block_length
    opts = dict(max_new_tokens=16, stop_at_eos=False)
    a = next(p for p in (chat_ids(m, SYSTEM, q) for q in ("Hi", "Hello", "Hey", "Thanks", "Why?"))
             if (len(p) - MARK_BACK) // B == first_user(m, p) // B)
    r = runner(m, parallel=1, cache_slots=2)
    got_a, _ = r.ask(a, **opts)
    held = r.eng._free_caches[0]
    assert sorted(held.marks) == [first_user(m, a) // B * B]
    b = chat_ids(m, SYSTEM, "Why is my dict ordered?")
    _, cached = r.ask(b, **opts)
    assert cached == first_user(m, a) // B * B
    a2 = next_turn(m, a, got_a, "And then?")
    got_a2, cached = r.ask(a2, **opts)
    assert cached == (len(a) + len(got_a)) // B * B
    assert_reply(m, a2, got_a2, **opts)


def first_user(m, ids):
    opener = m.tokenize("<|im_start|>user\n")
    return next(i for i in range(len(ids)) if ids[i : i + len(opener)] == opener) + len(opener)
