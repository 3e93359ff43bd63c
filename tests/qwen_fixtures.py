"""A tiny random Qwen3.5-MoE / Clover checkpoint that speaks with a real Qwen vocabulary and a real chat
template: the tokens and merges of llama.cpp's ggml-vocab-qwen35.gguf, Qwen3's added
tokens at their published ids (<|im_start|>, <think>, <tool_call>, ...), and one of llama.cpp's
models/templates/*.jinja, written as tokenizer.json / tokenizer_config.json beside random weights."""

from __future__ import annotations

import json
from pathlib import Path

import realfiles

QWEN35_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3's added tokens (tokenizer_config.json's added_tokens_decoder): id, text, special
QWEN3_ADDED = [
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
]
VOCAB_SIZE = 151936


def tokenizer_json() -> dict:
    from clover_cpu.gguf_file import GGUFFile

    with GGUFFile(realfiles.llama_cpp() / "models" / "ggml-vocab-qwen35.gguf") as g:
        tokens = list(g.kv["tokenizer.ggml.tokens"])
        merges = list(g.kv["tokenizer.ggml.merges"])
    first_added = QWEN3_ADDED[0][0]
    return {
        "version": "1.0",
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": sp,
            }
            for i, t, sp in QWEN3_ADDED
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN35_REGEX},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens[:first_added])},
            "merges": merges,
        },
    }


def template(name: str = "Qwen3.5-4B.jinja") -> str:
    return (realfiles.llama_cpp() / "models" / "templates" / name).read_text(encoding="utf-8")


def write_checkpoint(
    out: Path, *, chat_template: str, model_type: str = "qwen3_5_moe", seed: int = 3
) -> Path:
    """A tiny random checkpoint folder with the Qwen vocabulary and `chat_template`."""
    from clover_cpu.convert.synthetic import write_random_checkpoint

    overrides = {"vocab_size": VOCAB_SIZE, "eos_token_id": 151645, "bos_token_id": None}
    if model_type == "clover":
        overrides.update(block_length=8)
    write_random_checkpoint(
        out, model_type=model_type, seed=seed, tokenizer="none", overrides=overrides, std=0.1
    )
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "add_bos_token": False,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "bos_token": None,
                "chat_template": chat_template,
            }
        )
    )
    return out


def converted_model(
    tmp_path_factory, *, chat_template: str, model_type: str = "qwen3_5_moe", out_type: str = "q8_0"
) -> Path:
    from clover_cpu.convert.hf import convert

    d = tmp_path_factory.mktemp("qwenvocab")
    write_checkpoint(d / "hf", chat_template=chat_template, model_type=model_type)
    convert(d / "hf", d / "m.gguf", out_type=out_type, log=lambda s: None, progress=False)
    return d / "m.gguf"


def add_mtp_head(folder: Path, seed: int = 7) -> None:
    """Give a saved Qwen3.5-MoE checkpoint a one-layer multi-token-prediction head as Qwen3.5 checkpoints carry
    it: config mtp_num_hidden_layers = 1 and mtp.* tensors (fc, the two norms before it, a full-attention
    decoder layer with its MoE, a final norm), in a second safetensors file listed in the index."""
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file

    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    text = cfg.get("text_config", cfg)
    text["mtp_num_hidden_layers"] = 1
    cfg_path.write_text(json.dumps(cfg, indent=2))
    rng = np.random.default_rng(seed)
    H = text["hidden_size"]
    files = sorted(f for f in folder.glob("*.safetensors") if f.name != "model-mtp.safetensors")
    weights = {}
    for f in files:
        weights.update(load_file(f))
    # the decoder layer copies the shapes (not the values) of the checkpoint's first full-attention layer
    interval = text.get("full_attention_interval", 4)
    prefix = next(p for p in ("model.language_model.layers.", "model.layers.") if any(k.startswith(p) for k in weights))
    src = f"{prefix}{interval - 1}."
    dt = next(iter(weights.values())).dtype

    def rand(shape, std):
        return torch.from_numpy((rng.standard_normal(shape) * std).astype(np.float32)).to(dt)

    mtp = {}
    for k, v in weights.items():
        if k.startswith(src):
            mtp["mtp.layers.0." + k[len(src):]] = rand(tuple(v.shape), 0.1 if v.ndim == 1 else 0.05)
    mtp["mtp.fc.weight"] = rand((H, 2 * H), 0.05)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{n}.weight"] = rand((H,), 0.1)
    save_file(mtp, str(folder / "model-mtp.safetensors"))
    index = folder / "model.safetensors.index.json"
    wmap = json.loads(index.read_text())["weight_map"] if index.exists() else {k: files[0].name for k in weights}
    wmap.update({k: "model-mtp.safetensors" for k in mtp})
    index.write_text(json.dumps({"metadata": {}, "weight_map": wmap}, indent=1))


def llama_cpp_convert(src: Path, out: Path, *extra: str, outtype: str = "f32") -> Path:
    """llama.cpp b11434's own converter (convert_hf_to_gguf.py from the cached tree, with its gguf-py)."""
    import subprocess
    import sys

    root = realfiles.llama_cpp()
    r = subprocess.run([sys.executable, str(root / "convert_hf_to_gguf.py"), str(src), "--outfile", str(out),
                        "--outtype", outtype, *extra], capture_output=True, text=True, timeout=900,
                       env={**__import__("os").environ, "PYTHONPATH": str(root / "gguf-py")})
    if r.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{r.stderr[-3000:]}")
    return out
