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
