"""Model operators (clover_cpu.ops): every op and ISA against a float64 numpy reference written here
with plain loops, on random and adversarial data; the chunked gated delta rule against the recurrent
one; state carried across spans; speculative (update_state=False) runs; thread-count independence."""

import numpy as np
import pytest

import clover_cpu
from clover_cpu import _core, kernels, ops

from conftest import check_close

ISAS = clover_cpu.system_info()["available_isas"]

# Tolerances relative to the largest reference value (conftest.check_close).
TOL_NORM = 1e-5  # float32 sums of squares over a row
TOL_ELEMENTWISE = 1e-5  # one exp and a division per value
TOL_ROPE = 1e-5  # the rotation itself; angles are exact (double)
TOL_ATTN = 1e-5  # float32 dots, softmax and weighted sums over <= 100 rows
TOL_CONV = 1e-5
TOL_GDN = 5e-5  # a float32 recurrence over up to 130 tokens
TOL_GDN_FORMS = 5e-5  # chunked (WY) vs recurrent: the same math, different rounding


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


@pytest.fixture
def threads():
    """Set the thread count inside a test; the default comes back afterwards."""
    before = _core.num_threads()
    yield _core.set_num_threads
    _core.set_num_threads(before)


# ---- float64 references ----


def ref_rms_norm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def ref_gated_rms_norm(o, z, w, eps):
    o = o.astype(np.float64)
    z = z.astype(np.float64)
    return w * (o / np.sqrt((o * o).mean(-1, keepdims=True) + eps)) * (z * sigmoid64(z))


def ref_rope(x, pos, n_rot, theta):
    y = x.astype(np.float64)
    half = n_rot // 2
    for t in range(x.shape[0]):
        for i in range(half):
            a = float(pos[t]) * theta ** (-2.0 * i / n_rot)
            c, s = np.cos(a), np.sin(a)
            x0, x1 = y[t, :, i].copy(), y[t, :, i + half].copy()
            y[t, :, i] = x0 * c - x1 * s
            y[t, :, i + half] = x1 * c + x0 * s
    return y


def ref_attention(q, k, v, pos, n_kv, mask, block, scale, gate=None):
    T, Hq, D = q.shape
    group = Hq // k.shape[1]
    k = k.astype(np.float64)
    v = v.astype(np.float64)
    o = np.zeros((T, Hq, D))
    for t in range(T):
        p = int(pos[t])
        rows = [s for s in range(n_kv) if (s <= p if mask == "causal" else s // block <= p // block)]
        for h in range(Hq):
            if not rows:
                continue
            g = h // group
            sc = np.array([scale * np.dot(q[t, h].astype(np.float64), k[s, g]) for s in rows])
            e = np.exp(sc - sc.max())
            o[t, h] = (e[:, None] * v[rows, g]).sum(0) / e.sum()
    if gate is not None:
        o *= sigmoid64(gate)
    return o


def ref_conv(x, w, state):
    K = w.shape[1]
    xx = np.concatenate([state, x]).astype(np.float64)
    y = np.zeros(x.shape)
    for t in range(x.shape[0]):
        for j in range(K):
            y[t] += w[:, j] * xx[t + j]
    return y * sigmoid64(y), xx[xx.shape[0] - (K - 1) :]


def ref_gdn(q, k, v, g, beta, state):
    """Reference 4.5 per token, vectorised over value heads; value head h uses key head h % Hk."""
    T, Hk, dk = q.shape
    Hv = v.shape[1]
    heads = np.arange(Hv) % Hk
    q = q.astype(np.float64)[:, heads]
    k = k.astype(np.float64)[:, heads]
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    S = state.astype(np.float64).copy()
    o = np.zeros(v.shape)
    for t in range(T):
        S *= np.exp(g[t].astype(np.float64))[:, None, None]
        kv = np.einsum("hij,hi->hj", S, k[t])
        delta = (v[t] - kv) * beta[t][:, None]
        S += k[t][:, :, None] * delta[:, None, :]
        o[t] = np.einsum("hij,hi->hj", S, q[t])
    return o, S


def gdn_inputs(rng, T, Hk, Hv, dk, dv, g_scale=1.0):
    return {
        "q": f32(rng, T, Hk, dk),
        "k": f32(rng, T, Hk, dk),
        "v": f32(rng, T, Hv, dv),
        "g": (-rng.random((T, Hv)) * g_scale).astype(np.float32),
        "beta": rng.random((T, Hv)).astype(np.float32),
    }


# ---- norms ----


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (5, 33), (3, 4, 64), (2, 2048)])
def test_rms_norm(shape, rng):
    x = f32(rng, *shape)
    w = f32(rng, shape[-1])
    want = ref_rms_norm(x, w, 1e-6)
    for isa in ISAS:
        check_close(ops.rms_norm(x, w, 1e-6, isa=isa), want, TOL_NORM, f"rms_norm {isa} {shape}")


def test_rms_norm_adversarial(rng):
    w = f32(rng, 37)
    for isa in ISAS:
        assert not ops.rms_norm(np.zeros((2, 37), np.float32), w, 1e-6, isa=isa).any()
        for scale in (1e-20, 1e15):
            x = f32(rng, 3, 37, scale=scale)
            check_close(
                ops.rms_norm(x, w, 1e-6, isa=isa), ref_rms_norm(x, w, 1e-6), TOL_NORM, f"{isa} x{scale:g}"
            )
        # in place through out=
        x = f32(rng, 4, 37)
        want = ref_rms_norm(x, w, 1e-5)
        y = ops.rms_norm(x, w, 1e-5, out=x, isa=isa)
        assert y is x or np.shares_memory(y, x)
        check_close(x, want, TOL_NORM, f"rms_norm in place {isa}")


@pytest.mark.parametrize("shape", [(1, 1, 5), (3, 4, 128), (2, 3, 20)])
def test_gated_rms_norm(shape, rng):
    o = f32(rng, *shape)
    z = f32(rng, *shape, scale=3.0)
    z.flat[:4] = [100.0, -100.0, 30.0, -30.0]  # silu saturates without overflow
    w = f32(rng, shape[-1])
    want = ref_gated_rms_norm(o, z, w, 1e-6)
    for isa in ISAS:
        check_close(
            ops.gated_rms_norm(o, z, w, 1e-6, isa=isa), want, TOL_NORM, f"gated_rms_norm {isa} {shape}"
        )


# ---- RoPE ----


@pytest.mark.parametrize("n_rot,D", [(64, 256), (6, 10), (8, 8), (0, 4)])
def test_rope(n_rot, D, rng):
    T, H = 5, 3
    x = f32(rng, T, H, D)
    pos = np.array([0, 1, 7, 4095, 131071][:T], np.int32)
    want = ref_rope(x, pos, n_rot, 1e7)
    y = x.copy()
    assert ops.rope_neox(y, pos, n_rot, 1e7) is y
    check_close(y, want, TOL_ROPE, f"rope n_rot={n_rot} D={D}")
    assert np.array_equal(y[..., n_rot:], x[..., n_rot:])  # untouched dims, bit for bit


def test_rope_large_positions_are_exact(rng):
    # float32 angles would be off by ~4e-3 rad here; every rotated value is checked per element
    x = f32(rng, 1, 1, 64)
    pos = np.array([131071], np.int32)
    want = ref_rope(x, pos, 64, 1e4)
    y = ops.rope_neox(x.copy(), pos, 64, 1e4)
    assert np.abs(y - want).max() < 1e-5 * np.abs(x).max() * 4


# ---- attention ----

ATTN_CASES = [
    # T, Hq, Hkv, D, S, n_kv, first position, mask, block
    (1, 2, 1, 8, 16, 16, 15, "causal", 1),
    (4, 4, 2, 20, 40, 36, 32, "block_causal", 4),  # D not a multiple of 8; last block partly in cache
    (6, 8, 2, 64, 80, 70, 64, "block_causal", 8),
    (7, 16, 2, 36, 100, 100, 93, "causal", 1),  # 8 query heads per kv head
    (5, 3, 3, 16, 64, 40, 2, "causal", 1),  # Hq == Hkv; queries early in a longer cache
    # >= 8 query rows per kv head (and above: (4, 4, 2, ...), (6, 8, 2, ...)): the AVX-512 kernel with query rows in lanes
    (24, 4, 2, 64, 300, 290, 260, "causal", 1),  # several key tiles, the last one partial
    (17, 3, 3, 20, 100, 90, 70, "block_causal", 8),  # 17 rows: a lane group of 1; D = 20
    (16, 16, 1, 36, 90, 90, 60, "causal", 1),  # 16 query heads per kv head
]


@pytest.mark.parametrize("case", ATTN_CASES)
@pytest.mark.parametrize("kv", ["f32", "f16", "u16"])
def test_attention(case, kv, rng):
    T, Hq, Hkv, D, S, n_kv, p0, mask, block = case
    q = f32(rng, T, Hq, D)
    k = f32(rng, S, Hkv, D)
    v = f32(rng, S, Hkv, D)
    gate = f32(rng, T, Hq, D, scale=2.0)
    if kv != "f32":
        k, v = k.astype(np.float16), v.astype(np.float16)
    pos = np.arange(p0, p0 + T, dtype=np.int32)
    scale = 1 / np.sqrt(D)
    want = ref_attention(q, k, v, pos, n_kv, mask, block, scale)
    want_gated = want * sigmoid64(gate)
    if kv == "u16":
        k, v = k.view(np.uint16), v.view(np.uint16)
    for isa in ISAS:
        got = ops.attention(q, k, v, pos, n_kv, mask=mask, block_length=block, isa=isa)
        check_close(got, want, TOL_ATTN, f"attention {isa} {kv} {case}")
        got = ops.attention(q, k, v, pos, n_kv, mask=mask, block_length=block, gate=gate, isa=isa)
        check_close(got, want_gated, TOL_ATTN, f"gated attention {isa} {kv} {case}")


# A Q8_0 cache holds each value as d * q with q in [-127, 127] and d = max|x| / 127 over 32 values:
# an error of at most d/2 per value, about 0.4% of the block's largest value.
TOL_ATTN_Q8 = 2e-2  # against attention over the unquantized float32 cache
Q8_CASES = [
    (1, 2, 1, 32, 16, 16, 15, "causal", 1),
    (6, 8, 2, 64, 80, 70, 64, "block_causal", 8),
    (3, 16, 2, 256, 100, 100, 93, "causal", 1),  # the Clover head dim, 8 query heads per kv head
    (5, 3, 3, 96, 64, 40, 2, "block_causal", 32),
    (12, 16, 2, 256, 100, 100, 80, "block_causal", 8),  # query rows in lanes
]


def q8_cache(x):
    """[S, Hkv, D] float32 -> uint8 [S, Hkv, D/32*34] Q8_0 cache rows (and their dequantized values)."""
    S, H, D = x.shape
    blocks = kernels.quantize(x.reshape(S * H, D), "q8_0")
    return blocks.reshape(S, H, -1), kernels.dequantize(blocks, "q8_0").reshape(S, H, D)


@pytest.mark.parametrize("case", Q8_CASES)
def test_attention_q8_0(case, rng):
    T, Hq, Hkv, D, S, n_kv, p0, mask, block = case
    q = f32(rng, T, Hq, D)
    k, v = f32(rng, S, Hkv, D), f32(rng, S, Hkv, D)
    k[3, 0, :32] = 0.0  # an all-zero block (scale 0)
    v[1, -1, -32:] = 1e4  # a large one
    gate = f32(rng, T, Hq, D, scale=2.0)
    kq, kd = q8_cache(k)
    vq, vd = q8_cache(v)
    pos = np.arange(p0, p0 + T, dtype=np.int32)
    scale = 1 / np.sqrt(D)
    exact = ref_attention(q, kd, vd, pos, n_kv, mask, block, scale) * sigmoid64(gate)  # the cache's own values
    unquantized = ref_attention(q, k, v, pos, n_kv, mask, block, scale) * sigmoid64(gate)
    for isa in ISAS:
        got = ops.attention(q, kq, vq, pos, n_kv, mask=mask, block_length=block, gate=gate, isa=isa)
        check_close(got, exact, TOL_ATTN, f"attention q8_0 {isa} {case}")
        check_close(got, unquantized, TOL_ATTN_Q8, f"attention q8_0 vs f32 cache {isa} {case}")


@pytest.mark.parametrize("T", [3, 16])  # 16 tokens x 2 query heads per kv head: rows in lanes
def test_attention_adversarial(T, rng):
    Hq, Hkv, D, S = 4, 2, 24, 50
    k = f32(rng, S, Hkv, D)
    v = f32(rng, S, Hkv, D)
    pos = np.resize(np.array([40, 41, 3, 0, 45], np.int32), T)  # positions in any order
    for isa in ISAS:
        # peaked softmax: scores in the thousands need the max subtraction. A float32 score of size s
        # is only known to a few ulps (s 2^-23 each; 4 allowed): an absolute error that exp() turns
        # into a relative error of the weights, so the tolerance grows with the largest score (how a
        # kernel orders its D products moves the result by that much).
        q = f32(rng, T, Hq, D, scale=300.0)
        want = ref_attention(q, k, v, pos, S, "causal", 1, 1 / np.sqrt(D))
        kk = np.repeat(k, Hq // Hkv, 1).astype(np.float64)
        seen = np.arange(S)[None, None, :] <= pos[:, None, None]  # the keys each row sees (causal)
        s_max = np.abs(np.einsum("thd,shd->ths", q.astype(np.float64), kk) * seen).max() / np.sqrt(D)
        tol = TOL_ATTN + 4 * 2.0**-23 * s_max
        check_close(ops.attention(q, k, v, pos, S, isa=isa), want, tol, f"peaked {isa}")
        # no visible row (n_kv = 0): zeros; rows at and past n_kv are never read
        assert not ops.attention(q, k, v, pos, 0, isa=isa).any()
        k_nan = k.copy()
        k_nan[20:] = np.nan
        v_nan = v.copy()
        v_nan[20:] = np.inf
        got = ops.attention(q, k_nan, v_nan, pos, 20, mask="block_causal", block_length=32, isa=isa)
        want = ref_attention(q, k, v, pos, 20, "block_causal", 32, 1 / np.sqrt(D))
        check_close(got, want, TOL_ATTN, f"n_kv bound {isa}")


def test_attention_block_causal_sees_own_block(rng):
    # a token early in its block must see the later tokens of the same block, not the next block
    D, B = 16, 4
    q = f32(rng, 1, 1, D)
    k = f32(rng, 12, 1, D)
    v = np.zeros((12, 1, D), np.float32)
    v[7] = 1.0  # only row 7 (same block as position 5) carries signal
    for isa in ISAS:
        o = ops.attention(q, k, v, np.array([5], np.int32), 12, mask="block_causal", block_length=B, isa=isa)
        assert o.max() > 0
        o = ops.attention(q, k, v, np.array([5], np.int32), 12, mask="causal", isa=isa)
        assert not o.any()


@pytest.mark.parametrize(
    "kv,D,T,Hq,mask",
    [
        ("f16", 40, 9, 8, "block_causal"),  # 36 query rows per kv head: rows in lanes
        ("q8_0", 64, 9, 8, "block_causal"),
        ("f16", 40, 3, 4, "block_causal"),  # 6 rows: the head-in-lanes kernel, heads split across threads
        ("f32", 24, 40, 2, "causal"),  # lanes; one task's limits span two key tiles (rows skip a tile)
        ("f16", 64, 1, 16, "causal"),  # a decode step, 8 query heads per kv head: lanes, heads split
    ],
)
def test_attention_threads(kv, D, T, Hq, mask, rng, threads):
    S = 70
    q = f32(rng, T, Hq, D)
    if kv == "q8_0":
        k, _ = q8_cache(f32(rng, S, 2, D))
        v, _ = q8_cache(f32(rng, S, 2, D))
    else:
        k, v = f32(rng, S, 2, D), f32(rng, S, 2, D)
        if kv == "f16":
            k, v = k.astype(np.float16), v.astype(np.float16)
    pos = np.arange(S - T, S, dtype=np.int32)
    for isa in ISAS:
        outs = []
        for n in (1, 2, 3):
            threads(n)
            outs.append(ops.attention(q, k, v, pos, S, mask=mask, block_length=8, isa=isa))
        assert all(np.array_equal(outs[0], o) for o in outs[1:]), isa


# ---- causal conv ----


# (from 64 tokens the driver splits by ranges of 16 tokens, not of channels: csrc/model_ops.cpp)
@pytest.mark.parametrize("T,C,K", [(1, 8, 4), (2, 13, 4), (9, 40, 4), (5, 70, 1), (6, 16, 3), (3, 620, 4), (2, 530, 3),
                                   (64, 40, 4), (67, 530, 3), (200, 13, 4), (130, 70, 1)])
def test_conv1d_silu(T, C, K, rng):
    x = f32(rng, T, C, scale=2.0)
    w = f32(rng, C, K)
    state0 = f32(rng, K - 1, C)
    want, want_state = ref_conv(x, w, state0)
    for isa in ISAS:
        state = state0.copy()
        check_close(ops.conv1d_silu(x, w, state, update_state=False, isa=isa), want, TOL_CONV, f"conv {isa}")
        assert np.array_equal(state, state0)
        check_close(ops.conv1d_silu(x, w, state, isa=isa), want, TOL_CONV, f"conv {isa}")
        assert np.array_equal(state, want_state.astype(np.float32))


@pytest.mark.parametrize("T,C,pieces", [(11, 24, ([4], [1, 2, 3], list(range(1, 11)))),
                                         (150, 530, ([64], [50, 100], [1, 80], [149]))])
def test_conv1d_pieces(T, C, pieces, rng):
    # (150 tokens: split by tokens whole, by channels in pieces under 64 tokens; the same sums either way)
    K = 4
    x = f32(rng, T, C)
    w = f32(rng, C, K)
    for isa in ISAS:
        whole_state = np.zeros((K - 1, C), np.float32)
        whole = ops.conv1d_silu(x, w, whole_state, isa=isa)
        for cuts in pieces:
            state = np.zeros((K - 1, C), np.float32)
            bounds = [0, *cuts, T]
            parts = [ops.conv1d_silu(x[a:b], w, state, isa=isa) for a, b in zip(bounds, bounds[1:])]
            assert np.array_equal(np.concatenate(parts), whole), (isa, cuts)
            assert np.array_equal(state, whole_state)


# ---- gated delta rule ----

GDN_CASES = [
    # T, Hk, Hv, dk, dv
    (1, 2, 4, 16, 16),
    (5, 1, 1, 12, 20),  # head dims not multiples of 8
    (37, 2, 4, 32, 40),
    (130, 2, 4, 16, 24),  # three chunks, the last of 2 tokens
]


@pytest.mark.parametrize("case", GDN_CASES)
@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_gdn(case, mode, rng):
    T, Hk, Hv, dk, dv = case
    a = gdn_inputs(rng, T, Hk, Hv, dk, dv)
    state0 = f32(rng, Hv, dk, dv, scale=0.5)
    want, want_state = ref_gdn(**a, state=state0)
    for isa in ISAS:
        state = state0.copy()
        o = ops.gated_delta_rule(**a, state=state, mode=mode, isa=isa)
        check_close(o, want, TOL_GDN, f"gdn {mode} {isa} {case}")
        check_close(state, want_state, TOL_GDN, f"gdn state {mode} {isa} {case}")


def test_gdn_value_heads_are_tiled(rng):
    # value head h uses key head h % Hk: with Hk = 2, heads 0 and 2 share key head 0, 1 and 3 key head 1
    T, Hk, Hv, d = 6, 2, 4, 8
    a = gdn_inputs(rng, T, Hk, Hv, d, d)
    a["v"][:, 2] = a["v"][:, 0]
    a["g"][:, 2] = a["g"][:, 0]
    a["beta"][:, 2] = a["beta"][:, 0]
    for isa in ISAS:
        o = ops.gated_delta_rule(**a, state=np.zeros((Hv, d, d), np.float32), isa=isa)
        assert np.array_equal(o[:, 0], o[:, 2])


@pytest.mark.parametrize("isa", ISAS)
def test_gdn_adversarial(isa, rng):
    T, Hk, Hv, dk, dv = 70, 2, 4, 16, 16
    a = gdn_inputs(rng, T, Hk, Hv, dk, dv)
    a["g"][:, 0] = -80.0  # decay underflows to 0 in float32 (exp(-80) ~ 2e-35, then e^G of the chunk is 0)
    a["g"][10:20, 1] = -1e4
    a["g"][:, 2] = 0.0  # no decay
    a["beta"][:, 2] = 1.0
    a["beta"][:, 3] = 0.0  # no writes: the state only decays
    a["beta"][::3, 1] = 1.0
    a["k"][5] = 0.0  # a zero key (the 1e-6 inside the norm keeps it finite)
    a["q"][7] *= 1e6
    state0 = f32(rng, Hv, dk, dv)
    want, want_state = ref_gdn(**a, state=state0)
    for mode in ("recurrent", "chunked"):
        state = state0.copy()
        o = ops.gated_delta_rule(**a, state=state, mode=mode, isa=isa)
        assert np.isfinite(o).all() and np.isfinite(state).all()
        check_close(o, want, TOL_GDN, f"gdn adversarial {mode} {isa}")
        check_close(state, want_state, TOL_GDN, f"gdn adversarial state {mode} {isa}")


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130])
def test_gdn_chunked_equals_recurrent_clover_heads(T, rng):
    # Clover head sizes (dk = dv = 128, two value heads per key head), fewer heads to stay fast
    Hk, Hv, d = 2, 4, 128
    a = gdn_inputs(rng, T, Hk, Hv, d, d)
    state0 = f32(rng, Hv, d, d, scale=0.1)
    for isa in ISAS:
        s_rec, s_chk = state0.copy(), state0.copy()
        o_rec = ops.gated_delta_rule(**a, state=s_rec, mode="recurrent", isa=isa)
        o_chk = ops.gated_delta_rule(**a, state=s_chk, mode="chunked", isa=isa)
        check_close(o_chk, o_rec, TOL_GDN_FORMS, f"chunked vs recurrent {isa} T={T}")
        check_close(s_chk, s_rec, TOL_GDN_FORMS, f"chunked vs recurrent state {isa} T={T}")


@pytest.mark.parametrize("mode", ["recurrent", "chunked", "auto"])
def test_gdn_speculative_then_commit(mode, rng):
    T, Hk, Hv, dk, dv = 20, 2, 4, 16, 24
    a = gdn_inputs(rng, T, Hk, Hv, dk, dv)
    state0 = f32(rng, Hv, dk, dv)
    for isa in ISAS:
        state = state0.copy()
        spec = ops.gated_delta_rule(**a, state=state, update_state=False, mode=mode, isa=isa)
        assert np.array_equal(state, state0)  # untouched, bit for bit
        spec2 = ops.gated_delta_rule(**a, state=state, update_state=False, mode=mode, isa=isa)
        assert np.array_equal(spec, spec2)
        commit = ops.gated_delta_rule(**a, state=state, mode=mode, isa=isa)
        assert np.array_equal(spec, commit)
        assert not np.array_equal(state, state0)
    # a read-only state is fine for a speculative run
    ro = state0.copy()
    ro.flags.writeable = False
    ops.gated_delta_rule(**a, state=ro, update_state=False, mode=mode)


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_gdn_pieces(mode, rng):
    T, Hk, Hv, dk, dv = 100, 2, 4, 16, 16
    a = gdn_inputs(rng, T, Hk, Hv, dk, dv)
    state0 = f32(rng, Hv, dk, dv)
    for isa in ISAS:
        s_whole = state0.copy()
        whole = ops.gated_delta_rule(**a, state=s_whole, mode=mode, isa=isa)
        for cut in (1, 37, 64):
            s = state0.copy()
            first = ops.gated_delta_rule(**{n: x[:cut] for n, x in a.items()}, state=s, mode=mode, isa=isa)
            second = ops.gated_delta_rule(**{n: x[cut:] for n, x in a.items()}, state=s, mode=mode, isa=isa)
            tol = 0 if mode == "recurrent" else TOL_GDN_FORMS  # chunk boundaries move with the cut
            check_close(np.concatenate([first, second]), whole, tol, f"pieces {mode} {isa} cut={cut}")
            check_close(s, s_whole, tol, f"pieces state {mode} {isa} cut={cut}")


def test_gdn_auto_mode(rng):
    # "auto" is the form measured faster for the ISA's kernels: recurrent for the SIMD tables (avx512 runs
    # the AVX2 model operators; neon keeps AVX2's choice), chunked for the scalar one
    a = gdn_inputs(rng, 9, 2, 4, 16, 16)
    for isa in ISAS:
        form = "chunked" if isa == "ref" else "recurrent"
        s1, s2 = np.zeros((4, 16, 16), np.float32), np.zeros((4, 16, 16), np.float32)
        auto = ops.gated_delta_rule(**a, state=s1, mode="auto", isa=isa)
        assert np.array_equal(auto, ops.gated_delta_rule(**a, state=s2, mode=form, isa=isa)), isa


def test_gdn_threads(rng, threads):
    T, Hk, Hv, dk, dv = 70, 2, 6, 16, 16
    a = gdn_inputs(rng, T, Hk, Hv, dk, dv)
    state0 = f32(rng, Hv, dk, dv)
    for isa in ISAS:
        for mode in ("recurrent", "chunked"):
            outs = []
            for n in (1, 2, 3):
                threads(n)
                s = state0.copy()
                outs.append((ops.gated_delta_rule(**a, state=s, mode=mode, isa=isa), s))
            assert all(np.array_equal(outs[0][0], o) and np.array_equal(outs[0][1], s) for o, s in outs[1:])


def test_set_isa_selects_model_ops(rng):
    # isa=None follows _core.set_isa (the same switch as the matmul kernels)
    a = gdn_inputs(rng, 9, 1, 2, 12, 12)
    x = f32(rng, 3, 37)
    w = f32(rng, 37)
    active = clover_cpu.system_info()["isa"]
    try:
        for isa in ISAS:
            _core.set_isa(isa)
            s1, s2 = np.zeros((2, 12, 12), np.float32), np.zeros((2, 12, 12), np.float32)
            assert np.array_equal(
                ops.gated_delta_rule(**a, state=s1), ops.gated_delta_rule(**a, state=s2, isa=isa)
            )
            assert np.array_equal(ops.rms_norm(x, w, 1e-6), ops.rms_norm(x, w, 1e-6, isa=isa))
    finally:
        _core.set_isa(active)


# ---- router, SwiGLU, gates ----


def ref_router(logits, k):
    lg = logits.astype(np.float64)
    p = np.exp(lg - lg.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = np.stack([sorted(range(p.shape[1]), key=lambda e: (-p[t, e], e))[:k] for t in range(p.shape[0])])
    w = np.take_along_axis(p, ids, 1)
    return ids, w / w.sum(-1, keepdims=True)


@pytest.mark.parametrize("T,E,k", [(1, 8, 1), (5, 256, 8), (3, 10, 10), (4, 33, 5)])
def test_router_topk(T, E, k, rng):
    logits = f32(rng, T, E, scale=3.0)
    want_ids, want_w = ref_router(logits, k)
    ids, w = ops.router_topk(logits, k)
    assert ids.dtype == np.int32 and w.dtype == np.float32
    assert np.array_equal(ids, want_ids)
    check_close(w, want_w, TOL_ELEMENTWISE, "router weights")
    assert np.allclose(w.sum(-1), 1.0, atol=1e-6)


def test_router_ties_and_extremes():
    logits = np.zeros((2, 6), np.float32)
    logits[1] = [1.0, 5.0, 1.0, 5.0, 1.0, -1e30]
    ids, w = ops.router_topk(logits, 3)
    assert ids.tolist() == [[0, 1, 2], [1, 3, 0]]  # equal probabilities: the lower index first
    check_close(w[0], np.full(3, 1 / 3), TOL_ELEMENTWISE, "ties")
    ids, w = ops.router_topk(np.array([[1e4, 0.0, -1e4]], np.float32), 2)
    assert ids.tolist() == [[0, 1]] and w[0, 0] == 1.0 and np.isfinite(w).all()


@pytest.mark.parametrize("n", [1, 7, 8, 100, 3 * 512 + 5])
def test_swiglu_sigmoid_mul(n, rng):
    g = f32(rng, n, scale=4.0)
    g[: min(n, 4)] = [120.0, -120.0, 88.0, -90.0][: min(n, 4)]
    u = f32(rng, n)
    g64 = g.astype(np.float64)
    for isa in ISAS:
        check_close(ops.swiglu(g, u, isa=isa), g64 * sigmoid64(g) * u, TOL_ELEMENTWISE, f"swiglu {isa} n={n}")
        check_close(
            ops.sigmoid_mul(u, g, isa=isa), u * sigmoid64(g), TOL_ELEMENTWISE, f"sigmoid_mul {isa} n={n}"
        )
    x2 = f32(rng, 3, 2, 11)
    check_close(ops.swiglu(x2, x2), x2 * sigmoid64(x2) * x2, TOL_ELEMENTWISE, "swiglu 3-D")


def test_gdn_gates(rng):
    T, Hv = 4, 6
    a = f32(rng, T, Hv, scale=10.0)
    a[0] = [19.9, 20.0, 20.1, 25.0, -30.0, -100.0]
    b = f32(rng, T, Hv, scale=5.0)
    dt_bias = np.zeros(Hv, np.float32)
    dt_bias[1:] = f32(rng, Hv - 1)
    dt_bias[:1] = 0
    ssm_a = -np.exp(f32(rng, Hv))
    g, beta = ops.gdn_gates(a, b, dt_bias, ssm_a)
    x = a.astype(np.float64) + dt_bias
    softplus = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    check_close(g, ssm_a * softplus, TOL_ELEMENTWISE, "g")
    check_close(beta, sigmoid64(b), TOL_ELEMENTWISE, "beta")
    assert (g <= 0).all()


# ---- bad input ----


def test_bad_input(rng):
    x = f32(rng, 4, 16)
    w = f32(rng, 16)
    with pytest.raises(ValueError, match="float32"):
        ops.rms_norm(x.astype(np.float64), w, 1e-6)
    with pytest.raises(ValueError, match="shape"):
        ops.rms_norm(x, f32(rng, 15), 1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        ops.rms_norm(f32(rng, 4, 32)[:, ::2], w, 1e-6)
    with pytest.raises(ValueError, match="shape"):
        ops.rms_norm(x, w, 1e-6, out=np.zeros((4, 8), np.float32))
    with pytest.raises(ValueError, match="not available"):
        ops.rms_norm(x, w, 1e-6, isa="sparc")
    with pytest.raises(ValueError, match="shape"):
        ops.gated_rms_norm(x, f32(rng, 4, 8), w, 1e-6)
    with pytest.raises(ValueError, match="even"):
        ops.rope_neox(f32(rng, 2, 1, 8), np.zeros(2, np.int32), 3, 1e4)
    with pytest.raises(ValueError, match="int32"):
        ops.rope_neox(f32(rng, 2, 1, 8), np.zeros(2, np.int64), 4, 1e4)
    ro = f32(rng, 2, 1, 8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        ops.rope_neox(ro, np.zeros(2, np.int32), 4, 1e4)
    with pytest.raises(ValueError, match="int32"):
        ops.router_topk(x.astype(np.int32), 2)
    with pytest.raises(ValueError, match="k must be"):
        ops.router_topk(x, 17)
    with pytest.raises(ValueError, match="shape"):
        ops.swiglu(x, f32(rng, 4, 15))
    with pytest.raises(ValueError, match="shape"):
        ops.gdn_gates(x, x, f32(rng, 3), f32(rng, 16))


def test_bad_attention_input(rng):
    q = f32(rng, 2, 4, 8)
    k = f32(rng, 10, 2, 8)
    pos = np.array([8, 9], np.int32)
    with pytest.raises(ValueError, match="dtype"):
        ops.attention(q, k.astype(np.float64), k.astype(np.float64), pos, 10)
    with pytest.raises(ValueError, match="dtype of k_cache"):
        ops.attention(q, k, k.astype(np.float16), pos, 10)
    with pytest.raises(ValueError, match="multiple of the kv heads"):
        ops.attention(f32(rng, 2, 3, 8), k, k, pos, 10)
    with pytest.raises(ValueError, match="head dim"):
        ops.attention(f32(rng, 2, 4, 16), k, k, pos, 10)
    with pytest.raises(ValueError, match="n_kv"):
        ops.attention(q, k, k, pos, 11)
    with pytest.raises(ValueError, match="q_pos must be >= 0"):
        ops.attention(q, k, k, np.array([-1, 0], np.int32), 10)
    with pytest.raises(ValueError, match="mask"):
        ops.attention(q, k, k, pos, 10, mask="sliding")
    with pytest.raises(ValueError, match="contiguous"):
        ops.attention(q, f32(rng, 10, 4, 8)[:, ::2], k, pos, 10)
    with pytest.raises(ValueError, match="shape"):
        ops.attention(q, k, k, pos, 10, gate=f32(rng, 2, 4, 7))
    with pytest.raises(ValueError, match="block_length"):
        ops.attention(q, k, k, pos, 10, mask="block_causal", block_length=0)
    # Q8_0 caches: uint8 blocks, a head dim that is a multiple of 32, D / 32 * 34 bytes per head
    kq = np.zeros((10, 2, 34), np.uint8)
    with pytest.raises(ValueError, match="multiple of 32"):
        ops.attention(q, kq, kq, pos, 10)
    with pytest.raises(ValueError, match="bytes per head"):
        ops.attention(f32(rng, 2, 4, 32), np.zeros((10, 2, 32), np.uint8), np.zeros((10, 2, 32), np.uint8), pos, 10)
    ops.attention(f32(rng, 2, 4, 32), kq, kq, pos, 10)  # the right layout runs


def test_bad_conv_gdn_input(rng):
    x = f32(rng, 3, 8)
    w = f32(rng, 8, 4)
    with pytest.raises(ValueError, match="shape"):
        ops.conv1d_silu(x, w, f32(rng, 4, 8))
    with pytest.raises(ValueError, match=r"\[C, K\]"):
        ops.conv1d_silu(x, f32(rng, 7, 4), f32(rng, 3, 8))
    ro = f32(rng, 3, 8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        ops.conv1d_silu(x, w, ro)
    ops.conv1d_silu(x, w, ro, update_state=False)

    a = gdn_inputs(rng, 3, 2, 4, 8, 8)
    state = np.zeros((4, 8, 8), np.float32)
    with pytest.raises(ValueError, match="multiple of the key heads"):
        three = dict(a, v=f32(rng, 3, 3, 8), g=a["g"][:, :3].copy(), beta=a["beta"][:, :3].copy())
        ops.gated_delta_rule(**three, state=state[:3])
    with pytest.raises(ValueError, match="state must have shape"):
        ops.gated_delta_rule(**a, state=np.zeros((4, 8, 9), np.float32))
    with pytest.raises(ValueError, match="g must have shape"):
        ops.gated_delta_rule(**dict(a, g=a["g"][:2].copy()), state=state)
    with pytest.raises(ValueError, match="mode"):
        ops.gated_delta_rule(**a, state=state, mode="parallel")
    with pytest.raises(ValueError, match="float32"):
        ops.gated_delta_rule(**a, state=state.astype(np.float64))
    with pytest.raises(ValueError, match="contiguous"):
        ops.gated_delta_rule(**dict(a, q=np.asfortranarray(a["q"])), state=state)
