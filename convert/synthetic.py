"""Random-weight checkpoints in the Hugging Face layout, for tests and benchmarks.

Writes config.json, bf16 (or f16/f32) safetensors (one file or shards with an index) and a small
tokenizer trained on local text (the Python standard library's sources): SentencePiece
(`tokenizer.model`) or byte-level BPE (`tokenizer.json`). Tensors are streamed in chunks, so the
Clover-35B shape (about 70 GB of bf16) can be written with little memory.

    python -m clover_cpu.convert.synthetic OUT_DIR --preset tiny --model-type clover
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

# absolute, so that `python convert/synthetic.py` works as well as `python -m clover_cpu.convert.synthetic`
from clover_cpu.convert.safetensors_lazy import DTYPES, write_safetensors

BASE = dict(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    partial_rotary_factor=0.25, rope_theta=10000000.0, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4, num_experts=8,
    num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64, vocab_size=512,
    rms_norm_eps=1e-6, max_position_embeddings=4096, full_attention_interval=4, tie_word_embeddings=False,
)
PRESETS = {
    # every dimension different from the Clover shape; 2 GDN + ... layers
    "tiny": dict(BASE),
    "small": dict(BASE, hidden_size=256, num_hidden_layers=8, num_attention_heads=4, head_dim=64,
                  linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
                  num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256,
                  shared_expert_intermediate_size=256, vocab_size=2048),
    # the Clover-35B shape with 32 experts (2.9B active per token): the benchmark model
    "bench": dict(BASE, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
                  head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                  linear_value_head_dim=128, num_experts=32, num_experts_per_tok=8, moe_intermediate_size=512,
                  shared_expert_intermediate_size=512, vocab_size=248320, max_position_embeddings=131072),
}
PRESETS["clover-35b"] = dict(PRESETS["bench"], num_experts=256)
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|mask|>"]  # ids 0..4 in the SentencePiece tokenizers we train


def stdlib_text(max_bytes: int = 4 << 20) -> str:
    """Deterministic text from this interpreter's standard library sources (sorted file list)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, n = [], 0
    for path in sorted(root.glob("*.py")):
        try:
            t = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append(t)
        n += len(t)
        if n >= max_bytes:
            break
    return "".join(out)


@functools.lru_cache(maxsize=8)
def train_spm(vocab_size: int) -> bytes:
    """A byte-fallback BPE SentencePiece model of vocab_size pieces; ids 0..4 are SPECIALS."""
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as d:
        corpus = Path(d) / "corpus.txt"
        corpus.write_text(stdlib_text(1 << 20))
        prefix = str(Path(d) / "sp")
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
            byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=3,
            user_defined_symbols=["<|mask|>"], normalization_rule_name="identity",
            remove_extra_whitespaces=False, split_digits=True, max_sentence_length=1 << 16,
            num_threads=1, minloglevel=2, allow_whitespace_only_pieces=True,
        )
        return Path(prefix + ".model").read_bytes()


def _byte_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bpe_tokenizer_json(vocab_size: int) -> dict:
    """A byte-level BPE tokenizer.json: 256 byte tokens, merges learned greedily on stdlib text, specials."""
    bu = _byte_unicode()
    words = {}
    for w in stdlib_text(1 << 18).split(" "):
        key = tuple(bu[b] for b in (" " + w).encode())
        words[key] = words.get(key, 0) + 1
    vocab = {bu[b]: i for i, b in enumerate(range(256))}
    merges = []
    n_merges = max(1, vocab_size - 256 - len(SPECIALS))
    for _ in range(n_merges):
        pairs: dict[tuple[str, str], int] = {}
        for w, cnt in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + cnt
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(f"{a} {b}")
        vocab[a + b] = len(vocab)
        new_words = {}
        for w, cnt in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + cnt
        words = new_words
    added = [{"id": len(vocab) + i, "content": s, "special": True} for i, s in enumerate(SPECIALS)]
    return {"version": "1.0", "added_tokens": added, "pre_tokenizer": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": merges}}


def make_config(preset: str, model_type: str, overrides: dict | None = None) -> dict:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
    text = dict(PRESETS[preset], **(overrides or {}))
    if model_type == "clover":
        return dict(text, model_type="clover", architectures=["CloverForDiffusionLM"], mask_token_id=4,
                    bos_token_id=text.get("bos_token_id", 1), eos_token_id=text.get("eos_token_id", 2), pad_token_id=3, block_length=text.get("block_length", 32),
                    shift_logits=text.get("shift_logits", False), threshold=text.get("threshold", 0.95))
    if model_type == "qwen3_5_moe":
        return {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                "text_config": dict(text, model_type="qwen3_5_moe_text", bos_token_id=text.get("bos_token_id", 1),
                                    eos_token_id=text.get("eos_token_id", 2))}
    if model_type == "qwen3_5_moe_text":
        return dict(text, model_type="qwen3_5_moe_text", architectures=["Qwen3_5MoeForCausalLM"],
                    bos_token_id=text.get("bos_token_id", 1), eos_token_id=text.get("eos_token_id", 2))
    raise ValueError(f"unknown model type {model_type!r}")


def tensor_specs(cfg: dict, fused_experts: bool = True) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init) of every checkpoint tensor; init: normal, zeros, ones, a_log, dt."""
    c = cfg.get("text_config", cfg)
    nested = "text_config" in cfg
    p = "model.language_model." if nested else "model."
    H, V, E, I, Is = c["hidden_size"], c["vocab_size"], c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    hk, hv, dk, dv = c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    nh, nkv, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    conv_dim = 2 * hk * dk + hv * dv
    interval = c.get("full_attention_interval", 4)
    specs = [(f"{p}embed_tokens.weight", (V, H), "normal")]
    for i in range(c["num_hidden_layers"]):
        L = f"{p}layers.{i}."
        specs += [(L + "input_layernorm.weight", (H,), "small"), (L + "post_attention_layernorm.weight", (H,), "small")]
        if (i + 1) % interval:
            a = L + "linear_attn."
            specs += [
                (a + "in_proj_qkv.weight", (conv_dim, H), "normal"), (a + "in_proj_z.weight", (hv * dv, H), "normal"),
                (a + "in_proj_b.weight", (hv, H), "normal"), (a + "in_proj_a.weight", (hv, H), "normal"),
                (a + "conv1d.weight", (conv_dim, 1, c["linear_conv_kernel_dim"]), "conv"),
                (a + "dt_bias", (hv,), "ones"), (a + "A_log", (hv,), "a_log"), (a + "norm.weight", (dv,), "ones"),
                (a + "out_proj.weight", (H, hv * dv), "normal"),
            ]
        else:
            a = L + "self_attn."
            specs += [
                (a + "q_proj.weight", (2 * nh * D, H), "normal"), (a + "k_proj.weight", (nkv * D, H), "normal"),
                (a + "v_proj.weight", (nkv * D, H), "normal"), (a + "o_proj.weight", (H, nh * D), "normal"),
                (a + "q_norm.weight", (D,), "small"), (a + "k_norm.weight", (D,), "small"),
            ]
        m = L + "mlp."
        specs.append((m + "gate.weight", (E, H), "normal"))
        if fused_experts:
            specs += [(m + "experts.gate_up_proj", (E, 2 * I, H), "normal"), (m + "experts.down_proj", (E, H, I), "normal")]
        else:
            for e in range(E):
                specs += [(f"{m}experts.{e}.gate_proj.weight", (I, H), "normal"),
                          (f"{m}experts.{e}.up_proj.weight", (I, H), "normal"),
                          (f"{m}experts.{e}.down_proj.weight", (H, I), "normal")]
        specs += [
            (m + "shared_expert.gate_proj.weight", (Is, H), "normal"), (m + "shared_expert.up_proj.weight", (Is, H), "normal"),
            (m + "shared_expert.down_proj.weight", (H, Is), "normal"), (m + "shared_expert_gate.weight", (1, H), "normal"),
        ]
    specs.append((f"{p}norm.weight", (H,), "small"))
    if not c.get("tie_word_embeddings", False):
        specs.append(("lm_head.weight", (V, H), "normal"))
    return specs


class _Pool:
    """Random values for big tensors: slices of one fixed pool of normals at random offsets (fast)."""

    def __init__(self, rng: np.random.Generator, n: int = 1 << 22):
        self.rng = rng
        self.pool = rng.standard_normal(2 * n).astype(np.float32)
        self.n = n

    def take(self, count: int) -> np.ndarray:
        out = np.empty(count, np.float32)
        i = 0
        while i < count:
            k = min(self.n, count - i)
            o = int(self.rng.integers(0, self.n))
            out[i : i + k] = self.pool[o : o + k]
            i += k
        return out


def _values(init: str, shape, rng, pool: _Pool, scale: float, start: int, count: int) -> np.ndarray:
    if init == "normal":
        v = pool.take(count) if count > 65536 else rng.standard_normal(count).astype(np.float32)
        return v * np.float32(scale)
    if init == "small":
        return (rng.standard_normal(count) * 0.1).astype(np.float32)
    if init == "ones":
        return np.ones(count, np.float32)
    if init == "a_log":
        return np.log(rng.uniform(1, 16, count)).astype(np.float32)
    if init == "conv":
        return (rng.standard_normal(count) * 0.3).astype(np.float32)
    raise ValueError(init)


def _encode(x: np.ndarray, dtype: str) -> bytes:
    from clover_cpu.convert.safetensors_lazy import to_bf16_bytes

    if dtype == "BF16":
        return to_bf16_bytes(x)
    if dtype == "F16":
        return x.astype("<f2").tobytes()
    return x.astype("<f4").tobytes()


def write_random_checkpoint(out_dir: str | Path, *, preset: str = "tiny", model_type: str = "clover", seed: int = 0,
                            dtype: str = "bf16", fused_experts: bool = True, shards: int = 1, tokenizer: str = "spm",
                            overrides: dict | None = None, std: float = 0.02) -> Path:
    """Write a random checkpoint folder and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype.upper()
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of bf16, f16, f32, got {dtype.lower()}")
    cfg = make_config(preset, model_type, overrides)
    c = cfg.get("text_config", cfg)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    n_tok = min(c["vocab_size"], 1024)
    if tokenizer == "spm":
        (out / "tokenizer.model").write_bytes(train_spm(n_tok))
    elif tokenizer == "bpe":
        (out / "tokenizer.json").write_text(json.dumps(bpe_tokenizer_json(n_tok)))
    elif tokenizer != "none":  # none: the caller writes a tokenizer of its own
        raise ValueError("tokenizer must be spm, bpe or none")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": False,
        "chat_template": "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                         "{% if add_generation_prompt %}<s>assistant\n{% endif %}",
    }))
    rng = np.random.default_rng(seed)
    pool = _Pool(rng)
    specs = tensor_specs(cfg, fused_experts)
    chunk = 1 << 22

    def producer(init, shape):
        def gen():
            n = int(np.prod(shape))
            for s in range(0, n, chunk):
                yield _encode(_values(init, shape, rng, pool, std, s, min(chunk, n - s)), dtype)
        return gen

    groups = np.array_split(np.arange(len(specs)), shards)
    names = [f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)] if shards > 1 else ["model.safetensors"]
    weight_map = {}
    for fname, idx in zip(names, groups):
        tensors = {specs[i][0]: (dtype, specs[i][1], producer(specs[i][2], specs[i][1])) for i in idx}
        write_safetensors(out / fname, tensors)
        weight_map.update({k: fname for k in tensors})
    if shards > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clover_cpu.convert.synthetic", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output folder")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--model-type", default="clover", choices=["clover", "qwen3_5_moe", "qwen3_5_moe_text"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--per-expert", action="store_true", help="one tensor per expert instead of fused gate_up/down")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--tokenizer", default="spm", choices=["spm", "bpe"])
    a = ap.parse_args(argv)
    path = write_random_checkpoint(a.out, preset=a.preset, model_type=a.model_type, seed=a.seed, dtype=a.dtype,
                                   fused_experts=not a.per_expert, shards=a.shards, tokenizer=a.tokenizer)
    size = sum(f.stat().st_size for f in path.iterdir())
    print(f"wrote {path} ({size / 1e9:.2f} GB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
