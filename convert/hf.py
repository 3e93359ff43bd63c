"""Hugging Face Qwen3.5-MoE / Clover checkpoints -> GGUF, one tensor at a time.

Every GGUF tensor is planned up front (name, shape, which source rows, which transform), checked
against the config, then streamed: source rows are read from the memory-mapped safetensors in
chunks, transformed, quantized with the C++ kernels on all threads and appended to a temporary file
that is renamed to the final name only when complete.
"""

from __future__ import annotations

import errno
import os
import queue
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .config import ModelConfig, load_config
from .errors import ConvertError
from .recipes import FTYPES, LlamaRecipe
from .safetensors_lazy import LazyTensor, close_files, open_checkpoint
from .tokenizer import SPM_MODEL_KEY, Vocab, read_tokenizer

OUT_TYPES = ("f32", "f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "iq4_xs", "iq4_nl", "q3_k_m", "q3_k_s", "q2_k")
FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18,
             "bf16": 32, **FTYPES}  # llama.cpp LlamaFileType
GGML_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_k": 10, "q3_k": 11,
             "q4_k": 12, "q5_k": 13, "q6_k": 14, "iq4_nl": 20, "iq4_xs": 23, "bf16": 30}
BLOCK = {"f32": 1, "f16": 1, "bf16": 1, "q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "iq4_nl": 32,
         "q4_k": 256, "q5_k": 256, "q6_k": 256, "q2_k": 256, "q3_k": 256, "iq4_xs": 256}
# the formats whose quantizers take an importance matrix, as in llama-quantize (q8_0's ignores one there too)
IMATRIX_TYPES = {"q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "iq4_xs"}
CHUNK_VALUES = 1 << 24  # float32 values per work chunk (64 MB): bounds the converter's memory


@dataclass
class Segment:
    src: LazyTensor
    rows: np.ndarray  # row indices into src seen as [numel // row_len, row_len]


@dataclass
class TensorPlan:
    name: str  # GGUF name
    shape: tuple[int, ...]  # numpy order (GGUF ne reversed); the last dim is the row length
    segments: list[Segment]  # output rows, in order, taken from these source rows
    kind: str  # recipe class: norm, router, conv, ssm, embd, output, attn_v, ffn_down, ...
    layer: int | None = None
    col_perm: np.ndarray | None = None  # output column j = source column col_perm[j]
    fn: Callable[[np.ndarray], np.ndarray] | None = None  # elementwise transform after reordering

    @property
    def row_len(self) -> int:
        return self.shape[-1]

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def src_bytes(self) -> int:
        return sum(len(s.rows) * self.row_len * {"BF16": 2, "F16": 2, "F32": 4}[s.src.dtype] for s in self.segments)


# ---- planning: checkpoint names -> GGUF names, shapes and transforms ----


def v_head_order(c: ModelConfig) -> np.ndarray:
    """Value heads from grouped order (head h uses key head h // r) to llama.cpp's tiled order
    (head h uses key head h % Hk): new head j * Hk + g <- old head g * r + j."""
    hk, r = c.n_k_heads, c.n_v_heads // c.n_k_heads
    return np.array([(n % hk) * r + n // hk for n in range(c.n_v_heads)], dtype=np.int64)


def head_rows(order: np.ndarray, head_dim: int) -> np.ndarray:
    return (order[:, None] * head_dim + np.arange(head_dim)[None, :]).reshape(-1)


def plus_one(x: np.ndarray) -> np.ndarray:
    return x + np.float32(1)


def neg_exp(x: np.ndarray) -> np.ndarray:
    return -np.exp(x)


class Planner:
    def __init__(self, c: ModelConfig, tensors: dict[str, LazyTensor]):
        self.c = c
        self.tensors = tensors
        self.used: set[str] = set()
        self.prefix = self._prefix()

    def _prefix(self) -> str:
        for p in ("model.language_model.", "model."):
            if f"{p}embed_tokens.weight" in self.tensors:
                return p
        raise ConvertError("tensor model.embed_tokens.weight is missing from the checkpoint")

    def get(self, name: str, shape: tuple[int, ...]) -> LazyTensor:
        t = self.tensors.get(name)
        if t is None:
            raise ConvertError(f"tensor {name} is missing from the checkpoint")
        if tuple(t.shape) != tuple(shape):
            raise ConvertError(f"tensor {name} has shape {list(t.shape)}, expected {list(shape)}")
        if t.dtype not in ("BF16", "F16", "F32"):
            raise ConvertError(f"tensor {name} has dtype {t.dtype}; only BF16, F16 and F32 are supported")
        self.used.add(name)
        return t

    def whole(self, gguf: str, src: str, shape: tuple[int, ...], kind: str, layer=None, **kw) -> TensorPlan:
        t = self.get(src, shape)
        out_shape = tuple(shape) if len(shape) > 1 else (shape[0],)
        n_rows = t.numel // out_shape[-1]
        return TensorPlan(gguf, out_shape, [Segment(t, np.arange(n_rows))], kind, layer, **kw)

    def mtp_prefix(self) -> str | None:
        """Where the checkpoint keeps its multi-token-prediction head (mtp.* or model.mtp.*), if it has one."""
        for p in ("mtp.", "model.mtp."):
            if f"{p}fc.weight" in self.tensors:
                return p
        return None

    def plan(self, mtp: bool = True) -> list[TensorPlan]:
        """Every output tensor. mtp: the MTP head (config mtp_num_hidden_layers, mtp.* tensors) as llama.cpp's
        converter writes it: layer k becomes block n_layer + k with the usual tensor names, plus
        blk.N.nextn.eh_proj (mtp.fc), nextn.enorm / nextn.hnorm (the norms before fc of the embedding and of the
        hidden state) and nextn.shared_head_norm (mtp.norm)."""
        c, p = self.c, self.prefix
        H, V = c.n_embd, c.vocab_size
        plans = [self.whole("token_embd.weight", f"{p}embed_tokens.weight", (V, H), "embd")]
        for i in range(c.n_layer):
            plans += self.layer(i)
        mp = self.mtp_prefix() if mtp else None
        for k in range(c.n_mtp if mp else 0):
            i, b = c.n_layer + k, f"blk.{c.n_layer + k}."
            plans += self.layer(i, f"{mp}layers.{k}.")
            if k == 0:
                plans += [
                    self.whole(b + "nextn.eh_proj.weight", mp + "fc.weight", (H, 2 * H), "nextn_eh_proj", i),
                    self.whole(b + "nextn.enorm.weight", mp + "pre_fc_norm_embedding.weight", (H,), "norm", i,
                               fn=plus_one),
                    self.whole(b + "nextn.hnorm.weight", mp + "pre_fc_norm_hidden.weight", (H,), "norm", i,
                               fn=plus_one),
                    self.whole(b + "nextn.shared_head_norm.weight", mp + "norm.weight", (H,), "norm", i, fn=plus_one),
                ]
        plans.append(self.whole("output_norm.weight", f"{p}norm.weight", (H,), "norm", fn=plus_one))
        if "lm_head.weight" in self.tensors or not c.tie_word_embeddings:
            plans.append(self.whole("output.weight", "lm_head.weight", (V, H), "output"))
        return plans

    def layer(self, i: int, src: str | None = None) -> list[TensorPlan]:
        """Block i's tensors, read from the checkpoint's layer i (or from `src`, for an MTP layer)."""
        c, L = self.c, src or f"{self.prefix}layers.{i}."
        H, E, I, Is = c.n_embd, c.n_expert, c.n_ff_exp, c.n_ff_shexp
        b = f"blk.{i}."
        out = [
            self.whole(b + "attn_norm.weight", L + "input_layernorm.weight", (H,), "norm", i, fn=plus_one),
            self.whole(b + "post_attention_norm.weight", L + "post_attention_layernorm.weight", (H,), "norm", i, fn=plus_one),
        ]
        if c.is_recurrent(i):
            out += self.gdn(i, L + "linear_attn.", b)
        else:
            a, D = L + "self_attn.", c.head_dim
            out += [
                self.whole(b + "attn_q.weight", a + "q_proj.weight", (2 * c.n_head * D, H), "attn_q", i),
                self.whole(b + "attn_k.weight", a + "k_proj.weight", (c.n_head_kv * D, H), "attn_k", i),
                self.whole(b + "attn_v.weight", a + "v_proj.weight", (c.n_head_kv * D, H), "attn_v", i),
                self.whole(b + "attn_output.weight", a + "o_proj.weight", (H, c.n_head * D), "attn_output", i),
                self.whole(b + "attn_q_norm.weight", a + "q_norm.weight", (D,), "norm", i, fn=plus_one),
                self.whole(b + "attn_k_norm.weight", a + "k_norm.weight", (D,), "norm", i, fn=plus_one),
            ]
        m = L + "mlp."
        out.append(self.whole(b + "ffn_gate_inp.weight", m + "gate.weight", (E, H), "router", i))
        if m + "experts.gate_up_proj" in self.tensors:
            gu = self.get(m + "experts.gate_up_proj", (E, 2 * I, H))
            dn = self.get(m + "experts.down_proj", (E, H, I))
            base = (np.arange(E) * 2 * I)[:, None]
            gate_rows = (base + np.arange(I)[None, :]).reshape(-1)
            out += [
                TensorPlan(b + "ffn_gate_exps.weight", (E, I, H), [Segment(gu, gate_rows)], "ffn_gate_exps", i),
                TensorPlan(b + "ffn_up_exps.weight", (E, I, H), [Segment(gu, gate_rows + I)], "ffn_up_exps", i),
                TensorPlan(b + "ffn_down_exps.weight", (E, H, I), [Segment(dn, np.arange(E * H))], "ffn_down_exps", i),
            ]
        else:
            for proj, shape, kind in (("gate", (I, H), "ffn_gate_exps"), ("up", (I, H), "ffn_up_exps"), ("down", (H, I), "ffn_down_exps")):
                segs = [Segment(self.get(f"{m}experts.{e}.{proj}_proj.weight", shape), np.arange(shape[0])) for e in range(E)]
                out.append(TensorPlan(f"{b}{kind}.weight", (E, *shape), segs, kind, i))
        s = m + "shared_expert."
        out += [
            self.whole(b + "ffn_gate_inp_shexp.weight", m + "shared_expert_gate.weight", (1, H), "router", i),
            self.whole(b + "ffn_gate_shexp.weight", s + "gate_proj.weight", (Is, H), "ffn_gate_shexp", i),
            self.whole(b + "ffn_up_shexp.weight", s + "up_proj.weight", (Is, H), "ffn_up_shexp", i),
            self.whole(b + "ffn_down_shexp.weight", s + "down_proj.weight", (H, Is), "ffn_down_shexp", i),
        ]
        return out

    def gdn(self, i: int, a: str, b: str) -> list[TensorPlan]:
        c, H = self.c, self.c.n_embd
        order = v_head_order(c)
        v_rows = head_rows(order, c.v_head_dim)  # reordered rows of a [value_dim, ...] tensor
        qkv = self.get(a + "in_proj_qkv.weight", (c.conv_dim, H))
        qk = np.arange(2 * c.key_dim)
        conv = self.get(a + "conv1d.weight", (c.conv_dim, 1, c.conv_kernel))

        def per_head(gguf, src, shape, kind, fn=None):
            t = self.get(src, shape)
            rows = head_rows(order, 1) if len(shape) == 1 else order
            if len(shape) == 1:  # a vector of one value per head: reorder its columns
                return TensorPlan(gguf, shape, [Segment(t, np.arange(1))], kind, i, col_perm=order, fn=fn)
            return TensorPlan(gguf, shape, [Segment(t, rows)], kind, i, fn=fn)

        return [
            TensorPlan(b + "attn_qkv.weight", (c.conv_dim, H), [Segment(qkv, np.concatenate([qk, 2 * c.key_dim + v_rows]))], "attn_qkv", i),
            TensorPlan(b + "attn_gate.weight", (c.value_dim, H), [Segment(self.get(a + "in_proj_z.weight", (c.value_dim, H)), v_rows)], "attn_gate", i),
            per_head(b + "ssm_beta.weight", a + "in_proj_b.weight", (c.n_v_heads, H), "ssm_ba"),
            per_head(b + "ssm_alpha.weight", a + "in_proj_a.weight", (c.n_v_heads, H), "ssm_ba"),
            TensorPlan(b + "ssm_conv1d.weight", (c.conv_dim, c.conv_kernel), [Segment(conv, np.concatenate([qk, 2 * c.key_dim + v_rows]))], "conv", i),
            per_head(b + "ssm_dt.bias", a + "dt_bias", (c.n_v_heads,), "ssm"),
            per_head(b + "ssm_a", a + "A_log", (c.n_v_heads,), "ssm", fn=neg_exp),
            self.whole(b + "ssm_norm.weight", a + "norm.weight", (c.v_head_dim,), "norm", i),
            TensorPlan(b + "ssm_out.weight", (H, c.value_dim), [Segment(self.get(a + "out_proj.weight", (H, c.value_dim)), np.arange(H))], "ssm_out", i, col_perm=v_rows),
        ]

    def leftovers(self) -> tuple[list[str], list[str]]:
        """(skipped with a note: mtp.* and visual weights, unknown: anything else unused)."""
        skipped, unknown = [], []
        for name in self.tensors:
            if name in self.used:
                continue
            if name.startswith(("mtp.", "model.mtp.")) or ".visual." in name or name.startswith("visual.") or name.startswith("model.visual"):
                skipped.append(name)
            else:
                unknown.append(name)
        return skipped, unknown


# ---- the quantization recipe ----

F32_KINDS = {"norm", "router", "conv", "ssm"}
K_MIX = {"q4_k_m": "q4_k", "q5_k_m": "q5_k"}  # the mixed recipes and their base format


def use_more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's Q4_K_M / Q5_K_M choice of layers that keep 6 bits: the first and last eighth, every third
    between."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def tensor_type(plan: TensorPlan, out_type: str, n_layer: int) -> str:
    """The block format of one tensor, with a fallback when its rows are not a whole number of blocks."""
    if plan.kind in F32_KINDS or len(plan.shape) == 1:
        return "f32"
    if out_type not in K_MIX:
        want = out_type
    elif plan.kind == "output":
        want = "q6_k"
    elif plan.kind in ("attn_v", "ffn_down_exps", "ffn_down_shexp") and use_more_bits(plan.layer, n_layer):
        want = "q6_k"
    else:
        want = K_MIX[out_type]
    for t in (want, "q8_0", "f16"):
        if plan.row_len % BLOCK[t] == 0:
            return t
    return "f16"


RECIPE_TEXT = {
    "q3_k_m": "q3_k_m: llama-quantize's Q3_K_M (Q3_K; attn_v / attn_qkv Q5_K for the first two then Q4_K, ffn_down "
    "Q4_K (Q5_K in the first 16th of the layers), attn_output Q4_K, output Q6_K)",
    "q3_k_s": "q3_k_s: llama-quantize's Q3_K_S (Q3_K everywhere, output Q6_K): the smallest 3-bit mix",
    "q2_k": "q2_k: llama-quantize's Q2_K (Q2_K; ffn_down and attn_output Q3_K, attn_v / attn_qkv Q4_K with 4+ "
    "query heads per KV head, output Q6_K)",
    "iq4_xs": "iq4_xs: llama-quantize's IQ4_XS (attn_v / attn_qkv Q5_K with 4+ query heads per KV head, ffn_down "
    "Q5_K in the first 8th of the layers without an importance matrix, output Q6_K)",
    "iq4_nl": "iq4_nl: llama-quantize's IQ4_NL (as iq4_xs, with IQ4_NL's 32-value blocks)",
    "q4_k_m": "q4_k_m: experts, projections and embeddings Q4_K; LM head Q6_K; attn_v, ffn_down_exps and "
    "ffn_down_shexp Q6_K in the first and last eighth of the layers and every third layer between; "
    "norms, routers, shared-expert gates, ssm_a, ssm_dt and conv weights F32",
    "q5_k_m": "q5_k_m: as q4_k_m with Q5_K in place of Q4_K",
}


# ---- metadata ----


def write_metadata(w, c: ModelConfig, vocab: Vocab, out_type: str, name: str, n_mtp: int = 0) -> None:
    """The file's metadata; n_mtp MTP layers written after the main ones (block_count counts them and
    {arch}.nextn_predict_layers says how many, as llama.cpp's converter writes them)."""
    import gguf

    arch = c.arch
    w.add_string("general.name", name)
    w.add_uint32("general.file_type", FILE_TYPE[out_type])
    w.add_uint32("general.quantization_version", 2)
    u32 = {
        "context_length": c.context_length,
        "embedding_length": c.n_embd,
        "block_count": c.n_layer + n_mtp,
        "attention.head_count": c.n_head,
        "attention.head_count_kv": c.n_head_kv,
        "attention.key_length": c.head_dim,
        "attention.value_length": c.head_dim,
        "rope.dimension_count": c.n_rot,
        "expert_count": c.n_expert,
        "expert_used_count": c.n_expert_used,
        "expert_feed_forward_length": c.n_ff_exp,
        "expert_shared_feed_forward_length": c.n_ff_shexp,
        "ssm.conv_kernel": c.conv_kernel,
        "ssm.state_size": c.k_head_dim,
        "ssm.group_count": c.n_k_heads,
        "ssm.time_step_rank": c.n_v_heads,
        "ssm.inner_size": c.value_dim,
        "full_attention_interval": _interval(c),
    }
    for key, v in u32.items():
        w.add_uint32(f"{arch}.{key}", int(v))
    w.add_float32(f"{arch}.rope.freq_base", c.rope_theta)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.add_array(f"{arch}.rope.dimension_sections", [int(s) for s in c.mrope_section])
    w.add_array(f"{arch}.attention.recurrent_layers", [bool(c.is_recurrent(i)) for i in range(c.n_layer + n_mtp)])
    if n_mtp:
        w.add_uint32(f"{arch}.nextn_predict_layers", n_mtp)
    if c.k_head_dim != c.v_head_dim:
        w.add_uint32(f"{arch}.ssm.value_head_dim", c.v_head_dim)
    if arch == "clover":
        w.add_uint32("clover.diffusion.block_length", c.block_length)
        w.add_float32("clover.diffusion.threshold", c.threshold)
        w.add_bool("diffusion.shift_logits", c.shift_logits)
        w.add_uint32("tokenizer.ggml.mask_token_id", int(c.mask_token_id))
    # tokenizer
    w.add_string("tokenizer.ggml.model", vocab.model)
    if vocab.pre:
        w.add_string("tokenizer.ggml.pre", vocab.pre)
    w.add_array("tokenizer.ggml.tokens", vocab.tokens)
    w.add_array("tokenizer.ggml.token_type", vocab.types)
    if vocab.scores is not None:
        w.add_array("tokenizer.ggml.scores", [float(s) for s in vocab.scores])
    if vocab.merges:
        w.add_array("tokenizer.ggml.merges", vocab.merges)
    special = dict(vocab.special)
    for key, cid in (("bos", c.bos_token_id), ("eos", c.eos_token_id), ("pad", c.pad_token_id)):
        if cid is not None:
            special[key] = int(cid)
    ids = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
           "pad": "tokenizer.ggml.padding_token_id", "unk": "tokenizer.ggml.unknown_token_id"}
    for key, gkey in ids.items():
        if key in special and 0 <= special[key] < c.vocab_size:
            w.add_uint32(gkey, special[key])
    w.add_bool("tokenizer.ggml.add_bos_token", vocab.add_bos)
    w.add_bool("tokenizer.ggml.add_eos_token", False)
    if vocab.chat_template:
        w.add_string("tokenizer.chat_template", vocab.chat_template)
    if vocab.add_space_prefix is not None:
        w.add_add_space_prefix(vocab.add_space_prefix)
    if vocab.spm_bytes is not None:
        w.add_key_value(SPM_MODEL_KEY, list(vocab.spm_bytes), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT8)



def _interval(c: ModelConfig) -> int:
    full = [i for i in range(c.n_layer) if not c.is_recurrent(i)]
    return full[0] + 1 if full else c.n_layer + 1


# ---- progress ----


class Progress:
    def __init__(self, n_tensors: int, n_bytes: int, stream=sys.stderr):
        self.n_tensors, self.n_bytes = n_tensors, max(n_bytes, 1)
        self.done_tensors = self.done_bytes = 0
        self.start = time.monotonic()
        self.stream = stream
        self.tty = stream.isatty()
        self.last_pct = -1

    def update(self, tensors: int = 0, nbytes: int = 0, name: str = "") -> None:
        self.done_tensors += tensors
        self.done_bytes += nbytes
        elapsed = time.monotonic() - self.start
        frac = self.done_bytes / self.n_bytes
        rate = self.done_bytes / elapsed / 1e6 if elapsed > 0 else 0.0
        eta = elapsed * (1 - frac) / frac if frac > 0 else 0.0
        line = (f"[{self.done_tensors}/{self.n_tensors} tensors] {self.done_bytes / 1e9:.2f}/{self.n_bytes / 1e9:.2f} GB "
                f"{100 * frac:5.1f}% {rate:.0f} MB/s ETA {eta:.0f}s {name}")
        if self.tty:
            width = 30
            bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
            self.stream.write(f"\r|{bar}| {line[:100]:<100}")
            self.stream.flush()
        elif int(100 * frac) // 10 != self.last_pct // 10 or (tensors and self.done_tensors == self.n_tensors):
            self.last_pct = int(100 * frac)
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# ---- the conversion ----


def tensor_chunks(plan: TensorPlan):
    """Row chunks of one output tensor, transformed, at most CHUNK_VALUES values each. Rows that need
    no transform stay in their stored dtype (bf16 as uint16), to be widened by the quantizer threads."""
    k = plan.row_len
    step = max(1, CHUNK_VALUES // k)
    for seg in plan.segments:
        src_len = seg.src.shape[-1] if len(seg.src.shape) > 1 else seg.src.shape[0]
        raw = plan.fn is None and plan.col_perm is None
        for r0 in range(0, len(seg.rows), step):
            idx = seg.rows[r0 : r0 + step]
            if raw:
                yield seg.src.take_raw_rows(k, idx), seg.src.dtype
                continue
            x = seg.src.take_rows(src_len if plan.col_perm is not None else k, idx)
            if plan.col_perm is not None:
                x = x[:, plan.col_perm]
            if plan.fn is not None:
                x = plan.fn(x)
            yield np.ascontiguousarray(x, dtype=np.float32), "F32"


class ReadAhead:
    """tensor_chunks of every plan, in order, produced on a background thread `depth` chunks ahead, so
    that reading the checkpoint (I/O) overlaps quantizing (the kernels' threads); both release the GIL.
    An error while reading is raised again in the caller's thread."""

    def __init__(self, plans: list[TensorPlan], depth: int = 2):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(plans,), name="convert-read-ahead", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def _run(self, plans: list[TensorPlan]) -> None:
        try:
            for i, plan in enumerate(plans):
                for chunk in tensor_chunks(plan):
                    if not self._put((i, chunk)):
                        return
                if not self._put((i, None)):  # the end of plan i
                    return
        except BaseException as e:  # handed to the consumer
            self._put((-1, e))

    def chunks(self, i: int):
        """The chunks of plan i (the plans are consumed in order)."""
        while True:
            try:
                j, item = self._q.get(timeout=0.5)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise ConvertError("internal: the checkpoint reader stopped") from None
                continue
            if j == -1:
                raise item
            if j != i:
                raise ConvertError(f"internal: read-ahead out of order ({j} != {i})")
            if item is None:
                return
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def convert(src: str | Path, out: str | Path, *, out_type: str = "q4_k_m", threads: int = 0, force: bool = False,
            log=print, progress: bool = True, mtp: bool = True, split_max_size: int = 0,
            imatrix: str | Path | None = None) -> dict:
    """Convert the checkpoint folder src into the GGUF file out. Returns a summary dict. mtp: keep a
    multi-token-prediction head (as llama.cpp's converter does; False: leave it out). split_max_size: write
    parts of at most this many bytes of tensor data, llama.cpp's split format (OUT-00001-of-0000K.gguf).
    imatrix: llama.cpp's importance matrix (llama-imatrix's GGUF or legacy .dat) for every tensor whose type's
    quantizer takes one (the k-quants, q4_0, q4_1, q5_0, q5_1 and iq4), as llama-quantize uses it."""
    from clover_cpu import kernels, set_num_threads

    src, out = Path(src), Path(out)
    if out_type not in OUT_TYPES:
        raise ConvertError(f"unknown --type {out_type!r} (choose from {', '.join(OUT_TYPES)})")
    if not src.is_dir():
        raise ConvertError(f"{src} is not a folder (expected a Hugging Face checkpoint folder)")
    if out.exists() and not force:
        raise ConvertError(f"{out} exists; pass --force to overwrite it")
    if not out.parent.exists():
        raise ConvertError(f"output folder {out.parent} does not exist")
    if threads:
        set_num_threads(threads)
    c = load_config(src)
    tensors = open_checkpoint(src)
    planner = Planner(c, tensors)
    has_mtp = c.n_mtp > 0 and planner.mtp_prefix() is not None
    n_mtp = c.n_mtp if has_mtp and mtp else 0
    plans = planner.plan(mtp=bool(n_mtp))
    skipped, unknown = planner.leftovers()
    vocab = read_tokenizer(src, c.vocab_size)
    if n_mtp:
        log(f"mtp: the {n_mtp}-layer multi-token-prediction head is kept as blk.{c.n_layer} (llama.cpp's layout: "
            "block_count includes it, nextn_predict_layers says so; decoding does not run it); --no-mtp leaves it out")
    elif has_mtp:
        log("mtp: the multi-token-prediction head is left out (--no-mtp)")
    elif c.n_mtp:
        log("note: config.json lists an MTP head but the checkpoint has no mtp.* tensors; none is written")
    if skipped:
        log(f"note: skipping {len(skipped)} tensors that the runtime does not use (vision"
            f"{', mtp.*' if any(n.startswith(('mtp.', 'model.mtp.')) for n in skipped) else ''})")
    if unknown:
        log(f"note: ignoring {len(unknown)} unexpected tensors, e.g. {unknown[0]}")
    imat = None
    if imatrix is not None:
        from .imatrix import load_imatrix

        imat = load_imatrix(imatrix)
        log(f"imatrix: {len(imat)} entries from {Path(imatrix).name}")
    if out_type in FTYPES:
        # llama-quantize's per-tensor choice for this recipe, counters in file order (convert/recipes.py)
        rec = LlamaRecipe(out_type, [p.name for p in plans], c.n_layer + n_mtp, c.n_expert, c.n_head // c.n_head_kv,
                          imat is not None)
        types = {}
        for p in plans:
            kept = "f32" if (p.kind in F32_KINDS or len(p.shape) == 1) else "f16"
            n_dims = len(p.shape) - next((i for i, d in enumerate(p.shape) if d != 1), len(p.shape))  # ggml_n_dims
            types[p.name] = rec.type_of(p.name, max(1, n_dims), p.row_len, kept)
    else:
        types = {p.name: tensor_type(p, out_type, c.n_layer) for p in plans}
    parts = split_plan(plans, types, split_max_size)
    log(f"model: {c.model_type} -> {c.arch}, {c.n_layer} layers, hidden {c.n_embd}, {c.n_expert} experts "
        f"(top {c.n_expert_used}), vocab {c.vocab_size}")
    log("recipe: " + RECIPE_TEXT.get(out_type, f"{out_type} for 2-D weights; norms, routers, ssm_a, ssm_dt, conv F32"))
    fallbacks = [] if out_type in FTYPES else sorted(
        {p.name for p in plans if types[p.name] not in (out_type, "f32", K_MIX.get(out_type), "q6_k")})
    if fallbacks:
        log(f"note: {len(fallbacks)} tensors have rows that are not whole {out_type} blocks and use "
            f"{', '.join(sorted({types[n] for n in fallbacks}))} instead (e.g. {fallbacks[0]})")

    import gguf

    outs = split_names(out, len(parts))
    if len(parts) > 1:
        for o in outs:
            if o.exists() and not force:
                raise ConvertError(f"{o} exists; pass --force to overwrite it")
        log(f"split: {len(parts)} parts of at most {split_max_size / 1e9:.2f} GB of tensor data: {outs[0].name} ... "
            f"{outs[-1].name}")
    tmps = [o.with_name(f".{o.name}.partial-{os.getpid()}") for o in outs]
    total_src = sum(p.src_bytes for p in plans)
    bar = Progress(len(plans), total_src) if progress else None
    n_params = n_bits = 0
    old_handler = None
    reader = None
    try:
        # SIGTERM becomes KeyboardInterrupt so the partial file is removed on any polite stop
        if threading_is_main():
            old_handler = signal.signal(signal.SIGTERM, _raise_interrupt)
        reader = ReadAhead(plans)
        done = 0
        for k, (part, path) in enumerate(zip(parts, tmps)):
            w = gguf.GGUFWriter(path, c.arch)
            if k == 0:
                write_metadata(w, c, vocab, out_type, src.resolve().name, n_mtp)
            if len(parts) > 1:  # llama.cpp's gguf-split keys, in every part
                w.add_uint16("split.no", k)
                w.add_uint16("split.count", len(parts))
                w.add_int32("split.tensors.count", len(plans))
            for p in part:
                t = types[p.name]
                rb = kernels.row_bytes(t, p.row_len)
                byte_shape = (*p.shape[:-1], rb) if len(p.shape) > 1 else (rb,)
                w.add_tensor_info(p.name, byte_shape, np.dtype(np.uint8), p.n_rows * rb,
                                  gguf.GGMLQuantizationType(GGML_TYPE[t]))
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            f = w.fout[0]
            for p in part:
                i = done
                done += 1
                t = types[p.name]
                w.write_padding(f, f.tell())
                written = 0
                weights = imatrix_rows(imat, p, t)
                row = 0
                for x, dtype in reader.chunks(i):
                    for a, b, wq in imatrix_spans(weights, row, x.shape[0]):
                        q = kernels.quantize(x[a:b], t, bf16=dtype == "BF16", **({"imatrix": wq} if wq is not None else {}))
                        q.tofile(f)
                        written += q.nbytes
                    row += x.shape[0]
                    if bar:
                        bar.update(nbytes=x.size * p.src_bytes // max(1, p.n_rows * p.row_len), name=p.name)
                expect = p.n_rows * kernels.row_bytes(t, p.row_len)
                if written != expect:
                    raise ConvertError(f"internal: {p.name} wrote {written} bytes, expected {expect}")
                w.write_padding(f, written)
                n_params += p.n_rows * p.row_len
                n_bits += 8 * written
                if bar:
                    bar.update(tensors=1)
            f.flush()
            os.fsync(f.fileno())
            w.close()
        for path, o in zip(tmps, outs):
            os.replace(path, o)
    except OSError as e:
        for t_ in tmps:
            _remove(t_)
        reason = e.strerror or str(e)
        if e.errno == errno.ENOSPC or shutil.disk_usage(out.parent).free < (1 << 20):
            reason = "No space left on device"  # numpy's tofile reports a short write without errno
        raise ConvertError(f"writing {out} failed: {reason}") from None
    except BaseException:
        for t_ in tmps:
            _remove(t_)
        raise
    finally:
        if reader is not None:
            reader.close()  # before its files are closed
        if bar:
            bar.close()
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
        close_files()
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    bpw = n_bits / max(1, n_params)
    size = sum(o.stat().st_size for o in outs)
    where = str(outs[0]) + (f" (+ {len(outs) - 1} more parts)" if len(outs) > 1 else "")
    log(f"wrote {where}: {len(plans)} tensors ({', '.join(f'{n} {t}' for t, n in sorted(counts.items()))}), "
        f"{n_params / 1e9:.3f}B parameters, {bpw:.2f} bits per weight, {size / 1e9:.2f} GB")
    return {"tensors": len(plans), "types": types, "bits_per_weight": bpw, "params": n_params, "path": str(outs[0]),
            "parts": [str(o) for o in outs], "mtp_layers": n_mtp}


def imatrix_rows(imat: dict | None, p: TensorPlan, t: str):
    """The importances for tensor p in type t: (rows per expert, [n_expert, row_len] float32) or None (no
    matrix, no entry, or a type whose quantizer takes none)."""
    if imat is None or t not in IMATRIX_TYPES or p.name not in imat:
        return None
    v = imat[p.name]
    n_expert = p.shape[0] if len(p.shape) == 3 else 1
    if v.size != n_expert * p.row_len:
        raise ConvertError(f"the importance matrix has {v.size} values for {p.name}, which needs "
                           f"{n_expert} x {p.row_len}: it was made for another model")
    return p.n_rows // n_expert, v.reshape(n_expert, p.row_len)


def imatrix_spans(weights, row0: int, n: int):
    """Rows [0, n) of a chunk that starts at tensor row row0, cut where the expert changes: (a, b, the
    expert's importances or None)."""
    if weights is None:
        yield 0, n, None
        return
    per, table = weights
    a = 0
    while a < n:
        e = (row0 + a) // per
        b = min(n, (e + 1) * per - row0)
        yield a, b, np.ascontiguousarray(table[e])
        a = b


def split_plan(plans: list[TensorPlan], types: dict[str, str], max_bytes: int) -> list[list[TensorPlan]]:
    """The tensors of each part: a new part starts where the next tensor would take this one past
    max_bytes of tensor data (llama-gguf-split --split-max-size's rule); 0: one part."""
    from clover_cpu import kernels

    if max_bytes <= 0:
        return [plans]
    parts: list[list[TensorPlan]] = [[]]
    size = 0
    for p in plans:
        n = p.n_rows * kernels.row_bytes(types[p.name], p.row_len)
        if parts[-1] and size + n > max_bytes:
            parts.append([])
            size = 0
        parts[-1].append(p)
        size += n
    return parts


def split_names(out: Path, n: int) -> list[Path]:
    """llama.cpp's names for n parts of OUT.gguf: OUT-00001-of-0000n.gguf, ... (one part: OUT.gguf itself)."""
    if n == 1:
        return [out]
    stem = out.name[:-5] if out.name.endswith(".gguf") else out.name
    return [out.with_name(f"{stem}-{k + 1:05d}-of-{n:05d}.gguf") for k in range(n)]


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
