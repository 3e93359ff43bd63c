"""Train the small Clover that ships with clover-cpu, export it and convert it to GGUF.

Everything comes from what every machine has: the data is the Python standard library of the
interpreter running this script (sorted file list; files whose path hashes to 0 mod 20 are held
out), the tokenizer is a SentencePiece BPE trained on the same text. The model is this file's own
PyTorch implementation of the Clover architecture (Gated DeltaNet + gated attention + MoE with a
shared expert), with the Hugging Face parameter names of CLOVER.md section 5.1, so export is a
plain save. The recipe:

    1. next-token pretraining (causal attention, every position supervised)
    2. conversion to block diffusion (SDAR / LLaDA2 style): blocks of B tokens, a random mask ratio
       per block, loss on the masked positions (logits at i predict token i), each noisy block
       seeing the clean earlier blocks through the two-copy trick (CLOVER.md section 3)
    3. export (config.json, model.safetensors, tokenizer.model) and `clover-cpu convert`

    python train/train_clover.py --out train/out                  # the full run (--minutes 150)
    python train/train_clover.py --out train/out --eval           # metrics of the finished run

An interrupted run resumes from OUT/ckpt.pt when started again with the same flags.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import math
import os
import random
import struct
import subprocess
import sys
import sysconfig
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|mask|>"]  # ids 0..4
UNK_ID, BOS_ID, EOS_ID, PAD_ID, MASK_ID = range(5)

# ---- shape ----


@dataclass
class Shape:
    """The Hugging Face config keys of the model (CLOVER.md section 1), with Clover's diffusion keys."""

    vocab_size: int = 1024
    hidden_size: int = 256
    num_hidden_layers: int = 8
    full_attention_interval: int = 4  # layer i is full attention iff (i + 1) % 4 == 0
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    partial_rotary_factor: float = 0.25
    rope_theta: float = 10000.0
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 64
    linear_value_head_dim: int = 64
    linear_conv_kernel_dim: int = 4
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128
    shared_expert_intermediate_size: int = 128
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    block_length: int = 8
    threshold: float = 0.9

    @property
    def layer_types(self) -> list[str]:
        return [
            "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
            for i in range(self.num_hidden_layers)
        ]

    def hf_config(self) -> dict:
        """config.json of the exported checkpoint (model_type clover, flat keys)."""
        d = asdict(self)
        d.update(
            # positions are RoPE only, so the file may allow Clover's full 128K context (long-context runs
            # of the runtime use it); the model was trained on windows of at most 512 tokens and nothing
            # is claimed about its output beyond them
            max_position_embeddings=max(self.max_position_embeddings, SHIPPED_CONTEXT),
            model_type="clover",
            architectures=["CloverForDiffusionLM"],
            layer_types=self.layer_types,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
            hidden_act="silu",
            tie_word_embeddings=False,
            attention_bias=False,
            mask_token_id=MASK_ID,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            shift_logits=False,
            torch_dtype="float32",
        )
        return d


SHIPPED_CONTEXT = 131072

PRESETS = {
    # the shipped model: 8 layers (6 GDN + 2 attention), 8 experts top-2, 9.75M parameters, 5.0M active
    "small": Shape(),
    # for a GPU run (--device cuda): 16.1M parameters, 9.0M active, 17.3 MB as q8_0 (the cap is 20 MB)
    "medium": Shape(
        hidden_size=384,
        num_attention_heads=6,
        num_key_value_heads=2,
        linear_num_key_heads=3,
        linear_num_value_heads=6,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
    ),
    # the smoke test's: every dimension small, still Hv = 2 Hk and a GQA attention layer
    "tiny": Shape(
        vocab_size=1024,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        partial_rotary_factor=0.5,
        block_length=4,
    ),
}

# ---- data: the standard library's sources and a SentencePiece tokenizer ----


def stdlib_files(max_files: int = 0) -> tuple[list[Path], Path]:
    """The interpreter's standard-library .py files (site-packages excluded), sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        (
            p
            for p in root.rglob("*.py")
            if "site-packages" not in p.relative_to(root).parts and "__pycache__" not in p.parts
        ),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    if max_files:
        files = files[:: max(1, len(files) // max_files)][:max_files]
    return files, root


def is_held_out(rel: str) -> bool:
    """A fixed 5% of files for evaluation, chosen by the path alone (stable when other files change)."""
    return zlib.crc32(rel.encode()) % 20 == 0


def read_corpus(max_files: int = 0) -> dict[str, list[tuple[str, str]]]:
    """{"train": [(rel, text)], "eval": [(rel, text)]}: every file that decodes as UTF-8."""
    files, root = stdlib_files(max_files)
    out = {"train": [], "eval": []}
    for p in files:
        rel = p.relative_to(root).as_posix()
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            out["eval" if is_held_out(rel) else "train"].append((rel, text))
    return out


def train_tokenizer(texts: list[str], vocab_size: int, sample_every: int = 4) -> bytes:
    """A byte-fallback BPE SentencePiece model: ids 0..4 = SPECIALS, whitespace kept as is (identity
    normalization, no dummy prefix, so a prompt tokenizes like the same text inside a file), runs of
    spaces allowed as pieces (indentation), rare characters left to the byte pieces."""
    import io

    import sentencepiece as spm

    def sentences():
        for t in texts[::sample_every]:
            for i in range(0, len(t), 4000):  # SentencePiece reads "sentences"; newlines stay inside them
                yield t[i : i + 4000]

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences(),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=0.9995,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_id=PAD_ID,
        user_defined_symbols=[SPECIALS[MASK_ID]],
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        split_digits=True,
        max_sentence_length=8192,
        allow_whitespace_only_pieces=True,
        input_sentence_size=0,
        num_threads=1,
        minloglevel=2,
    )
    return buf.getvalue()


def load_sp(model_bytes: bytes):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=model_bytes)


def encode_stream(sp, docs: list[tuple[str, str]]) -> np.ndarray:
    """All files' tokens, each file followed by EOS, as one uint16 stream."""
    ids = sp.encode([t for _, t in docs])
    out = []
    for seq in ids:
        out.append(np.asarray(seq, np.uint16))
        out.append(np.array([EOS_ID], np.uint16))
    return np.concatenate(out) if out else np.zeros(0, np.uint16)


def prepare_data(out: Path, vocab_size: int, max_files: int, log) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Tokenizer and token streams, cached in OUT (tokenizer.model, train.npy, eval.npy)."""
    tok, tr, ev = out / "tokenizer.model", out / "train_tokens.npy", out / "eval_tokens.npy"
    if tok.exists() and tr.exists() and ev.exists():
        return tok.read_bytes(), np.load(tr), np.load(ev)
    t0 = time.time()
    corpus = read_corpus(max_files)
    n_chars = sum(len(t) for _, t in corpus["train"])
    model = train_tokenizer([t for _, t in corpus["train"]], vocab_size)
    sp = load_sp(model)
    train_ids, eval_ids = encode_stream(sp, corpus["train"]), encode_stream(sp, corpus["eval"])
    np.save(tr, train_ids)
    np.save(ev, eval_ids)
    tok.write_bytes(model)  # last: its presence marks the cache complete
    log(
        f"data: {len(corpus['train'])} train files ({n_chars / 1e6:.1f}M chars, {train_ids.size / 1e6:.2f}M tokens, "
        f"{n_chars / max(1, train_ids.size):.2f} chars/token), {len(corpus['eval'])} held-out files "
        f"({eval_ids.size / 1e6:.2f}M tokens); tokenizer {vocab_size} pieces; {time.time() - t0:.0f}s"
    )
    return model, train_ids, eval_ids


# ---- the model: own PyTorch code, Hugging Face parameter names (CLOVER.md 5.1) ----


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w), in fp32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))  # [dim], 0 = identity
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)).type_as(
            x
        )


class GatedRMSNorm(nn.Module):
    """The GDN output norm (not zero-centred): w * rmsnorm(o) * silu(z), per value head."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # [dv]
        self.eps = eps

    def forward(self, o, z):
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * o * F.silu(z)


def rope_tables(pos: torch.Tensor, rot: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rot] of NeoX RoPE (frequencies repeated for both halves)."""
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    f = pos.float()[:, None] * inv[None]
    emb = torch.cat([f, f], -1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin, rot: int):
    """Rotate-half RoPE on the first `rot` dims of each head; x [N, heads, T, D]."""
    xr, xp = x[..., :rot], x[..., rot:]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
    xr = xr * cos + torch.cat([-x2, x1], -1) * sin
    return torch.cat([xr, xp], -1)


@dataclass
class Plan:
    """How one forward treats its tokens.

    causal:   T tokens, causal attention (next-token pretraining; transformers' semantics)
    block:    T tokens, Clover's block-causal attention over B-blocks, causal GDN (the runtime's forward)
    two_copy: 2L tokens [clean x ; noisy x]; clean tokens are block-causal among themselves, noisy block b
              sees clean blocks < b and itself; GDN runs the clean half causally and each noisy block
              from the clean recurrent + conv state at its start
    """

    kind: str
    T: int  # tokens in the forward (2L for two_copy)
    B: int = 1
    mask: torch.Tensor | None = None  # [T, T] bool, True = may attend (None: causal)
    pos: torch.Tensor | None = None  # [T] positions

    @staticmethod
    def make(kind: str, T: int, B: int = 1) -> Plan:
        if kind == "causal":
            return Plan(kind, T, 1, None, torch.arange(T))
        i = torch.arange(T)
        if kind == "block":
            return Plan(kind, T, B, (i[None, :] // B) <= (i[:, None] // B), i)
        if kind == "two_copy":
            L = T // 2
            if T % 2 or L % B:
                raise ValueError("two_copy needs 2L tokens with L a multiple of B")
            blk = torch.cat([i[:L] // B, i[:L] // B])
            noisy = torch.cat([torch.zeros(L, dtype=torch.bool), torch.ones(L, dtype=torch.bool)])
            qb, kb = blk[:, None], blk[None, :]
            qn, kn = noisy[:, None], noisy[None, :]
            clean_clean = ~qn & ~kn & (kb <= qb)
            noisy_clean = qn & ~kn & (kb < qb)
            noisy_noisy = qn & kn & (kb == qb)
            return Plan(kind, T, B, clean_clean | noisy_clean | noisy_noisy, torch.cat([i[:L], i[:L]]))
        raise ValueError(kind)


class GatedAttention(nn.Module):
    """Gated full attention: q_proj rows per head [query (D) | gate (D)], q/k zero-centred norms, partial
    NeoX RoPE, GQA, output * sigmoid(gate), o_proj."""

    def __init__(self, s: Shape):
        super().__init__()
        H, D = s.hidden_size, s.head_dim
        self.n_head, self.n_kv, self.D = s.num_attention_heads, s.num_key_value_heads, D
        self.rot = int(D * s.partial_rotary_factor)
        self.theta = s.rope_theta
        self.q_proj = nn.Linear(H, 2 * self.n_head * D, bias=False)  # [2 n_head D, H], interleaved per head
        self.k_proj = nn.Linear(H, self.n_kv * D, bias=False)
        self.v_proj = nn.Linear(H, self.n_kv * D, bias=False)
        self.o_proj = nn.Linear(self.n_head * D, H, bias=False)
        self.q_norm = RMSNorm(D, s.rms_norm_eps)
        self.k_norm = RMSNorm(D, s.rms_norm_eps)

    def forward(self, x, plan: Plan):
        N, T, _ = x.shape
        D = self.D
        qg = self.q_proj(x).view(N, T, self.n_head, 2 * D)
        q, gate = qg[..., :D], qg[..., D:].reshape(N, T, self.n_head * D)
        q = self.q_norm(q).transpose(1, 2)  # [N, n_head, T, D]
        k = self.k_norm(self.k_proj(x).view(N, T, self.n_kv, D)).transpose(1, 2)
        v = self.v_proj(x).view(N, T, self.n_kv, D).transpose(1, 2)
        cos, sin = (t.to(x.device) for t in rope_tables(plan.pos, self.rot, self.theta))
        q, k = apply_rope(q, cos, sin, self.rot), apply_rope(k, cos, sin, self.rot)
        rep = self.n_head // self.n_kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        if plan.mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=plan.mask.to(x.device))
        o = o.transpose(1, 2).reshape(N, T, self.n_head * D) * torch.sigmoid(gate)
        return self.o_proj(o)


def l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


class UnitLowerInverse(torch.autograd.Function):
    """X = (I + A)^-1 for strictly lower-triangular A [..., C, C]; backward dA = -(X^T dX X^T), strictly lower.
    (Batched torch.linalg.solve_triangular with autograd is many times slower on the CPU.)"""

    @staticmethod
    def forward(ctx, A):
        C = A.shape[-1]
        eye = torch.eye(C, dtype=A.dtype, device=A.device)
        X = torch.linalg.solve_triangular(A + eye, eye.expand(A.shape), upper=False, unitriangular=True)
        ctx.save_for_backward(X)
        return X

    @staticmethod
    def backward(ctx, gX):
        (X,) = ctx.saved_tensors
        Xt = X.transpose(-1, -2)
        return -(Xt @ gX @ Xt).tril(-1)


def delta_chunk_terms(q, k, v, g, beta):
    """Per-chunk terms of the chunked (WY) gated delta rule (qwen35moe-forward.md 4.6).

    q, k [M, C, dk] (normalised, q scaled), v [M, C, dv], g, beta [M, C] (g <= 0), M chunks. With
    G = cumsum(g) in the chunk and S the state at the chunk's start:
        v_new = U - W S;  o = qd S + intra v_new;  S' = decay S + kd^T v_new
    (3-D batches: batched matmuls over 5-D or strided operands are several times slower on the CPU.)
    """
    C = q.shape[-2]
    G = g.cumsum(-1)
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # [M, C, C], s <= r
    kb = k * beta[..., None]
    A = ((kb @ k.transpose(-1, -2)) * decay).masked_fill(~lower.tril(-1), 0.0)  # strictly lower
    Tinv = UnitLowerInverse.apply(A)  # (I + A)^-1
    U = Tinv @ (v * beta[..., None])
    W = Tinv @ (kb * G.exp()[..., None])
    qd = q * G.exp()[..., None]
    intra = (q @ k.transpose(-1, -2)) * decay
    kd = k * (G[..., -1:] - G).exp()[..., None]
    return qd, intra, U, W, kd, G[..., -1].exp()


def to_chunks(t, C: int):
    """[N, H, T, ...] (T a multiple of C) -> [T / C, N * H, C, ...], contiguous: chunk-major, so the slice
    of one chunk is a contiguous 3-D batch."""
    N, H, T = t.shape[:3]
    return t.reshape(N * H, T // C, C, *t.shape[3:]).transpose(0, 1).contiguous()


def from_chunks(t, N: int, H: int):
    """[n, N * H, C, d] -> [N, H, n * C, d]."""
    n, _, C, d = t.shape
    return t.transpose(0, 1).reshape(N, H, n * C, d)


def _terms(q, k, v, g, beta):
    """delta_chunk_terms over [n, M, C, .] chunk-major inputs, results in the same layout."""
    n, M = q.shape[:2]
    flat = [t.reshape(n * M, *t.shape[2:]) for t in (q, k, v, g, beta)]
    return [t.reshape(n, M, *t.shape[1:]) for t in delta_chunk_terms(*flat)]


def fp32(fn):
    """Run fn in float32 with autocast off: the delta rule's chunk algebra and its recurrent state lose too
    much in bfloat16 (the projections around it may run in bfloat16)."""

    @functools.wraps(fn)
    def wrapper(*args, **kw):
        args = [a.float() if torch.is_tensor(a) and a.element_size() < 4 else a for a in args]
        with torch.autocast(args[0].device.type, enabled=False):
            return fn(*args, **kw)

    return wrapper


@fp32
def delta_scan(q, k, v, g, beta, chunk: int, state=None):
    """Chunked gated delta rule over [N, Hv, T, .] inputs from `state` [N * Hv, dk, dv] (zeros if None).
    Returns o [N, Hv, T, dv] and the states at the start of every chunk [n_chunks, N * Hv, dk, dv]."""
    N, Hv, T, dk = q.shape
    dv = v.shape[-1]
    pad = (-T) % chunk
    if pad:  # zero q, k, v, beta and g = 0: padded steps leave the state unchanged
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (T + pad) // chunk
    qd, intra, U, W, kd, cd = _terms(*(to_chunks(t, chunk) for t in (q, k, v, g, beta)))
    S = q.new_zeros(N * Hv, dk, dv) if state is None else state
    outs, starts = [], []
    for i in range(n):
        starts.append(S)
        v_new = U[i] - W[i] @ S
        outs.append(qd[i] @ S + intra[i] @ v_new)
        S = S * cd[i, :, None, None] + kd[i].transpose(-1, -2) @ v_new
    o = from_chunks(torch.stack(outs), N, Hv)[:, :, :T]
    return o, torch.stack(starts)


@fp32
def delta_blocks_from(q, k, v, g, beta, starts):
    """Every block of chunk-major [nb, M, B, .] inputs from its own start state starts [nb, M, dk, dv], all
    blocks at once. Returns [nb, M, B, dv]."""
    qd, intra, U, W, _, _ = _terms(q, k, v, g, beta)
    v_new = U - W @ starts
    return qd @ starts + intra @ v_new


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet: [q|k|v] = in_proj_qkv(x), causal depthwise conv + SiLU, beta = sigmoid(b),
    g = -exp(A_log) softplus(a + dt_bias), L2-normed q, k (value head h uses key head h // (Hv/Hk)),
    the gated delta rule, w * rmsnorm(o) * silu(z), out_proj."""

    def __init__(self, s: Shape, chunk: int = 32):
        super().__init__()
        H = s.hidden_size
        self.Hk, self.Hv = s.linear_num_key_heads, s.linear_num_value_heads
        self.dk, self.dv = s.linear_key_head_dim, s.linear_value_head_dim
        self.key_dim, self.value_dim = self.Hk * self.dk, self.Hv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.K = s.linear_conv_kernel_dim
        self.chunk = chunk
        self.in_proj_qkv = nn.Linear(H, self.conv_dim, bias=False)  # [2 Hk dk + Hv dv, H]
        self.in_proj_z = nn.Linear(H, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(H, self.Hv, bias=False)
        self.in_proj_a = nn.Linear(H, self.Hv, bias=False)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, self.K, groups=self.conv_dim, bias=False
        )  # [C, 1, K]
        self.dt_bias = nn.Parameter(torch.ones(self.Hv))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.Hv).uniform_(1, 16)))
        self.norm = GatedRMSNorm(self.dv, s.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, H, bias=False)

    def _heads(self, y, b, a):
        """Post-conv channels [N, T, C] -> q, k, v [N, Hv, T, .] (q, k normalised, repeated), g, beta [N, Hv, T]."""
        N, T, _ = y.shape
        q = y[..., : self.key_dim].reshape(N, T, self.Hk, self.dk)
        k = y[..., self.key_dim : 2 * self.key_dim].reshape(N, T, self.Hk, self.dk)
        v = y[..., 2 * self.key_dim :].reshape(N, T, self.Hv, self.dv)
        r = self.Hv // self.Hk
        q, k = q.repeat_interleave(r, 2), k.repeat_interleave(r, 2)  # value head h <- key head h // r
        q = l2norm(q.float()) * self.dk**-0.5
        k = l2norm(k.float())
        beta = torch.sigmoid(b.float())
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        return (
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.float().transpose(1, 2),
            g.transpose(1, 2),
            beta.transpose(1, 2),
        )

    def _conv(self, x, history=None):
        """Causal depthwise conv + SiLU over [N, T, C]: y[t] = sum_j w[j] x[t - K + 1 + j], the K - 1 inputs
        before x taken from history [N, K-1, C] (zeros if None). Shifted products, no transposes (faster on the
        CPU than a grouped conv1d, forward and backward)."""
        T = x.shape[1]
        xp = torch.cat(
            [history if history is not None else x.new_zeros(x.shape[0], self.K - 1, x.shape[2]), x], 1
        )
        w = self.conv1d.weight[:, 0]  # [C, K]
        y = sum(xp[:, j : j + T] * w[:, j] for j in range(self.K))
        return F.silu(y)

    def forward(self, x, plan: Plan):
        N, T, _ = x.shape
        raw = self.in_proj_qkv(x)  # [N, T, conv_dim], pre-conv
        z = self.in_proj_z(x).reshape(N, T, self.Hv, self.dv)
        b, a = self.in_proj_b(x), self.in_proj_a(x)
        if plan.kind != "two_copy":
            q, k, v, g, beta = self._heads(self._conv(raw), b, a)
            o, _ = delta_scan(q, k, v, g, beta, self.chunk)
        else:
            L, B = T // 2, plan.B
            nb = L // B
            # clean half: causal, in chunks of B, keeping the state at every block start
            q, k, v, g, beta = self._heads(self._conv(raw[:, :L]), b[:, :L], a[:, :L])
            o_clean, starts = delta_scan(q, k, v, g, beta, B)
            # noisy half: block j's conv sees the K-1 clean raw inputs before the block, then its own
            hist = F.pad(raw[:, :L], (0, 0, self.K - 1, 0))  # [N, K-1 + L, C]
            idx = (torch.arange(nb)[:, None] * B + torch.arange(self.K - 1)[None]).reshape(-1).to(x.device)
            ctx = hist[:, idx].reshape(N, nb, self.K - 1, self.conv_dim)
            y = self._conv(raw[:, L:].reshape(N * nb, B, self.conv_dim), ctx.reshape(N * nb, self.K - 1, -1))
            y = y.reshape(N, L, self.conv_dim)
            q, k, v, g, beta = self._heads(y, b[:, L:], a[:, L:])
            o_noisy = delta_blocks_from(*(to_chunks(t, B) for t in (q, k, v, g, beta)), starts)
            o_noisy = from_chunks(o_noisy, N, self.Hv)
            o = torch.cat([o_clean, o_noisy], 2)
        o = self.norm(o.transpose(1, 2), z.float())  # [N, T, Hv, dv]
        return self.out_proj(o.reshape(N, T, self.value_dim).type_as(x))


class Experts(nn.Module):
    """Routed SwiGLU experts in the fused transformers-5 layout."""

    def __init__(self, E: int, H: int, inter: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * inter, H))  # rows [0, I) gate, [I, 2I) up
        self.down_proj = nn.Parameter(torch.empty(E, H, inter))


class SharedExpert(nn.Module):
    def __init__(self, H: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    """Router softmax (fp32) over E experts, top-k renormalised to sum 1, SwiGLU experts, plus a shared
    SwiGLU expert scaled by sigmoid(shared_expert_gate(x)). Also keeps the Switch load-balancing loss."""

    def __init__(self, s: Shape):
        super().__init__()
        H, E = s.hidden_size, s.num_experts
        self.E, self.top_k, self.inter = E, s.num_experts_per_tok, s.moe_intermediate_size
        self.gate = nn.Linear(H, E, bias=False)  # router [E, H]
        self.experts = Experts(E, H, self.inter)
        self.shared_expert = SharedExpert(H, s.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(H, 1, bias=False)
        self.aux_loss = None

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = F.softmax(self.gate(x).float(), -1)  # [n, E]
        w, ids = probs.topk(self.top_k, -1)
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        # Switch-style balance: E * sum_e (share of assignments to e) * (mean router prob of e)
        share = torch.bincount(ids.reshape(-1), minlength=self.E).float() / ids.numel()
        self.aux_loss = self.E * (share * probs.mean(0)).sum()
        flat = ids.reshape(-1)
        order = flat.argsort(stable=True)
        tok = order // self.top_k  # token of each sorted assignment
        counts = torch.bincount(flat, minlength=self.E).tolist()
        xs = x[tok]
        outs, o = [], 0
        for e, n in enumerate(counts):
            if n:
                gate, up = (xs[o : o + n] @ self.experts.gate_up_proj[e].t()).split(self.inter, -1)
                outs.append((F.silu(gate) * up) @ self.experts.down_proj[e].t())
            o += n
        ys = torch.cat(outs) * w.reshape(-1)[order, None]
        routed = torch.zeros_like(x).index_add_(0, tok, ys)
        out = routed + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(shape)


class DecoderLayer(nn.Module):
    def __init__(self, s: Shape, i: int):
        super().__init__()
        self.is_attention = s.layer_types[i] == "full_attention"
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        if self.is_attention:
            self.self_attn = GatedAttention(s)
        else:
            self.linear_attn = GatedDeltaNet(s)
        self.mlp = SparseMoe(s)

    def forward(self, x, plan: Plan):
        h = self.input_layernorm(x)
        x = x + (self.self_attn(h, plan) if self.is_attention else self.linear_attn(h, plan))
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(s, i) for i in range(s.num_hidden_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)


class Clover(nn.Module):
    """The whole model; state_dict() keys are the Hugging Face checkpoint names."""

    def __init__(self, s: Shape):
        super().__init__()
        self.shape = s
        self.model = Backbone(s)
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)

    def init_weights(self, seed: int) -> None:
        """N(0, 0.02) matrices, output projections scaled by 1/sqrt(2 n_layer) (GPT-2), zero-centred norms 0,
        GDN norm 1, dt_bias 1, A_log = log U(1, 16) (qwen35moe-forward.md 9)."""
        g = torch.Generator().manual_seed(seed)
        std, out_std = 0.02, 0.02 / math.sqrt(2 * self.shape.num_hidden_layers)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith(
                    ("o_proj.weight", "out_proj.weight", "down_proj.weight", "experts.down_proj")
                ):
                    p.copy_(torch.randn(p.shape, generator=g) * out_std)
                elif name.endswith(("linear_attn.norm.weight", "dt_bias")):
                    p.fill_(1.0)
                elif name.endswith("norm.weight"):
                    p.zero_()
                elif name.endswith("A_log"):
                    p.copy_(torch.log(torch.rand(p.shape, generator=g) * 15 + 1))
                elif name.endswith("conv1d.weight"):
                    p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) / math.sqrt(p.shape[-1]))
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def hidden(self, ids, plan: Plan):
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, plan)
        return self.model.norm(x)

    def forward(self, ids, kind: str = "causal", B: int = 1):
        """Logits [N, T, V] with the `kind` attention pattern (see Plan)."""
        return self.lm_head(self.hidden(ids, Plan.make(kind, ids.shape[1], B)))

    def aux_loss(self):
        return sum(layer.mlp.aux_loss for layer in self.model.layers) / len(self.model.layers)


def count_params(model: Clover) -> tuple[int, int]:
    """(total, active per token) parameters."""
    s = model.shape
    total = sum(p.numel() for p in model.parameters())
    per_expert = 3 * s.hidden_size * s.moe_intermediate_size
    active = total - s.num_hidden_layers * (s.num_experts - s.num_experts_per_tok) * per_expert
    return total, active


# ---- objectives ----


def ar_batch(tokens: np.ndarray, rng: np.random.Generator, n: int, L: int) -> torch.Tensor:
    """n random windows of L + 1 tokens."""
    starts = rng.integers(0, tokens.size - L - 1, n)
    return torch.from_numpy(np.stack([tokens[s : s + L + 1] for s in starts]).astype(np.int64))


def ar_loss(model: Clover, x: torch.Tensor):
    logits = model(x[:, :-1], "causal")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))


def diffusion_masks(
    rng: np.random.Generator, n: int, L: int, B: int, suffix_share: float = 0.25
) -> np.ndarray:
    """[n, L] bool: per block a mask ratio t ~ U(0, 1) (each position masked with prob 1/B + (1 - 1/B) t),
    or with probability suffix_share a random non-empty suffix of the block (what a block looks like when
    the prompt's tail heads it, and when decoding goes left to right). Every block has a masked position
    (one drawn at random where the ratio left none)."""
    nb = L // B
    t = rng.random((n, nb, 1))
    p = 1.0 / B + (1 - 1.0 / B) * t
    m = rng.random((n, nb, B)) < p
    suffix = rng.random((n, nb, 1)) < suffix_share
    start = rng.integers(0, B, (n, nb, 1))
    m = np.where(suffix, np.arange(B)[None, None] >= start, m)
    one = np.arange(B)[None, None] == rng.integers(0, B, (n, nb, 1))
    m |= one & ~m.any(-1, keepdims=True)
    return m.reshape(n, L)


def diffusion_loss(model: Clover, x: torch.Tensor, masked: torch.Tensor, B: int):
    """Mean cross-entropy over the masked positions of the noisy copy; also the accuracy there."""
    noisy = torch.where(masked, torch.full_like(x, MASK_ID), x)
    L = x.shape[1]
    h = model.hidden(torch.cat([x, noisy], 1), Plan.make("two_copy", 2 * L, B))[:, L:]
    logits = model.lm_head(h[masked])
    target = x[masked]
    loss = F.cross_entropy(logits.float(), target)
    return loss, (logits.argmax(-1) == target).float().mean()


# ---- training ----


@dataclass
class Recipe:
    seed: int = 0
    ar_seq: int = 512
    ar_batch: int = 8
    diff_seq: int = 256
    diff_batch: int = 16
    ar_lr: float = 2e-3
    diff_lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    aux_coef: float = 0.01
    grad_clip: float = 1.0
    ar_share: float = 0.5  # share of the training time spent on next-token pretraining
    precision: str = (
        "fp32"  # or "bf16": autocast of the matrix products (fp32 weights, optimizer, delta rule)
    )
    ar_steps: int = 0  # 0: planned from --minutes by timing a few steps
    diff_steps: int = 0
    plan: dict = field(default_factory=dict)


def lr_at(step: int, n: int, peak: float, warmup: int, min_ratio: float) -> float:
    """Linear warm-up, then cosine decay to min_ratio * peak at step n."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, n - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def make_optimizer(model: Clover, r: Recipe) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "conv1d" not in name and "embed" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": r.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused: one kernel for all parameters (several times faster than the default on the CPU)
    return torch.optim.AdamW(groups, lr=r.ar_lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def step_rng(seed: int, phase: str, step: int) -> np.random.Generator:
    """The batch and masks of a step depend only on (seed, phase, step): a resumed run sees the same data."""
    return np.random.default_rng([seed, {"ar": 1, "diffusion": 2}[phase], step])


def autocast(r: Recipe, device):
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=r.precision == "bf16")


def cpu_has_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX): there autocast is faster."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def train_step(model, opt, r: Recipe, phase: str, step: int, tokens: np.ndarray, lr: float, device) -> dict:
    rng = step_rng(r.seed, phase, step)
    B = model.shape.block_length
    with autocast(r, device):
        if phase == "ar":
            x = ar_batch(tokens, rng, r.ar_batch, r.ar_seq).to(device)
            loss = ar_loss(model, x)
            acc = None
        else:
            x = ar_batch(tokens, rng, r.diff_batch, r.diff_seq - 1).to(device)
            masked = torch.from_numpy(diffusion_masks(rng, r.diff_batch, r.diff_seq, B)).to(device)
            loss, acc = diffusion_loss(model, x, masked, B)
        aux = model.aux_loss()
    for gr in opt.param_groups:
        gr["lr"] = lr
    opt.zero_grad(set_to_none=True)
    (loss + r.aux_coef * aux).backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip)
    opt.step()
    return {
        "loss": loss.item(),
        "aux": aux.item(),
        "grad_norm": gn.item(),
        "acc": None if acc is None else acc.item(),
    }


@torch.no_grad()
def held_out_loss(
    model: Clover, tokens: np.ndarray, phase: str, r: Recipe, n_batches: int = 4, device="cpu"
) -> dict:
    """Held-out next-token loss, or masked-token loss and accuracy, on fixed windows and masks."""
    model.eval()
    B = model.shape.block_length
    losses, accs = [], []
    for i in range(n_batches):
        rng = np.random.default_rng([r.seed, 99, i])
        if phase == "ar":
            losses.append(float(ar_loss(model, ar_batch(tokens, rng, r.ar_batch, r.ar_seq).to(device))))
        else:
            x = ar_batch(tokens, rng, r.diff_batch, r.diff_seq - 1).to(device)
            masked = torch.from_numpy(diffusion_masks(rng, r.diff_batch, r.diff_seq, B, 0.0)).to(device)
            loss, acc = diffusion_loss(model, x, masked, B)
            losses.append(float(loss))
            accs.append(float(acc))
    model.train()
    return {"loss": float(np.mean(losses)), "acc": float(np.mean(accs)) if accs else None}


def save_checkpoint(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def plan_steps(model, r: Recipe, tokens, seconds: float, device, log) -> tuple[int, int]:
    """Steps of each phase that fill `seconds` (this calibration included, 3% left for the held-out
    evaluations), from the median time of a few steps of each, run on a copy of the model."""
    import copy

    t_start = time.perf_counter()
    probe = copy.deepcopy(model)
    opt = make_optimizer(probe, r)
    times = {}
    for phase in ("ar", "diffusion"):
        train_step(probe, opt, r, phase, 0, tokens, 1e-4, device)  # warm-up
        ts = []
        for i in range(3):
            t0 = time.perf_counter()
            train_step(probe, opt, r, phase, i + 1, tokens, 1e-4, device)
            ts.append(time.perf_counter() - t0)
        times[phase] = sorted(ts)[1]
    seconds = 0.97 * (seconds - (time.perf_counter() - t_start))
    n_ar = int(r.ar_share * seconds / times["ar"])
    n_diff = int((1 - r.ar_share) * seconds / times["diffusion"])
    log(
        f"plan: {times['ar']:.2f}s per next-token step ({r.ar_batch * r.ar_seq / times['ar']:.0f} tokens/s), "
        f"{times['diffusion']:.2f}s per diffusion step ({r.diff_batch * r.diff_seq / times['diffusion']:.0f} "
        f"tokens/s); {n_ar} + {n_diff} steps in {seconds / 60:.1f} min"
    )
    return max(1, n_ar), max(1, n_diff)


def extend_plan(model, r: Recipe, tokens, seconds: float, lr: float, state: dict, device, log) -> None:
    """Append a second diffusion stage that fills `seconds` (timed on a copy of the model) to a run whose
    diffusion phase is done: it continues from the finished weights with its own warm-up and cosine decay
    at peak `lr`. The batches of the new steps follow the same (seed, phase, step) rule, so the run stays
    deterministic; plan.json records the stage."""
    import copy

    if r.plan.get("extend"):
        if state["step"] < r.plan["diffusion"]:
            return  # an extension already planned and not finished: resume it
        raise SystemExit("this run was already extended once; use another --out to train further")
    if state["step"] < r.plan["diffusion"]:
        if state["elapsed"] < r.plan["budget_s"]:
            raise SystemExit("--extend-minutes applies to a finished run; run without it to resume this one")
        # the time guard ended the phase early (a slower machine than planned): extend from where it stopped
        log(f"the diffusion phase stopped at step {state['step']} of {r.plan['diffusion']} (time budget); "
            "extending from there")
        r.plan = {**r.plan, "diffusion": state["step"]}
    t0 = time.perf_counter()
    probe = copy.deepcopy(model)
    opt = make_optimizer(probe, r)
    train_step(probe, opt, r, "diffusion", 0, tokens, 1e-4, device)
    ts = []
    for i in range(3):
        t = time.perf_counter()
        train_step(probe, opt, r, "diffusion", i + 1, tokens, 1e-4, device)
        ts.append(time.perf_counter() - t)
    seconds = 0.97 * (seconds - (time.perf_counter() - t0))
    n0 = r.plan["diffusion"]
    extra = max(1, int(seconds / sorted(ts)[1]))
    r.plan = {**r.plan, "diffusion": n0 + extra, "budget_s": state["elapsed"] + seconds,
              "extend": {"from": n0, "steps": extra, "lr": lr}}
    log(f"extend: {sorted(ts)[1]:.2f}s per diffusion step; {extra} more diffusion steps (peak lr {lr:.1e}) "
        f"in {seconds / 60:.1f} min")


def train(
    args, shape: Shape, r: Recipe, tokens: np.ndarray, eval_tokens: np.ndarray, budget_s: float, log
) -> Clover:
    out = Path(args.out)
    ckpt = out / "ckpt.pt"
    device = torch.device(args.device)
    model = Clover(shape)
    model.init_weights(r.seed)
    model.to(device)
    opt = make_optimizer(model, r)
    state = {"phase": "ar", "step": 0, "elapsed": 0.0, "history": [], "evals": []}
    if ckpt.exists():
        saved = torch.load(ckpt, map_location=device, weights_only=False)
        if saved["shape"] != asdict(shape) or saved["recipe"]["seed"] != r.seed:
            raise SystemExit(f"{ckpt} was written with another shape or seed; use another --out or delete it")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        state = saved["state"]
        r.plan, r.precision = saved["recipe"]["plan"], saved["recipe"]["precision"]
        log(
            f"resumed from {ckpt}: phase {state['phase']}, step {state['step']}, {state['elapsed'] / 60:.1f} min done"
        )
    total, active = count_params(model)
    log(
        f"model: {total / 1e6:.2f}M parameters, {active / 1e6:.2f}M active per token; "
        f"layers {''.join('A' if t == 'full_attention' else 'G' for t in shape.layer_types)}"
    )
    if not r.plan:
        n_ar, n_diff = r.ar_steps, r.diff_steps
        if not (n_ar and n_diff):
            p_ar, p_diff = plan_steps(model, r, tokens, budget_s, device, log)
            n_ar, n_diff = n_ar or p_ar, n_diff or p_diff
        r.plan = {"ar": n_ar, "diffusion": n_diff, "budget_s": budget_s}
        (out / "plan.json").write_text(json.dumps(r.plan, indent=1))
    if getattr(args, "extend_minutes", 0) and state["phase"] == "diffusion":
        extend_plan(model, r, tokens, args.extend_minutes * 60, args.extend_lr, state, device, log)
        (out / "plan.json").write_text(json.dumps(r.plan, indent=1))
    # a phase that runs past its share of the budget (a slower machine than planned) ends early
    deadline = {"ar": r.ar_share * r.plan["budget_s"] * 1.05, "diffusion": r.plan["budget_s"]}

    def save():
        save_checkpoint(
            ckpt,
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "state": state,
                "shape": asdict(shape),
                "recipe": asdict(r),
            },
        )

    last_save = time.time()
    t_session = time.time()
    elapsed0 = state["elapsed"]
    done = 0  # steps in this session
    for phase in ("ar", "diffusion"):
        if phase == "ar" and state["phase"] != "ar":
            continue
        n = r.plan[phase]
        peak = r.ar_lr if phase == "ar" else r.diff_lr
        t_log, tok_log = time.time(), 0
        while state["step"] < n:
            step = state["step"]
            ext = r.plan.get("extend")
            if phase == "diffusion" and ext and step >= ext["from"]:  # a second stage: its own warm-up and decay
                lr = lr_at(step - ext["from"], ext["steps"], ext["lr"], r.warmup // 2, 0.02)
            else:
                lr = lr_at(step, n, peak, r.warmup, r.min_lr_ratio if phase == "ar" else 0.02)
            m = train_step(model, opt, r, phase, step, tokens, lr, device)
            state["step"] += 1
            state["elapsed"] = elapsed0 + time.time() - t_session
            state["history"].append({"phase": phase, "step": step, "loss": m["loss"], "acc": m["acc"]})
            tok_log += r.ar_batch * r.ar_seq if phase == "ar" else r.diff_batch * r.diff_seq
            last = state["step"] == n or state["elapsed"] > deadline[phase]
            if state["step"] % args.log_every == 0 or last:
                dt = time.time() - t_log
                acc = f" acc {m['acc']:.3f}" if m["acc"] is not None else ""
                log(
                    f"{phase} {state['step']}/{n} loss {m['loss']:.4f}{acc} aux {m['aux']:.3f} lr {lr:.2e} "
                    f"|g| {m['grad_norm']:.2f} {tok_log / max(dt, 1e-9):.0f} tok/s {state['elapsed'] / 60:.1f} min"
                )
                t_log, tok_log = time.time(), 0
            if state["step"] % args.eval_every == 0 or last:
                ev = held_out_loss(model, eval_tokens, phase, r, device=device)
                state["evals"].append({"phase": phase, "step": state["step"], **ev})
                log(
                    f"  held-out {phase} loss {ev['loss']:.4f}"
                    + (f" acc {ev['acc']:.3f}" if ev["acc"] is not None else "")
                )
            if time.time() - last_save > args.save_minutes * 60 or last:
                save()
                last_save = time.time()
            if state["elapsed"] > deadline[phase] and state["step"] < n:
                log(f"{phase}: stopped at step {state['step']} of {n} by the time budget")
                break
            done += 1
            if args.stop_after_steps and done >= args.stop_after_steps:
                save()
                log(f"stopped after {done} steps (--stop-after-steps); run again to resume")
                return None
        if phase == "ar":
            state.update(phase="diffusion", step=0)
            save()
    model.train_state = state
    return model


# ---- export and conversion ----


def export(model: Clover, tokenizer: bytes, hf_dir: Path) -> None:
    """The Hugging Face layout: config.json, model.safetensors (f32), tokenizer.model, tokenizer_config.json."""
    from safetensors.torch import save_file

    hf_dir.mkdir(parents=True, exist_ok=True)
    (hf_dir / "config.json").write_text(json.dumps(model.shape.hf_config(), indent=2))
    save_file(
        {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()},
        str(hf_dir / "model.safetensors"),
    )
    (hf_dir / "tokenizer.model").write_bytes(tokenizer)
    (hf_dir / "tokenizer_config.json").write_text(
        json.dumps({"add_bos_token": False, "add_eos_token": False})
    )


def convert(hf_dir: Path, gguf: Path, out_type: str) -> None:
    """`clover-cpu convert` in a subprocess (run outside the source tree, so the installed package loads)."""
    cmd = [
        sys.executable,
        "-m",
        "clover_cpu",
        "convert",
        str(hf_dir.resolve()),
        "-o",
        str(gguf.resolve()),
        "--type",
        out_type,
        "--force",
        "--quiet",
    ]
    subprocess.run(cmd, check=True, cwd=str(gguf.resolve().parent))


def load_exported(hf_dir: Path, device="cpu") -> Clover:
    from safetensors.torch import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    shape = Shape(**{k: cfg[k] for k in Shape.__dataclass_fields__})
    model = Clover(shape)
    model.load_state_dict(load_file(str(hf_dir / "model.safetensors")))
    return model.to(device).eval()


def shape_of(config) -> Shape:
    """The Shape of a loaded clover_cpu model (its GGUF metadata)."""
    c = config
    full = [i for i, r in enumerate(c.recurrent) if not r]
    return Shape(
        vocab_size=c.vocab_size, hidden_size=c.n_embd, num_hidden_layers=c.n_layer,
        full_attention_interval=full[0] + 1 if full else c.n_layer + 1,
        num_attention_heads=c.n_head, num_key_value_heads=c.n_head_kv, head_dim=c.head_dim,
        partial_rotary_factor=c.n_rot / c.head_dim, rope_theta=c.rope_theta,
        linear_num_key_heads=c.n_k_heads, linear_num_value_heads=c.n_v_heads,
        linear_key_head_dim=c.k_head_dim, linear_value_head_dim=c.v_head_dim,
        linear_conv_kernel_dim=c.conv_kernel, num_experts=c.n_expert, num_experts_per_tok=c.n_expert_used,
        moe_intermediate_size=c.n_ff_exp, shared_expert_intermediate_size=c.n_ff_shexp, rms_norm_eps=c.eps,
        max_position_embeddings=c.context_length, block_length=c.block_length, threshold=c.threshold,
    )


def import_gguf(path: Path) -> Clover:
    """A clover GGUF back into this file's PyTorch model: weights dequantized to float32, and the
    converter's reorderings and transforms undone (its own tensor plans, run backwards); the embedded
    SentencePiece model as `.tokenizer_bytes`. Exporting the result gives the checkpoint the file was
    converted from, up to the file's quantization."""
    import tempfile

    import gguf as gg

    import clover_cpu
    from clover_cpu.convert.config import load_config
    from clover_cpu.convert.hf import Planner, neg_exp, plus_one
    from clover_cpu.convert.safetensors_lazy import LazyTensor

    shape = shape_of(clover_cpu.load(path).config)
    model = Clover(shape)
    state = {k: np.zeros(tuple(v.shape), np.float32) for k, v in model.state_dict().items()}
    stubs = {k: LazyTensor(k, "F32", tuple(v.shape), Path(k), 0) for k, v in state.items()}
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(shape.hf_config()))
        plans = Planner(load_config(Path(d)), stubs).plan()
    reader = gg.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    inverse = {plus_one: lambda x: x - np.float32(1), neg_exp: lambda x: np.log(-x)}
    for plan in plans:
        t = tensors[plan.name]
        x = gg.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(plan.n_rows, plan.row_len)
        if plan.fn is not None:
            x = inverse[plan.fn](x)
        if plan.col_perm is not None:
            y = np.empty_like(x)
            y[:, plan.col_perm] = x
            x = y
        k = 0
        for seg in plan.segments:
            state[seg.src.name].reshape(-1, plan.row_len)[seg.rows] = x[k : k + len(seg.rows)]
            k += len(seg.rows)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    spm = reader.fields.get("tokenizer.clover.spm_model")  # the tokenizer.model the file was converted with
    model.tokenizer_bytes = np.concatenate([spm.parts[i] for i in spm.data]).tobytes() if spm else None
    return model.eval()


@torch.no_grad()
def reference_decode(model: Clover, prompt: list[int], max_new_tokens: int, threshold: float,
                     block_length: int = 0) -> list[int]:
    """Greedy block-diffusion decoding (CLOVER.md section 4) the slow, obvious way: no caches, every step
    recomputes the whole sequence (committed tokens and the current block, block-causal attention). The
    prompt's full blocks are context; its tail heads the first block. Per step, every masked position whose
    argmax probability reaches the threshold is committed (at least the most confident one). Generation
    ends after max_new_tokens or at EOS (dropped with what follows it)."""
    B = block_length or model.shape.block_length
    seq = list(prompt)
    out: list[int] = []
    while len(out) < max_new_tokens:
        start = (len(seq) // B) * B
        head = seq[start:]
        budget = min(B - len(head), max_new_tokens - len(out))
        block = head + [MASK_ID] * (B - len(head))
        undecided = list(range(len(head), len(head) + budget))
        step = 0
        while undecided:
            x = torch.tensor(seq[:start] + block)[None]
            logits = model(x, "block", B)[0, start:].double()
            p = torch.softmax(logits[undecided], -1)
            conf, cand = p.max(-1)
            if step == B - 1:
                pick = list(range(len(undecided)))
            else:
                pick = [i for i in range(len(undecided)) if conf[i] >= threshold] or [int(conf.argmax())]
            for i in pick:
                block[undecided[i]] = int(cand[i])
            undecided = [u for i, u in enumerate(undecided) if i not in pick]
            step += 1
        new = block[len(head) : len(head) + budget]
        if EOS_ID in new:
            return out + new[: new.index(EOS_ID)]
        out += new
        seq = seq[:start] + block[: len(head) + budget]
    return out


# ---- evaluation ----


def _header(lines: list[str], node) -> str:
    """The source lines of a def/class header, decorators included, up to its first body statement."""
    first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    return "".join(lines[first : node.body[0].lineno - 1])


def _has_docstring(node) -> bool:
    b = node.body[0]
    return isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)


def eval_prompts(
    n: int = 20, sp=None, max_files: int = 0, max_prompt_tokens: int = 64
) -> list[tuple[str, str]]:
    """(prompt, true continuation) pairs from held-out files. A prompt is the header of a function without
    a docstring (a method's with its class's header line), so it ends with ':' and never parses alone; the
    continuation is the file's next 64 tokens (the body, in code). One prompt per file (the middle one of
    its candidates), files in sorted order."""
    fn = (ast.FunctionDef, ast.AsyncFunctionDef)
    out, seen = [], set()
    for _, text in read_corpus(max_files)["eval"]:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        cands = []  # (prompt, line index where the continuation starts)
        for node in tree.body:
            if isinstance(node, fn) and not _has_docstring(node):
                cands.append((_header(lines, node), node.body[0].lineno - 1))
            elif isinstance(node, ast.ClassDef):
                cls = "".join(lines[node.lineno - 1 : node.lineno])
                for item in node.body:
                    if isinstance(item, fn) and not _has_docstring(item) and cls.rstrip().endswith(":"):
                        cands.append((cls + _header(lines, item), item.body[0].lineno - 1))
        cands = [
            (p, j) for p, j in cands if p.rstrip().endswith(":") and len(sp.encode(p)) <= max_prompt_tokens
        ]
        if not cands:
            continue
        prompt, j = cands[len(cands) // 2]
        rest = sp.encode("".join(lines[j:]))[:64]
        if len(rest) == 64 and prompt not in seen:  # (the encodings/ modules repeat their classes)
            seen.add(prompt)
            out.append((prompt, sp.decode(rest)))
        if len(out) == n:
            break
    return out


def parses(prompt: str, completion: str) -> bool:
    """ast.parse of prompt + completion cut at the last complete line."""
    text = prompt + completion
    cut = text.rfind("\n")
    try:
        ast.parse(text[: cut + 1] if cut >= 0 else "")
        return True
    except (SyntaxError, ValueError):
        return False


def evaluate(
    out: Path, gguf: Path, r: Recipe, log, n_prompts: int = 20, max_files: int = 0, threshold: float = 0.9
) -> dict:
    """Held-out masked-token accuracy (PyTorch model), tokens per forward at `threshold` and the parse
    rate of 64-token completions (clover_cpu runtime) against the true continuations'."""
    import clover_cpu

    model = load_exported(out / "hf")
    sp = load_sp((out / "hf" / "tokenizer.model").read_bytes())
    eval_tokens = np.load(out / "eval_tokens.npy")
    res = {}
    B = model.shape.block_length
    # masked-token accuracy over fixed windows and masks, and per mask-ratio band
    with torch.no_grad():
        accs, ratios = [], []
        for i in range(8):
            rng = np.random.default_rng([r.seed, 98, i])
            x = ar_batch(eval_tokens, rng, 16, r.diff_seq - 1)
            masked = torch.from_numpy(diffusion_masks(rng, 16, r.diff_seq, B, 0.0))
            noisy = torch.where(masked, torch.full_like(x, MASK_ID), x)
            L = x.shape[1]
            logits = model.lm_head(
                model.hidden(torch.cat([x, noisy], 1), Plan.make("two_copy", 2 * L, B))[:, L:]
            )
            hit = (logits.argmax(-1) == x) & masked
            accs.append(hit.sum().item() / masked.sum().item())
            ratios.append(masked.reshape(16, -1, B).float().mean(-1).repeat_interleave(B, 1)[masked].numpy())
        res["masked_token_accuracy"] = float(np.mean(accs))
    m = clover_cpu.load(gguf)
    prompts = eval_prompts(n_prompts, sp=sp, max_files=max_files)
    tpf, ok_model, ok_true, samples = [], 0, 0, []
    fw, gen = 0, 0
    for prompt, truth in prompts:
        o = m.generate_text(prompt, max_new_tokens=64, threshold=threshold)
        fw += o["forwards"]
        gen += o["generated_tokens"]
        tpf.append(o["tokens_per_forward"])
        ok_model += parses(prompt, o["text"])
        ok_true += parses(prompt, truth)
        samples.append(
            {"prompt": prompt, "completion": o["text"], "truth": truth, "tpf": o["tokens_per_forward"]}
        )
    res.update(
        prompts=len(prompts),
        threshold=threshold,
        block_length=m.config.block_length,
        tokens_per_forward=gen / max(1, fw),
        tokens_per_forward_mean=float(np.mean(tpf)) if tpf else 0.0,
        parse_rate=ok_model / max(1, len(prompts)),
        parse_rate_true=ok_true / max(1, len(prompts)),
    )
    log(
        f"eval: masked-token accuracy {res['masked_token_accuracy']:.3f}; {len(prompts)} prompts at threshold "
        f"{threshold}, B={res['block_length']}: {res['tokens_per_forward']:.2f} tokens/forward; parse rate "
        f"{res['parse_rate']:.2f} (true continuations {res['parse_rate_true']:.2f})"
    )
    (out / "eval.json").write_text(json.dumps({**res, "samples": samples}, indent=1))
    return res


# ---- the loss curve as a PNG (matplotlib if present, else a tiny numpy rasteriser) ----

_FONT = {  # 3x5 glyphs, rows top to bottom
    "0": "111101101101111",
    "1": "010110010010111",
    "2": "111001111100111",
    "3": "111001111001111",
    "4": "101101111001001",
    "5": "111100111001111",
    "6": "111100111101111",
    "7": "111001001001001",
    "8": "111101111101111",
    "9": "111101111001111",
    ".": "000000000000010",
    "K": "101101110101101",
    "-": "000000111000000",
    " ": "000000000000000",
    "A": "010101111101101",
    "R": "110101110101101",
    "T": "111010010010010",
    "I": "111010010010111",
    "N": "110101101101101",
    "E": "111100110100111",
    "V": "101101101101010",
    "L": "100100100100111",
    "D": "110101101101110",
    "F": "111100110100100",
    "S": "011100010001110",
    "P": "110101110100100",
    "O": "010101101101010",
}


def _png(rgb: np.ndarray) -> bytes:
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def _text(img, x, y, s, color, scale=2):
    for ch in s:
        bits = _FONT.get(ch.upper(), _FONT[" "])
        for k, b in enumerate(bits):
            if b == "1":
                r, c = divmod(k, 3)
                img[y + r * scale : y + (r + 1) * scale, x + c * scale : x + (c + 1) * scale] = color
        x += 4 * scale


def plot_losses(series: list[tuple[str, np.ndarray, np.ndarray, tuple]], path: Path, xlabel="step") -> None:
    """series: (label, x, y, rgb). Writes a PNG of the curves (log-free y axis)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for label, x, y, color in series:
            ax.plot(x, y, label=label, color=np.array(color) / 255, lw=1.2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return
    except ImportError:
        pass
    W, H, m = 800, 450, 50
    img = np.full((H, W, 3), 255, np.uint8)
    xs = np.concatenate([s[1] for s in series]) if series else np.array([0.0, 1.0])
    ys = np.concatenate([s[2] for s in series]) if series else np.array([0.0, 1.0])
    x0, x1 = float(xs.min()), float(max(xs.max(), xs.min() + 1))
    y0, y1 = 0.0, float(np.percentile(ys, 99.5)) * 1.05 if ys.size else 1.0
    img[m : H - m, m] = img[H - m, m : W - m] = (0, 0, 0)
    for k in range(6):  # y ticks
        v = y0 + (y1 - y0) * k / 5
        py = int(H - m - (H - 2 * m) * k / 5)
        img[py, m - 4 : m] = (0, 0, 0)
        img[py, m + 1 : W - m : 4] = (220, 220, 220)
        _text(img, 4, py - 5, f"{v:.1f}", (0, 0, 0))
    for k in range(6):  # x ticks
        v = x0 + (x1 - x0) * k / 5
        px = int(m + (W - 2 * m) * k / 5)
        img[H - m : H - m + 4, px] = (0, 0, 0)
        _text(img, px - 10, H - m + 8, f"{v / 1000:.1f}k" if x1 >= 1000 else f"{v:.3g}", (0, 0, 0))
    for j, (_, x, y, color) in enumerate(series):
        px = m + (x - x0) / (x1 - x0) * (W - 2 * m)
        py = H - m - (np.clip(y, y0, y1) - y0) / (y1 - y0) * (H - 2 * m)
        for a in range(len(px) - 1):
            n = int(max(abs(px[a + 1] - px[a]), abs(py[a + 1] - py[a]))) + 1
            cx = np.linspace(px[a], px[a + 1], n + 1).astype(int)
            cy = np.linspace(py[a], py[a + 1], n + 1).astype(int)
            img[np.clip(cy, 0, H - 1), np.clip(cx, 0, W - 1)] = color
        img[14 + 16 * j : 17 + 16 * j, W - m - 150 : W - m - 120] = color  # legend
        _text(img, W - m - 110, 11 + 16 * j, series[j][0], (0, 0, 0))
    _text(img, W // 2 - 16, H - 18, xlabel, (0, 0, 0))
    _text(img, 4, 12, "LOSS", (0, 0, 0))
    path.write_bytes(_png(img))


def smooth(y: np.ndarray, k: int) -> np.ndarray:
    if len(y) < 2 or k <= 1:
        return y
    k = min(k, len(y))
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = (c[k:] - c[:-k]) / k
    return np.concatenate([y[: k - 1] * 0 + out[0], out])


def write_curve(state: dict, path: Path) -> None:
    """Train loss (smoothed) of both phases on one step axis, and the held-out points."""
    h = state["history"]
    series = []
    offset = 0
    for phase, color in (("ar", (31, 119, 180)), ("diffusion", (214, 39, 40))):
        rows = [e for e in h if e["phase"] == phase]
        if rows:
            x = np.array([offset + e["step"] for e in rows], float)
            y = np.array([e["loss"] for e in rows], float)
            series.append((f"{'diff' if phase == 'diffusion' else phase} train", x, smooth(y, 25), color))
            ev = [e for e in state["evals"] if e["phase"] == phase]
            if ev:
                series.append(
                    (
                        f"{'diff' if phase == 'diffusion' else phase} eval",
                        np.array([offset + e["step"] for e in ev], float),
                        np.array([e["loss"] for e in ev], float),
                        tuple(c // 2 for c in color),
                    )
                )
            offset = x.max() + 1
    plot_losses(series, path)


# ---- main ----


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parent / "out"),
        help="output folder (checkpoint, hf/, GGUF, log, PNG); default train/out beside this script",
    )
    ap.add_argument(
        "--minutes",
        type=float,
        default=150.0,
        help="wall-time budget for tokenizer + training + export + conversion (default 150)",
    )
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS), help="model shape (default small)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights, batches and masks (default 0)")
    ap.add_argument(
        "--ar-steps", type=int, default=0, help="next-token steps (default 0: planned from --minutes)"
    )
    ap.add_argument(
        "--diffusion-steps", type=int, default=0, help="block-diffusion steps (default 0: planned)"
    )
    ap.add_argument(
        "--ar-share", type=float, default=0.5, help="share of the training time for next-token steps"
    )
    ap.add_argument(
        "--block-length", type=int, default=0, help="diffusion block length (default: the preset's, 8)"
    )
    ap.add_argument("--ar-batch", type=int, default=8, help="sequences per next-token step (default 8)")
    ap.add_argument("--ar-seq", type=int, default=512, help="tokens per next-token sequence (default 512)")
    ap.add_argument("--diff-batch", type=int, default=16, help="sequences per diffusion step (default 16)")
    ap.add_argument("--diff-seq", type=int, default=256, help="tokens per diffusion sequence (default 256)")
    ap.add_argument(
        "--lr", type=float, default=2e-3, help="peak learning rate of next-token steps (default 2e-3)"
    )
    ap.add_argument(
        "--diff-lr", type=float, default=1e-3, help="peak learning rate of diffusion steps (default 1e-3)"
    )
    ap.add_argument("--warmup", type=int, default=100, help="warm-up steps of each phase (default 100)")
    ap.add_argument(
        "--type", default="q8_0", choices=["f32", "f16", "q8_0"], help="GGUF weight format (default q8_0)"
    )
    ap.add_argument("--gguf", default=None, help="GGUF path (default OUT/clover-small.gguf)")
    ap.add_argument(
        "--max-files", type=int, default=0, help="use only this many stdlib files (tests; 0 = all)"
    )
    ap.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16"],
        help="matrix products in bf16 autocast (fp32 weights, optimizer and delta rule) or fp32; auto: bf16 "
        "where the CPU has AVX512-BF16/AMX or on a GPU, else fp32",
    )
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu; cuda where there is a GPU)")
    ap.add_argument("--log-every", type=int, default=20, help="progress line every N steps (default 20)")
    ap.add_argument("--eval-every", type=int, default=200, help="held-out loss every N steps (default 200)")
    ap.add_argument("--save-minutes", type=float, default=5.0, help="checkpoint every N minutes (default 5)")
    ap.add_argument("--eval", action="store_true", help="only evaluate the finished run in OUT (no training)")
    ap.add_argument("--eval-prompts", type=int, default=20, help="held-out prompts for --eval (default 20)")
    ap.add_argument("--no-eval", action="store_true", help="skip the evaluation at the end of training")
    ap.add_argument(
        "--data-only",
        action="store_true",
        help="write the tokenizer and token streams to OUT and stop (to carry them to another machine)",
    )
    ap.add_argument(
        "--no-convert",
        action="store_true",
        help="stop after the export to OUT/hf (no conversion, no evaluation): for a machine without clover-cpu, "
        "such as a GPU box; convert and --eval where clover-cpu is installed",
    )
    ap.add_argument(
        "--extend-minutes",
        type=float,
        default=0.0,
        help="continue a finished run with a second diffusion stage of about this many minutes (own warm-up "
        "and decay); export, conversion and evaluation follow as usual",
    )
    ap.add_argument(
        "--extend-lr", type=float, default=5e-4, help="peak learning rate of that stage (default 5e-4)"
    )
    ap.add_argument(
        "--stop-after-steps",
        type=int,
        default=0,
        help="checkpoint and exit after N steps of this session (tests of resuming; 0 = off)",
    )
    a = ap.parse_args(argv)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.log", "a") as logf:

        def log(msg: str) -> None:
            line = f"[{time.strftime('%H:%M:%S')}] {msg}"
            print(line, flush=True)
            logf.write(line + "\n")
            logf.flush()

        return run(a, log)


def run(a, log) -> int:
    t_start = time.time()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    out = Path(a.out)
    gguf = Path(a.gguf) if a.gguf else out / "clover-small.gguf"
    shape = PRESETS[a.preset]
    if a.block_length:
        shape = Shape(**{**asdict(shape), "block_length": a.block_length})
    r = Recipe(
        seed=a.seed,
        ar_seq=a.ar_seq,
        ar_batch=a.ar_batch,
        diff_seq=a.diff_seq,
        diff_batch=a.diff_batch,
        ar_lr=a.lr,
        diff_lr=a.diff_lr,
        warmup=a.warmup,
        ar_share=a.ar_share,
        ar_steps=a.ar_steps,
        diff_steps=a.diffusion_steps,
        precision=a.precision,
    )
    if r.precision == "auto":
        r.precision = "bf16" if torch.device(a.device).type == "cuda" or cpu_has_bf16() else "fp32"
    if r.diff_seq % shape.block_length:
        raise SystemExit("--diff-seq must be a multiple of the block length")
    if a.eval:
        evaluate(out, gguf, r, log, a.eval_prompts, a.max_files, shape.threshold)
        return 0
    log(
        f"start: preset {a.preset}, seed {a.seed}, budget {a.minutes} min, torch {torch.__version__}, "
        f"{a.threads} threads, {r.precision}, python {sys.version.split()[0]}"
    )
    tokenizer, tokens, eval_tokens = prepare_data(out, shape.vocab_size, a.max_files, log)
    if a.data_only:
        return 0
    reserve = (20.0 if a.no_convert else 90.0) + 0.02 * a.minutes * 60  # export + conversion + slack
    budget = max(10.0, a.minutes * 60 - (time.time() - t_start) - reserve)
    model = train(a, shape, r, tokens, eval_tokens, budget, log)
    if model is None:
        return 0
    write_curve(model.train_state, out / "loss.png")
    (out / "history.json").write_text(
        json.dumps(
            {"plan": r.plan, "evals": model.train_state["evals"], "elapsed_s": model.train_state["elapsed"]},
            indent=1,
        )
    )
    export(model.cpu(), tokenizer, out / "hf")
    if a.no_convert:
        log(f"exported {out / 'hf'}; {(time.time() - t_start) / 60:.1f} min this session (--no-convert)")
        return 0
    convert(out / "hf", gguf, a.type)
    size = gguf.stat().st_size
    log(f"wrote {gguf} ({size / 1e6:.1f} MB, {a.type}); {(time.time() - t_start) / 60:.1f} min this session")
    if size > 20e6:
        log("warning: the GGUF is larger than 20 MB")
    if not a.no_eval:
        evaluate(out, gguf, r, log, a.eval_prompts, a.max_files, shape.threshold)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
