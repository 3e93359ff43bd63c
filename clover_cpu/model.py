"""The hybrid MoE forward pass (Qwen3.5-MoE backbone, Clover's block-causal attention) over a
memory-mapped GGUF, with exact caches: attention KV and Gated DeltaNet recurrent + conv state.

    x = embed[ids]
    for each layer: x += mixer(rmsnorm(x)); x += moe(rmsnorm(x))     # mixer: GDN or gated attention
    logits = lm_head(rmsnorm(x))

Spans run either speculatively (read the committed caches, write nothing) or committed (write
them), so a block-diffusion decoder can denoise a block many times and commit it once.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from . import kernels
from .config import Config
from .gguf_file import GGUFError, GGUFFile
from .tokenizer import Tokenizer

# ---- the math (float32 numpy; the matrix products run in the C++ kernels) ----


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis (w already holds 1 + w for zero-centred norms)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, theta: float) -> np.ndarray:
    """NeoX (rotate-half) RoPE on the first n_rot dims of each head. x: [T, H, D]."""
    half = n_rot // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) * 2 / n_rot)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32)[:, None, :], np.sin(ang).astype(np.float32)[:, None, :]
    out = x.copy()
    a, b = x[..., :half], x[..., half:n_rot]
    out[..., :half] = a * cos - b * sin
    out[..., half:n_rot] = b * cos + a * sin
    return out


def attention(q, k, v, q_pos, k_pos, block: int | None, scale: float) -> np.ndarray:
    """Softmax attention with grouped KV heads. q: [T, Hq, D]; k, v: [S, Hkv, D].
    block None: causal (k_pos <= q_pos); else block-causal (k_pos // block <= q_pos // block)."""
    hq, hkv = q.shape[1], k.shape[1]
    group = hq // hkv
    if block is None:
        allowed = k_pos[None, :] <= q_pos[:, None]
    else:
        allowed = (k_pos[None, :] // block) <= (q_pos[:, None] // block)
    out = np.empty(q.shape, np.float32)
    kf, vf = k.astype(np.float32), v.astype(np.float32)
    for g in range(hkv):
        qg = q[:, g * group : (g + 1) * group, :].transpose(1, 0, 2)  # [group, T, D]
        s = np.einsum("htd,sd->hts", qg, kf[:, g, :]) * scale
        s = np.where(allowed[None], s, -np.inf)
        s -= s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        out[:, g * group : (g + 1) * group, :] = np.einsum("hts,sd->htd", p, vf[:, g, :]).transpose(1, 0, 2)
    return out


def causal_conv_silu(x: np.ndarray, w: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv + SiLU. x: [T, C]; w: [C, K] (tap K-1 is the current token);
    state: the last K-1 raw inputs before x. Returns (y [T, C], the new state)."""
    k = w.shape[1]
    xx = np.concatenate([state, x], axis=0)
    y = np.zeros_like(x)
    for j in range(k):
        y += xx[j : j + x.shape[0]] * w[:, j]
    return silu(y), xx[xx.shape[0] - (k - 1) :].copy()


def gated_delta_rule(q, k, v, g, beta, state) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule, one token at a time. q, k: [T, Hk, dk]; v: [T, Hv, dv]; g, beta: [T, Hv];
    state: [Hv, dk, dv]. Value head h reads key head h % Hk. Returns (o [T, Hv, dv], the new state)."""
    hk, hv = q.shape[1], v.shape[1]
    heads = np.arange(hv) % hk
    q = l2norm(q)[:, heads] / np.sqrt(q.shape[-1])
    k = l2norm(k)[:, heads]
    s = state.copy()
    out = np.empty(v.shape, np.float32)
    for t in range(q.shape[0]):
        s *= np.exp(g[t])[:, None, None]
        kv = np.einsum("hkv,hk->hv", s, k[t])
        delta = beta[t][:, None] * (v[t] - kv)
        s += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", s, q[t])
    return out, s


# ---- weights and caches ----


@dataclass
class Matrix:
    """A 2-D weight in GGUF layout: rows of `fmt` blocks, multiplied by the C++ kernels."""

    data: np.ndarray  # uint8 [rows, row_bytes] (a view of the mapped file)
    fmt: str

    def __matmul__(self, x: np.ndarray) -> np.ndarray:  # W @ x^T, written x @ W^T
        raise TypeError("use mat(x, W)")


def mat(x: np.ndarray, w: Matrix) -> np.ndarray:
    """x [T, K] @ W^T -> [T, rows]."""
    return kernels.matmul(np.ascontiguousarray(x, dtype=np.float32), w.data, w.fmt)


@dataclass
class Experts:
    data: np.ndarray  # uint8 [E, rows, row_bytes]
    fmt: str


@dataclass
class Cache:
    """Per sequence: attention keys/values (F16) per attention layer, GDN recurrent state and conv state
    (F32) per GDN layer. `n` tokens are committed; positions are 0..n-1."""

    k: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [capacity, n_head_kv, head_dim]
    v: dict[int, np.ndarray] = field(default_factory=dict)
    ssm: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [Hv, dk, dv]
    conv: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [K-1, conv_dim]
    n: int = 0
    capacity_limit: int = 0
    tokens: list = field(default_factory=list)  # the committed token ids (positions 0..n-1)

    def reserve(self, layer: int, n_total: int, n_head_kv: int, head_dim: int, dtype) -> None:
        """Grow the KV arrays of a layer to hold n_total rows (doubling: allocated lazily up to the context)."""
        if n_total > self.capacity_limit:
            raise ValueError(f"context full: {n_total} tokens exceed the context length {self.capacity_limit}")
        cur = self.k.get(layer)
        if cur is not None and cur.shape[0] >= n_total:
            return
        cap = max(64, cur.shape[0] if cur is not None else 0)
        while cap < n_total:
            cap *= 2
        cap = min(cap, self.capacity_limit)
        for store in (self.k, self.v):
            new = np.zeros((cap, n_head_kv, head_dim), dtype)
            if layer in store:
                new[: self.n] = store[layer][: self.n]
            store[layer] = new

    def snapshot(self) -> "Cache":
        """A copy that later `restore` can return to (for a chat that continues)."""
        return copy.deepcopy(self)

    def restore(self, snap: "Cache") -> None:
        self.__dict__.update(copy.deepcopy(snap).__dict__)


# ---- the model ----


class Model:
    """A Clover or Qwen3.5-MoE model from a GGUF file, mapped in place."""

    def __init__(self, path, *, threads: int | None = None, ctx_len: int | None = None):
        from . import set_num_threads

        if threads is not None:
            if threads < 0:
                raise ValueError("threads must be >= 0")
            set_num_threads(threads)
        self.file = GGUFFile(path)
        try:
            self.config = Config.from_gguf(self.file)
            if ctx_len is not None and ctx_len < 1:
                raise ValueError("ctx_len must be >= 1")
            self.ctx_len = min(ctx_len or self.config.context_length, self.config.context_length)
            self._load_weights()
            self.tokenizer = Tokenizer.from_gguf(self.file.kv)
        except Exception:
            self.file.close()
            raise

    # -- loading: every tensor checked by name, type and shape before use --

    def _tensor(self, name: str, ne: tuple[int, ...]):
        ti = self.file.tensors.get(name)
        if ti is None:
            raise GGUFError(f"tensor {name} is missing")
        got = tuple(ti.ne) + (1,) * (len(ne) - len(ti.ne))
        if got[: len(ne)] != tuple(ne) or any(d != 1 for d in got[len(ne) :]):
            raise GGUFError(f"tensor {name} has shape {list(ti.ne)}, expected {list(ne)}")
        return ti

    def _matrix(self, name: str, ne: tuple[int, ...]) -> Matrix:
        ti = self._tensor(name, ne)
        return Matrix(self.file.data(name), ti.type_name)

    def _vector(self, name: str, ne: tuple[int, ...]) -> np.ndarray:
        ti = self._tensor(name, ne)
        v = kernels.dequantize(self.file.data(name), ti.type_name)
        if not np.isfinite(v).all():
            raise GGUFError(f"tensor {name} holds NaN or Inf")
        return v.reshape(tuple(reversed(ne)) if len(ne) > 1 else (ne[0],))

    def _experts(self, name: str, ne: tuple[int, int, int]) -> Experts:
        ti = self._tensor(name, ne)
        d = self.file.data(name)
        return Experts(d.reshape(ne[2], ne[1], d.shape[1]), ti.type_name)

    def _load_weights(self) -> None:
        c = self.config
        H, V = c.n_embd, c.vocab_size
        for fused in ("ffn_gate_up_exps", "attn_qkv_full"):
            if any(fused in n for n in self.file.tensors):
                raise GGUFError(f"fused {fused} tensors are not supported; convert without fusing")
        self.embed = self._matrix("token_embd.weight", (H, V))
        self.output = self._matrix("output.weight", (H, V)) if "output.weight" in self.file.tensors else self.embed
        self.output_norm = self._vector("output_norm.weight", (H,))
        self.layers = []
        for i in range(c.n_layer):
            b = f"blk.{i}."
            L = {
                "attn_norm": self._vector(b + "attn_norm.weight", (H,)),
                "post_norm": self._vector(b + "post_attention_norm.weight", (H,)),
                "router": self._vector(b + "ffn_gate_inp.weight", (H, c.n_expert)),
                "gate_exps": self._experts(b + "ffn_gate_exps.weight", (H, c.n_ff_exp, c.n_expert)),
                "up_exps": self._experts(b + "ffn_up_exps.weight", (H, c.n_ff_exp, c.n_expert)),
                "down_exps": self._experts(b + "ffn_down_exps.weight", (c.n_ff_exp, H, c.n_expert)),
                "shexp_gate_inp": self._vector(b + "ffn_gate_inp_shexp.weight", (H,)),
                "gate_shexp": self._matrix(b + "ffn_gate_shexp.weight", (H, c.n_ff_shexp)),
                "up_shexp": self._matrix(b + "ffn_up_shexp.weight", (H, c.n_ff_shexp)),
                "down_shexp": self._matrix(b + "ffn_down_shexp.weight", (c.n_ff_shexp, H)),
            }
            if L["gate_exps"].fmt != L["up_exps"].fmt:
                raise GGUFError(f"{b}ffn_gate_exps and ffn_up_exps must share one format")
            if c.recurrent[i]:
                L.update(
                    qkv=self._matrix(b + "attn_qkv.weight", (H, c.conv_dim)),
                    z=self._matrix(b + "attn_gate.weight", (H, c.value_dim)),
                    beta=self._matrix(b + "ssm_beta.weight", (H, c.n_v_heads)),
                    alpha=self._matrix(b + "ssm_alpha.weight", (H, c.n_v_heads)),
                    conv=self._vector(b + "ssm_conv1d.weight", (c.conv_kernel, c.conv_dim)),
                    dt_bias=self._vector(b + "ssm_dt.bias", (c.n_v_heads,)),
                    ssm_a=self._vector(b + "ssm_a", (c.n_v_heads,)),
                    ssm_norm=self._vector(b + "ssm_norm.weight", (c.v_head_dim,)),
                    ssm_out=self._matrix(b + "ssm_out.weight", (c.value_dim, H)),
                )
            else:
                D = c.head_dim
                L.update(
                    q=self._matrix(b + "attn_q.weight", (H, 2 * c.n_head * D)),
                    k=self._matrix(b + "attn_k.weight", (H, c.n_head_kv * D)),
                    v=self._matrix(b + "attn_v.weight", (H, c.n_head_kv * D)),
                    o=self._matrix(b + "attn_output.weight", (c.n_head * D, H)),
                    q_norm=self._vector(b + "attn_q_norm.weight", (D,)),
                    k_norm=self._vector(b + "attn_k_norm.weight", (D,)),
                )
            self.layers.append(L)

    # -- the layers --

    def _attention(self, i: int, L: dict, x: np.ndarray, pos: np.ndarray, cache: Cache, commit: int,
                   block: int | None) -> np.ndarray:
        c = self.config
        T, D = x.shape[0], c.head_dim
        qg = mat(x, L["q"]).reshape(T, c.n_head, 2 * D)  # per head: [query | gate]
        q, gate = qg[..., :D], qg[..., D:].reshape(T, c.n_head * D)
        k = mat(x, L["k"]).reshape(T, c.n_head_kv, D)
        v = mat(x, L["v"]).reshape(T, c.n_head_kv, D)
        q = rope(rmsnorm(q, L["q_norm"], c.eps), pos, c.n_rot, c.rope_theta)
        k = rope(rmsnorm(k, L["k_norm"], c.eps), pos, c.n_rot, c.rope_theta)
        n0 = cache.n
        cache.reserve(i, n0 + T, c.n_head_kv, D, np.float16)
        k16, v16 = k.astype(np.float16), v.astype(np.float16)  # what the cache holds
        keys = np.concatenate([cache.k[i][:n0], k16])
        vals = np.concatenate([cache.v[i][:n0], v16])
        if commit:
            cache.k[i][n0 : n0 + commit] = k16[:commit]
            cache.v[i][n0 : n0 + commit] = v16[:commit]
        o = attention(q, keys, vals, pos, np.arange(n0 + T), block, 1.0 / np.sqrt(D))
        return mat(o.reshape(T, -1) * sigmoid(gate), L["o"])

    def _gated_deltanet(self, i: int, L: dict, x: np.ndarray, cache: Cache, commit: int) -> np.ndarray:
        c = self.config
        T = x.shape[0]
        qkv = mat(x, L["qkv"])
        z = mat(x, L["z"]).reshape(T, c.n_v_heads, c.v_head_dim)
        beta = sigmoid(mat(x, L["beta"]))
        g = L["ssm_a"] * softplus(mat(x, L["alpha"]) + L["dt_bias"])
        conv_state = cache.conv.get(i)
        if conv_state is None:
            conv_state = np.zeros((c.conv_kernel - 1, c.conv_dim), np.float32)
        y, _ = causal_conv_silu(qkv, L["conv"], conv_state)
        # the conv state after the committed tokens: the last K-1 raw inputs up to them
        new_conv = np.concatenate([conv_state, qkv[:commit]])[commit:].copy()
        q = y[:, : c.key_dim].reshape(T, c.n_k_heads, c.k_head_dim)
        k = y[:, c.key_dim : 2 * c.key_dim].reshape(T, c.n_k_heads, c.k_head_dim)
        v = y[:, 2 * c.key_dim :].reshape(T, c.n_v_heads, c.v_head_dim)
        state = cache.ssm.get(i)
        if state is None:
            state = np.zeros((c.n_v_heads, c.k_head_dim, c.v_head_dim), np.float32)
        o1, new_state = gated_delta_rule(q[:commit], k[:commit], v[:commit], g[:commit], beta[:commit], state)
        o2, _ = gated_delta_rule(q[commit:], k[commit:], v[commit:], g[commit:], beta[commit:], new_state)
        o = np.concatenate([o1, o2])
        if commit:
            cache.conv[i], cache.ssm[i] = new_conv, new_state
        o = rmsnorm(o, L["ssm_norm"], c.eps) * silu(z)
        return mat(o.reshape(T, c.value_dim), L["ssm_out"])

    def _moe(self, L: dict, x: np.ndarray) -> np.ndarray:
        c = self.config
        logits = x @ L["router"].T
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        ids = np.argsort(-p, axis=-1, kind="stable")[:, : c.n_expert_used].astype(np.int32)
        w = np.take_along_axis(p, ids, axis=-1)
        w = (w / w.sum(axis=-1, keepdims=True)).astype(np.float32)
        g, u, d = L["gate_exps"], L["up_exps"], L["down_exps"]
        routed, n_used = kernels.moe(np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(ids), w,
                                     g.data, u.data, d.data, g.fmt, u.fmt, d.fmt)
        self.last_experts_used = n_used
        shared = mat(silu(mat(x, L["gate_shexp"])) * mat(x, L["up_shexp"]), L["down_shexp"])
        return routed + sigmoid(x @ L["shexp_gate_inp"])[:, None] * shared

    # -- spans --

    def run(self, cache: Cache, tokens, *, commit: bool | int, block: int | None = None, logits: bool = True) -> np.ndarray:
        """Run tokens at positions cache.n .. cache.n + T - 1 from the committed caches.

        commit=False is speculative: the caches are read, never written. commit=True writes the span's
        keys/values and the GDN states and advances cache.n; an int n commits only the first n tokens
        (the rest run speculatively after them: a block's commit fused with the next block's first step). block=None gives causal attention; an int B
        gives Clover's block-causal attention (a token sees every token of its own B-block). Returns
        float32 logits [T, vocab] (or the final hidden states if logits=False)."""
        c = self.config
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            return np.zeros((0, c.vocab_size), np.float32)
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise ValueError(f"token ids must be in [0, {c.vocab_size})")
        if cache.capacity_limit == 0:
            cache.capacity_limit = self.ctx_len
        if cache.n + ids.size > cache.capacity_limit:
            raise ValueError(f"context full: {cache.n + ids.size} tokens exceed the context length {cache.capacity_limit}")
        commit = ids.size if commit is True else int(commit)
        if not 0 <= commit <= ids.size:
            raise ValueError(f"commit must be between 0 and {ids.size}")
        pos = np.arange(cache.n, cache.n + ids.size)
        x = kernels.dequantize(np.ascontiguousarray(self.embed.data[ids]), self.embed.fmt)
        for i, L in enumerate(self.layers):
            h = rmsnorm(x, L["attn_norm"], c.eps)
            if c.recurrent[i]:
                x = x + self._gated_deltanet(i, L, h, cache, commit)
            else:
                x = x + self._attention(i, L, h, pos, cache, commit, block)
            x = x + self._moe(L, rmsnorm(x, L["post_norm"], c.eps))
        cache.n += commit
        cache.tokens.extend(int(t) for t in ids[:commit])
        h = rmsnorm(x, self.output_norm, c.eps)
        return mat(h, self.output) if logits else h

    def new_cache(self) -> Cache:
        return Cache(capacity_limit=self.ctx_len)

    def forward(self, token_ids) -> np.ndarray:
        """Logits [T, vocab] for a fresh context, with the model's own attention pattern:
        causal for qwen35moe, block-causal (B = the file's block length) for clover."""
        block = self.config.block_length if self.config.is_diffusion else None
        return self.run(self.new_cache(), token_ids, commit=False, block=block)

    def greedy(self, prompt_ids, max_new_tokens: int, *, stop_at_eos: bool = True):
        """Plain autoregressive greedy decoding (B = 1) through the caches: the prompt is prefilled once,
        then one committed token per forward. Yields token ids as they are chosen."""
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) + max_new_tokens > self.ctx_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceed the context length {self.ctx_len}")
        cache = self.new_cache()
        if max_new_tokens == 0:
            return
        h = self.run(cache, ids, commit=True, logits=False)[-1:]
        for step in range(max_new_tokens):
            logits = mat(h, self.output)[0]
            tok = int(np.argmax(logits))  # ties: the lowest id
            yield tok
            if (stop_at_eos and tok == self.config.eos_token_id) or step == max_new_tokens - 1:
                return
            h = self.run(cache, [tok], commit=True, logits=False)

    def generate(self, prompt, *, cache: Cache | None = None, **options):
        """Decode after `prompt` (text or token ids); yields clover_cpu.decode.Event objects as tokens
        become final. Options (keyword-only): max_new_tokens, temperature, top_k, top_p, seed, threshold,
        block_length, max_steps, policy ("threshold" | "fixed"), scorer ("prob" | "margin" | "entropy"),
        stop_at_eos. Defaults come from the file (Clover's threshold and block length). `cache` continues
        an earlier context (ending on a block boundary) and is extended in place."""
        from .decode import Options, decode

        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        yield from decode(self, ids, Options(**options), cache=cache)

    def generate_text(self, prompt, **options) -> dict:
        """The whole generation at once: text, token_ids and the statistics (prompt_tokens,
        generated_tokens, forwards, tokens_per_forward, seconds, tokens_per_second, prefill_*)."""
        out: list[int] = []
        stats = None
        for ev in self.generate(prompt, **options):
            if ev.kind == "tokens":
                out.extend(ev.tokens)
            elif ev.kind == "done":
                stats = ev.stats
        return {"text": self.detokenize(out), "token_ids": out, **stats.as_dict()}

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(ids)

    def close(self) -> None:
        self.file.close()


def load(path, *, threads: int | None = None, ctx_len: int | None = None) -> Model:
    """Open a clover or qwen35moe GGUF file; weights stay memory-mapped in place."""
    return Model(path, threads=threads, ctx_len=ctx_len)
