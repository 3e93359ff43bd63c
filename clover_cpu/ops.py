"""The operators of the Clover forward pass, in C++ (scalar, AVX2, NEON), threaded over rows or heads.

Every array is float32 and C-contiguous, token-major ([T, ...]); every function raises ValueError on a
wrong dtype, shape or layout, and releases the GIL. Functions with an ``isa`` keyword have a scalar
("ref") and a SIMD path ("avx2", whose table "avxvnni", "avx512" and "amx" share; "neon"); ``isa=None`` runs the active one (``CLOVER_ISA`` or the best available).
Results do not depend on the number of threads. The math follows
/work/shared/reference/qwen35moe-forward.md sections 3-6 (transformers' ``qwen3_5_moe``).
"""

from __future__ import annotations

import numpy as np

from . import _core

GDN_CHUNK = 64
"""Tokens per chunk of the chunked (WY) gated delta rule."""


def rms_norm(
    x: np.ndarray, w: np.ndarray, eps: float, *, out: np.ndarray | None = None, isa: str | None = None
) -> np.ndarray:
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis of x ([..., D]; w [D]).

    The GGUF stores 1 + w for the zero-centred norms, so w is used as stored. Per head: pass
    x [T, H, D]. ``out`` (same shape, may be x itself) receives the result.
    """
    return _core.rms_norm(x, w, eps, out, isa=isa)


def gated_rms_norm(
    o: np.ndarray,
    z: np.ndarray,
    w: np.ndarray,
    eps: float,
    *,
    out: np.ndarray | None = None,
    isa: str | None = None,
) -> np.ndarray:
    """y = w * rmsnorm(o) * silu(z) over the last axis (the GDN output norm, not zero-centred).

    o, z [..., dv] of the same shape (e.g. [T, Hv, dv]); w [dv].
    """
    return _core.gated_rms_norm(o, z, w, eps, out, isa=isa)


def rope_neox(x: np.ndarray, positions: np.ndarray, n_rot: int, theta: float) -> np.ndarray:
    """Rotate-half (NeoX) RoPE in place on the first n_rot dims of every head of x [T, H, D].

    positions int32 [T]; inv_freq_i = theta^(-2i/n_rot) for i < n_rot/2; dims (i, i + n_rot/2) rotate
    by positions[t] * inv_freq_i; dims >= n_rot are untouched. Angles are computed in double (float32
    angles would be off by up to 4e-3 rad at position 131072). Returns x.
    """
    _core.rope_neox(x, positions, int(n_rot), float(theta))
    return x


def attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    q_pos: np.ndarray,
    n_kv: int,
    *,
    mask: str = "causal",
    block_length: int = 32,
    scale: float | None = None,
    gate: np.ndarray | None = None,
    isa: str | None = None,
) -> np.ndarray:
    """Grouped-query attention of q [T, Hq, D] over the first n_kv rows of a KV cache [S, Hkv, D].

    The cache row index is the absolute position. Query head h uses kv head h // (Hq / Hkv).
    q_pos int32 [T] (>= 0) are the queries' positions. mask "causal": a query at p sees rows s <= p;
    "block_causal": rows with s // block_length <= p // block_length (earlier blocks and its whole own
    block). Rows >= n_kv are never read; a query that sees no row gets zeros. Softmax in float32 with
    max subtraction; scale defaults to 1/sqrt(D). The caches are float32, float16 (np.float16, or
    uint16 holding float16 bits), or uint8 [S, Hkv, D/32*34] holding ggml Q8_0 blocks (D a multiple of
    32; `kernels.quantize(rows, "q8_0")` writes them), k and v of the same dtype. gate [T, Hq, D] (optional): the output is
    multiplied by sigmoid(gate) (the gated attention's output gate). Returns o [T, Hq, D].
    """
    return _core.attention(
        q, k_cache, v_cache, q_pos, int(n_kv), mask, int(block_length), scale, gate, isa=isa
    )


def conv1d_silu(
    x: np.ndarray, w: np.ndarray, state: np.ndarray, *, update_state: bool = True, isa: str | None = None
) -> np.ndarray:
    """Causal depthwise conv with SiLU: y[t, c] = silu(sum_j w[c, j] * xx[t + j, c]).

    x [T, C]; w [C, K] (GGUF ssm_conv1d layout: tap K-1 multiplies the current token); state [K-1, C]
    holds the K-1 raw inputs before x, oldest first; xx = concat(state, x). With update_state, state
    becomes the last K-1 rows of xx (in place). Returns y [T, C].
    """
    return _core.conv1d_silu(x, w, state, update_state, isa=isa)


def gated_delta_rule(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    *,
    update_state: bool = True,
    mode: str = "auto",
    isa: str | None = None,
) -> np.ndarray:
    """The gated delta rule of the GDN layers; returns o [T, Hv, dv].

    q, k [T, Hk, dk]; v [T, Hv, dv]; g [T, Hv] (log decay, <= 0); beta [T, Hv]; state [Hv, dk, dv].
    Value head h uses key head h % Hk (the GGUF's tiled value-head order, as llama.cpp). q and k are
    L2-normalised here (x * rsqrt(sum(x^2) + 1e-6)), q scaled by 1/sqrt(dk). Per token:
    S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q. update_state=False works on a copy and
    leaves state untouched (the speculative scan of a block being denoised).
    mode: "recurrent" (token by token), "chunked" (WY form, chunks of GDN_CHUNK tokens) or "auto",
    the faster one measured for the ISA on Clover shapes: recurrent with AVX2 (2x faster at T=1, equal
    at T=8-32, ~10% faster at T=128-512), chunked with the scalar kernels (1.2-1.9x faster);
    see bench/bench_model_ops.py. A state whose address is a multiple of 64 bytes is updated in
    place; otherwise each head runs on an aligned copy.
    """
    return _core.gated_delta_rule(q, k, v, g, beta, state, update_state, mode, isa=isa)


def router_topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Softmax (float32) over E experts, top-k, renormalised to sum 1: (ids int32 [T, k], weights [T, k]).

    Selection is on the softmax probabilities (as transformers' router), highest first; equal
    probabilities are taken in increasing expert index (torch.topk on CPU does this in practice but
    does not promise it).
    """
    return _core.router_topk(logits, int(k))


def swiglu(
    gate: np.ndarray, up: np.ndarray, *, out: np.ndarray | None = None, isa: str | None = None
) -> np.ndarray:
    """silu(gate) * up, elementwise (same shapes)."""
    return _core.swiglu(gate, up, out, isa=isa)


def sigmoid_mul(
    x: np.ndarray, gate: np.ndarray, *, out: np.ndarray | None = None, isa: str | None = None
) -> np.ndarray:
    """x * sigmoid(gate), elementwise (same shapes)."""
    return _core.sigmoid_mul(x, gate, out, isa=isa)


def gdn_gates(
    a: np.ndarray, b: np.ndarray, dt_bias: np.ndarray, ssm_a: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The GDN gates: (g, beta), both [T, Hv].

    g = ssm_a * softplus(a + dt_bias) with torch's softplus (x > 20 gives x); ssm_a = -exp(A_log) as the
    GGUF stores it. beta = sigmoid(b). a, b [T, Hv]; dt_bias, ssm_a [Hv].
    """
    return _core.gdn_gates(a, b, dt_bias, ssm_a)


__all__ = [
    "GDN_CHUNK",
    "attention",
    "conv1d_silu",
    "gated_delta_rule",
    "gated_rms_norm",
    "gdn_gates",
    "rms_norm",
    "rope_neox",
    "router_topk",
    "sigmoid_mul",
    "swiglu",
]
