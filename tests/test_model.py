"""The runtime's forward pass against transformers' qwen3_5_moe on tiny random configurations,
and the caches: speculative runs, commits, snapshots."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import clover_cpu  # noqa: E402
from clover_cpu.convert.hf import convert  # noqa: E402
from clover_cpu.convert.synthetic import train_spm  # noqa: E402

from conftest import check_close  # noqa: E402

BASE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
            linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
            shared_expert_intermediate_size=64, vocab_size=512, rms_norm_eps=1e-6, max_position_embeddings=4096,
            full_attention_interval=4, tie_word_embeddings=False, partial_rotary_factor=0.25)
# each differs from the Clover shape (and from BASE) in heads, value/key head ratio, conv kernel,
# experts, top-k, head_dim and rotary fraction
CONFIGS = {
    "base": {},
    "wide": dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=3, head_dim=16, linear_num_key_heads=1,
                 linear_num_value_heads=3, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=2,
                 num_experts=5, num_experts_per_tok=3, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                 partial_rotary_factor=0.5, full_attention_interval=2),
    "mha": dict(num_attention_heads=2, num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=4,
                linear_conv_kernel_dim=3, num_experts=16, num_experts_per_tok=1, partial_rotary_factor=1.0,
                num_hidden_layers=3, full_attention_interval=3),
    "gdn_last": dict(num_hidden_layers=5),  # a recurrent last layer (the others end in attention)
}


TOL_KV_Q8 = 1e-2  # logits with a Q8_0 KV cache against transformers (F32 weights), of the largest logit


def build(tmp_path, name, seed=0, model_type=None):
    """A random transformers model saved in the HF layout plus our tokenizer, and its GGUF (f32)."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    kw = dict(BASE, **CONFIGS[name])
    partial = kw.pop("partial_rotary_factor")
    cfg = Qwen3_5MoeTextConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": partial})
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():  # make norms and gates non-trivial
            if n.endswith("norm.weight") and "linear_attn" not in n:
                p.normal_(0, 0.2)
            if "dt_bias" in n:
                p.normal_(0, 1.0)
    src = tmp_path / f"hf-{name}"
    model.save_pretrained(src, safe_serialization=True)
    (src / "tokenizer.model").write_bytes(train_spm(512))
    if model_type:
        c = json.loads((src / "config.json").read_text())
        c.update(model_type=model_type, mask_token_id=4, block_length=4)
        (src / "config.json").write_text(json.dumps(c))
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for name in CONFIGS:
        d = tmp_path_factory.mktemp(name)
        hf = build(d, name)
        for t in ("f32", "q8_0"):
            convert(d / f"hf-{name}", d / f"{t}.gguf", out_type=t, log=lambda s: None, progress=False)
        out[name] = (hf, d)
    return out


def hf_logits(hf, ids, mask=None):
    with torch.no_grad():
        kw = {} if mask is None else {"attention_mask": mask}
        return hf(torch.tensor(np.asarray(ids))[None], **kw).logits[0].float().numpy()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_matches_transformers(models, name):
    hf, d = models[name]
    ids = np.random.default_rng(1).integers(0, 512, 37)
    want = hf_logits(hf, ids)
    # F32 weights and an F32 KV cache: relative error < 1e-4 of the largest logit
    m = clover_cpu.load(d / "f32.gguf", kv_type="f32")
    check_close(m.forward(ids), want, 1e-4, f"{name} f32")
    assert m.config.arch == "qwen35moe"
    # the default F16 KV cache rounds keys and values to 11 bits
    check_close(clover_cpu.load(d / "f32.gguf").forward(ids), want, 2e-3, f"{name} f32 weights, f16 kv")
    if m.config.head_dim % 32 == 0:
        # a Q8_0 KV cache: keys and values rounded to 8 bits per 32-value block
        check_close(clover_cpu.load(d / "f32.gguf", kv_type="q8_0").forward(ids), want, TOL_KV_Q8,
                    f"{name} f32 weights, q8_0 kv")
    else:
        with pytest.raises(ValueError, match="multiple of 32"):
            clover_cpu.load(d / "f32.gguf", kv_type="q8_0")
    q = clover_cpu.load(d / "q8_0.gguf")
    got = q.forward(ids)
    # 8-bit weights and activations: small relative error overall (a routing flip may move one row more)
    rel = np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2))
    assert rel < 0.05, f"{name} q8_0: relative RMSE {rel:.4f}"
    assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.9


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_speculative_then_commit_equals_one_run(models, kv_type):
    hf, d = models["base"]
    m = clover_cpu.load(d / "f32.gguf", kv_type=kv_type)
    ids = np.random.default_rng(2).integers(0, 512, 30)
    full = m.forward(ids)
    cache = m.new_cache()
    a = m.run(cache, ids[:12], commit=True)
    check_close(a, full[:12], 1e-5, "prefill")
    spec = m.run(cache, ids[12:20], commit=False)
    assert cache.n == 12
    spec2 = m.run(cache, ids[12:20], commit=False)  # the caches did not move
    np.testing.assert_array_equal(spec, spec2)
    com = m.run(cache, ids[12:20], commit=True)
    np.testing.assert_array_equal(spec, com)
    check_close(com, full[12:20], 1e-5, "commit")
    snap = cache.snapshot()
    rest = m.run(cache, ids[20:], commit=True)
    check_close(rest, full[20:], 1e-5, "rest")
    cache.restore(snap)
    assert cache.n == 20
    np.testing.assert_array_equal(m.run(cache, ids[20:], commit=True), rest)


def test_one_token_at_a_time(models):
    hf, d = models["wide"]
    m = clover_cpu.load(d / "f32.gguf")
    ids = np.random.default_rng(3).integers(0, 512, 9)
    full = m.forward(ids)
    cache = m.new_cache()
    steps = np.concatenate([m.run(cache, [t], commit=True) for t in ids])
    check_close(steps, full, 1e-5, "token by token")


def test_clover_block_causal_matches_transformers_with_block_mask(tmp_path):
    """Clover: full-attention layers see their whole block; GDN layers stay causal."""
    B = 4
    hf = build(tmp_path, "base", seed=5, model_type="clover")
    convert(tmp_path / "hf-base", tmp_path / "c.gguf", out_type="f32", log=lambda s: None, progress=False)
    m = clover_cpu.load(tmp_path / "c.gguf", kv_type="f32")
    assert m.config.arch == "clover" and m.config.block_length == B
    ids = np.random.default_rng(4).integers(0, 512, 14)
    T = len(ids)
    pos = np.arange(T)
    allowed = (pos[None, :] // B) <= (pos[:, None] // B)
    mask = torch.where(torch.tensor(allowed), 0.0, float("-inf"))[None, None]
    want = hf_logits(hf, ids, mask)
    check_close(m.forward(ids), want, 1e-4, "block-causal")
    # and it differs from causal: the block pattern is really used
    assert np.abs(m.run(m.new_cache(), ids, commit=False) - want).max() > 1e-3


def test_context_limit_and_bad_ids(models):
    _, d = models["base"]
    m = clover_cpu.load(d / "f32.gguf", ctx_len=16)
    with pytest.raises(ValueError, match="context"):
        m.forward(np.zeros(17, np.int64))
    with pytest.raises(ValueError, match="token ids"):
        m.forward([600])


def test_tokenizer_roundtrip(models):
    _, d = models["base"]
    m = clover_cpu.load(d / "f32.gguf")
    text = "def f(x):\n    return x + 1  # ünïcode\n"
    ids = m.tokenize(text)
    assert m.detokenize(ids) == text


def test_greedy_matches_transformers_generate(models):
    hf, d = models["base"]
    m = clover_cpu.load(d / "f32.gguf")
    prompt = np.random.default_rng(6).integers(5, 512, 7)
    ours = list(m.greedy(prompt, 12, stop_at_eos=False))
    with torch.no_grad():
        ref = hf.generate(torch.tensor(prompt)[None], max_new_tokens=12, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref
    assert list(m.greedy(prompt, 0)) == []
    with pytest.raises(ValueError, match="context"):
        list(clover_cpu.load(d / "f32.gguf", ctx_len=10).greedy(prompt, 5))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_layers_equal_the_operator_path(models, name):
    # Model.fused (csrc/layers.h: one C++ call per token mixer and per feed-forward; the GDN's q/k/v read
    # in place from the conv output) against the operator-by-operator Python path: the same bits, logits
    # and every cache (GDN states, F32 / F16 / Q8_0 KV rows), on every ISA (the reference table runs the
    # chunked delta rule, the SIMD ones the recurrent), for committed, partly committed and speculative
    # spans, one token and many
    from clover_cpu import _core

    class Counting:  # the stack's calls, counted (to know which path ran)
        def __init__(self, stack):
            self.stack, self.calls = stack, 0

        def __getattr__(self, attr):
            def call(*a, **kw):
                self.calls += 1
                return getattr(self.stack, attr)(*a, **kw)

            return call

    _, d = models[name]
    ids = np.random.default_rng(5).integers(0, 512, 40)
    active = clover_cpu.system_info()["isa"]
    try:
        for isa in clover_cpu.system_info()["available_isas"]:
            _core.set_isa(isa)
            for fmt, kv in (("f32", "f32"), ("f32", "q8_0"), ("q8_0", "f16")):
                try:
                    m = clover_cpu.load(d / f"{fmt}.gguf", kv_type=kv)
                except ValueError as e:  # (a Q8_0 cache needs a head dim that is a multiple of 32)
                    assert "multiple of 32" in str(e)
                    continue
                m._stack = Counting(m._stack)
                runs = []
                for fused in (False, True):
                    m.fused = fused
                    before = m._stack.calls
                    cache = m.new_cache()
                    out = [m.run(cache, ids[:12], commit=True),  # prefill
                           m.run(cache, ids[12:21], commit=4),  # a commit fused with the next step
                           m.run(cache, ids[16:25], commit=False),  # speculative
                           m.run(cache, ids[16:17], commit=True),  # one token
                           m.run(cache, ids[17:40], commit=True, block=4)]  # block-causal, from mid-block
                    states = [a[i].copy() for a in (cache.ssm, cache.conv, cache.k, cache.v) for i in sorted(a)]
                    runs.append((out, states, m.last_experts_used))
                    # five runs: a mixer call and a feed-forward call per layer, or none
                    want = 10 * m.config.n_layer if fused else 0
                    assert m._stack.calls - before == want, f"LayerStack calls with fused={fused}"
                (a, sa, na), (b, sb, nb) = runs
                assert all(np.array_equal(x, y) for x, y in zip(a, b)), f"{name} {isa} {fmt} {kv}: logits"
                assert len(sa) == len(sb) > 0, f"{name}: no GDN state"
                assert all(np.array_equal(x, y) for x, y in zip(sa, sb)), f"{name} {isa} {fmt} {kv}: caches"
                assert na == nb
    finally:
        _core.set_isa(active)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_rows_equal_the_full_run(models, name):
    # run(rows=r): the last layer's output only for the rows read (llama.cpp's out_ids) equals the full run's
    # rows, leaves the same caches behind (every position's keys, values and states are written), on the
    # fused path and the operator path, for prefill, a fused commit, a speculative span and batched spans
    from clover_cpu.decode import Forward, run_forward

    _, d = models[name]
    ids = np.random.default_rng(6).integers(0, 512, 40)
    m = clover_cpu.load(d / "f32.gguf", kv_type="f32")
    assert m.config.recurrent[-1] == (name == "gdn_last")
    steps = [(ids[:12], True, None, [11]), (ids[12:21], 4, 4, [5, 6, 8]), (ids[16:25], False, 4, [0, 3, 8]),
             (ids[16:25], 0, 4, []), (ids[16:17], True, None, []), (ids[17:40], True, 4, [0, 22])]

    def caches(cache):
        return [a[i].copy() for a in (cache.ssm, cache.conv, cache.k, cache.v) for i in sorted(a)] + [cache.n]

    for fused in (True, False):
        m.fused = fused
        full, part = m.new_cache(), m.new_cache()
        for toks, commit, block, rows in steps:
            want = m.run(full, toks, commit=commit, block=block)[rows]
            got = m.run(part, toks, commit=commit, block=block, rows=rows)
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(initial=1))
            a, b = caches(full), caches(part)
            assert all(np.array_equal(x, y) for x, y in zip(a, b)), f"{name} fused={fused}: caches"
    m.fused = True
    # rows in any order through a Forward; spans of several sequences with rows
    cache = m.new_cache()
    m.run(cache, ids[:8], commit=True, block=4)
    snap = cache.snapshot()
    want = m.run(cache, ids[8:16], commit=False, block=4)[[6, 1, 3]]
    np.testing.assert_allclose(run_forward(m, Forward(cache, list(ids[8:16]), 0, 4, [6, 1, 3])), want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())
    caches_a = [m.new_cache() for _ in range(3)]
    caches_b = [snap] + [m.new_cache() for _ in range(2)]
    spans = [(ids[8:16], 2, 4, [2, 7]), (ids[:5], True, None, []), (ids[5:9], 1, 4, None)]
    b = m.run_batch([(c, *s) for c, s in zip(caches_b, spans)])
    m.run(caches_a[0], ids[:8], commit=True, block=4)
    for c, (toks, commit, block, rows), got in zip(caches_a, spans, b):
        want = m.run(c, toks, commit=commit, block=block, logits=False)
        want = want if rows is None else want[rows]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(initial=1))
    assert [c.n for c in caches_a] == [c.n for c in caches_b]
    for bad in ([3, 1], [0, 0], [-1], [9]):
        with pytest.raises(ValueError, match="rows must be ascending"):
            m.run(m.new_cache(), ids[:9], commit=True, rows=bad)
    # the attention call itself: rows outside out_rows are left as they were, and every row's key and value
    # is written (out_rows=[] too: no query, attention or output work at all)
    c = m.config
    i = c.recurrent.index(False)
    x = np.random.default_rng(7).standard_normal((5, c.n_embd)).astype(np.float32)
    want_k = np.zeros((8, c.n_head_kv, c.head_dim), np.float32)
    want_v = want_k.copy()
    full = x.copy()
    m._stack.attn(i, full, want_k, want_v, 0, None)
    for out in ([], [1], [0, 4]):
        k, v, y = np.zeros_like(want_k), np.zeros_like(want_v), x.copy()
        m._stack.attn(i, y, k, v, 0, None, out)
        np.testing.assert_array_equal(k, want_k)
        np.testing.assert_array_equal(v, want_v)
        rest = [r for r in range(5) if r not in out]
        np.testing.assert_array_equal(y[rest], x[rest])
        np.testing.assert_allclose(y[out], full[out], rtol=1e-5, atol=1e-6)


def test_layer_stack_rejects_bad_arguments(models):
    from clover_cpu import kernels
    from clover_cpu.model import pair, rmsnorm

    _, d = models["base"]
    m = clover_cpu.load(d / "f32.gguf")
    c = m.config
    s = m._stack
    gdn_layer = c.recurrent.index(True)
    attn_layer = c.recurrent.index(False)
    x = np.zeros((3, c.n_embd), np.float32)
    conv, ssm = m.new_cache().gdn_state(gdn_layer, c)
    for n_layer, H, eps in ((0, 64, 1e-6), (-1, 64, 1e-6), (4, 0, 1e-6), (4, 64, -1.0)):
        with pytest.raises(ValueError, match="n_layer|eps"):
            kernels.LayerStack(n_layer, H, eps)
    with pytest.raises(ValueError, match="out of range"):
        s.moe(c.n_layer, x)
    with pytest.raises(ValueError, match="no GDN weights"):
        s.gdn(attn_layer, x, conv, ssm, 3)
    with pytest.raises(ValueError, match="no attention weights"):
        s.attn(gdn_layer, x, np.zeros((8, c.n_head_kv, c.head_dim), np.float16),
               np.zeros((8, c.n_head_kv, c.head_dim), np.float16), 0)
    kc = np.zeros((8, c.n_head_kv, c.head_dim), np.float16)
    with pytest.raises(ValueError, match="must lie in the caches"):
        s.attn(attn_layer, x, kc, kc.copy(), 6)
    with pytest.raises(ValueError, match="the KV caches must be"):
        s.attn(attn_layer, x, kc[:, :, :8].copy(), kc[:, :, :8].copy(), 0)
    with pytest.raises(ValueError, match="same dtype"):
        s.attn(attn_layer, x, kc, kc.astype(np.float32), 0)
    with pytest.raises(ValueError, match="block must be"):
        s.attn(attn_layer, x, kc, kc.copy(), 0, 0)
    for rows in ([2, 1], [0, 3], [-1], [1, 1]):
        with pytest.raises(ValueError, match="out_rows must be ascending"):
            s.attn(attn_layer, x, kc, kc.copy(), 0, None, rows)
        with pytest.raises(ValueError, match="out_rows must be ascending"):
            s.attn_batch(attn_layer, x, [(0, 3, kc, kc.copy(), 0, None)], rows)
    with pytest.raises(ValueError, match="must lie in the caches"):
        s.attn(attn_layer, x, kc, kc.copy(), 2**63 - 2)  # (n0 + T would overflow)
    with pytest.raises(ValueError, match="writeable"):
        ro_kc = kc.copy()
        ro_kc.flags.writeable = False
        s.attn(attn_layer, x, ro_kc, ro_kc.copy(), 0)
    with pytest.raises(ValueError, match="k_cache must have dtype"):
        s.attn(attn_layer, x, kc.astype(np.float64), kc.astype(np.float64), 0)
    with pytest.raises(ValueError, match="n_rot"):
        La = m.layers[attn_layer]
        s.set_attn(attn_layer, La["attn_norm"], pair(La["q"]), pair(La["k"]), pair(La["v"]), pair(La["o"]),
                   La["q_norm"], La["k_norm"], c.n_head, c.n_head_kv, c.head_dim, 3, c.rope_theta)
    # a bad block is refused before any layer runs: the caches stay as they were
    cache = m.new_cache()
    m.run(cache, [1, 2, 3], commit=True)
    snap = cache.snapshot()
    for bad in (0, -2):
        with pytest.raises(ValueError, match="block must be >= 1"):
            m.run(cache, [4, 5], commit=True, block=bad)
    with pytest.raises(TypeError):
        m.run(cache, [4, 5], commit=True, block=4.0)
    assert cache.n == snap.n and all(np.array_equal(cache.ssm[i], snap.ssm[i]) for i in cache.ssm)
    with pytest.raises(ValueError, match=rf"x must be \[T, {c.n_embd}\]"):
        s.moe(0, np.zeros((3, c.n_embd + 1), np.float32))
    with pytest.raises(ValueError, match="float32"):
        s.moe(0, x.astype(np.float64))
    ro = x.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        s.moe(0, ro)
    with pytest.raises(ValueError, match="commit must be in"):
        s.gdn(gdn_layer, x, conv, ssm, 4)
    with pytest.raises(ValueError, match="C-contiguous"):
        s.gdn(gdn_layer, x, np.asfortranarray(conv), ssm, 3)
    ro_ssm = ssm.copy()
    ro_ssm.flags.writeable = False
    with pytest.raises(ValueError, match="a commit updates them"):
        s.gdn(gdn_layer, x, conv, ro_ssm, 3)
    s.gdn(gdn_layer, np.zeros((3, c.n_embd), np.float32), conv, ro_ssm, 0)  # speculative: read only is fine
    with pytest.raises(ValueError, match="ssm_state must be"):
        s.gdn(gdn_layer, x, conv, ssm[:1].copy(), 3)
    with pytest.raises(ValueError, match="conv_state must be"):
        s.gdn(gdn_layer, x, conv[:, :5].copy(), ssm, 3)
    L = m.layers[gdn_layer]
    moe_args = [L["post_norm"], pair(L["router"]), L["gate_exps"].data, L["up_exps"].data, L["down_exps"].data,
                L["gate_exps"].fmt, L["down_exps"].fmt, pair(L["gate_shexp"]), pair(L["up_shexp"]),
                pair(L["down_shexp"]), pair(L["shexp_gate_inp"])]
    with pytest.raises(ValueError, match="top_k must be in"):
        s.set_moe(gdn_layer, *moe_args, c.n_expert + 1)
    bad = list(moe_args)
    bad[9] = pair(L["router"])  # down_sh [n_expert, H]: not [H, I]
    with pytest.raises(ValueError, match="shared expert"):
        s.set_moe(gdn_layer, *bad, c.n_expert_used)
    with pytest.raises(ValueError, match=f"attn_norm must have {c.n_embd} values"):
        s.set_gdn(gdn_layer, L["attn_norm"][:10].copy(), (L["qkv"].data, L["qkv"].fmt), (L["z"].data, L["z"].fmt),
                  (L["alpha"].data, L["alpha"].fmt), (L["beta"].data, L["beta"].fmt),
                  (L["ssm_out"].data, L["ssm_out"].fmt), L["conv"], L["dt_bias"], L["ssm_a"], L["ssm_norm"],
                  c.n_k_heads, c.n_v_heads, c.k_head_dim, c.v_head_dim)
    with pytest.raises(ValueError, match="qkv must have"):
        s.set_gdn(gdn_layer, L["attn_norm"], (L["z"].data, L["z"].fmt), (L["z"].data, L["z"].fmt),
                  (L["alpha"].data, L["alpha"].fmt), (L["beta"].data, L["beta"].fmt),
                  (L["ssm_out"].data, L["ssm_out"].fmt), L["conv"], L["dt_bias"], L["ssm_a"], L["ssm_norm"],
                  c.n_k_heads, c.n_v_heads, c.k_head_dim, c.v_head_dim)
    # the refused calls changed nothing: the layer still equals the operator path
    x = np.random.default_rng(0).standard_normal((3, c.n_embd)).astype(np.float32)
    cache = m.new_cache()
    want = x + m._gated_deltanet(gdn_layer, L, rmsnorm(x, L["attn_norm"], c.eps), cache, 3)
    conv, ssm = np.zeros_like(conv), np.zeros_like(ssm)
    s.gdn(gdn_layer, x, conv, ssm, 3)
    np.testing.assert_array_equal(x, want)
    np.testing.assert_array_equal(ssm, cache.ssm[gdn_layer])
    np.testing.assert_array_equal(conv, cache.conv[gdn_layer])
    want = x + m._moe(L, rmsnorm(x, L["post_norm"], c.eps), False)
    s.moe(gdn_layer, x)
    np.testing.assert_array_equal(x, want)
