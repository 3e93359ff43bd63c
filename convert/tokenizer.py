"""Tokenizers to llama.cpp's `tokenizer.ggml.*` keys: SentencePiece (`tokenizer.model`) or BPE (`tokenizer.json`)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConvertError

# llama.cpp token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPM_MODEL_KEY = "tokenizer.clover.spm_model"  # the original SentencePiece model, for exact tokenization


@dataclass
class Vocab:
    model: str  # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    merges: list[str] | None = None
    pre: str | None = None
    special: dict[str, int] = field(default_factory=dict)  # bos / eos / pad / unk / mask -> id
    add_bos: bool = False
    chat_template: str | None = None
    spm_bytes: bytes | None = None
    # SentencePiece: whether the model prepends "▁" to the text (its add_dummy_prefix), which llama.cpp
    # reads as tokenizer.ggml.add_space_prefix and otherwise takes to be true
    add_space_prefix: bool | None = None


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return out, i


def _fields(buf: bytes):
    """(field number, wire type, value) of a protobuf message; value is an int or bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 1:
            v, i = buf[i : i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            v, i = buf[i : i + n], i + n
        elif wire == 5:
            v, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if i > len(buf):
            raise ValueError("truncated field")
        yield num, wire, v


def _spm_pieces(model: bytes) -> list[tuple[str, float, int]]:
    """(piece, score, type) from a SentencePiece ModelProto (field 1: pieces; piece 1, score 2, type 3)."""
    pieces = []
    for num, wire, v in _fields(model):
        if num != 1 or wire != 2:
            continue
        piece, score, ptype = "", 0.0, 1
        for n2, w2, v2 in _fields(v):
            if n2 == 1 and w2 == 2:
                piece = v2.decode("utf-8")
            elif n2 == 2 and w2 == 5:
                score = struct.unpack("<f", v2)[0]
            elif n2 == 3 and w2 == 0:
                ptype = v2
        pieces.append((piece, score, ptype))
    return pieces


def _spm_add_dummy_prefix(model: bytes) -> bool:
    """NormalizerSpec.add_dummy_prefix of a SentencePiece ModelProto (field 3; its field 3, default true)."""
    for num, wire, v in _fields(model):
        if num == 3 and wire == 2:
            for n2, w2, v2 in _fields(v):
                if n2 == 3 and w2 == 0:
                    return bool(v2)
    return True


# SentencePiece piece types -> llama.cpp token types
_SPM_TYPES = {1: NORMAL, 2: UNKNOWN, 3: CONTROL, 4: USER_DEFINED, 5: UNUSED, 6: BYTE}


def _read_spm(path: Path) -> Vocab:
    data = path.read_bytes()
    try:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_proto=data)
        pieces = _spm_pieces(data)
        if len(pieces) != sp.get_piece_size():
            raise ValueError("piece count mismatch")
    except Exception as e:  # sentencepiece raises RuntimeError/OSError with C++ messages
        raise ConvertError(f"cannot read tokenizer {path.name}: {str(e).splitlines()[0] if str(e) else e}") from None
    special = {}
    for key, fn in (("bos", sp.bos_id), ("eos", sp.eos_id), ("pad", sp.pad_id), ("unk", sp.unk_id)):
        if fn() >= 0:
            special[key] = fn()
    return Vocab(
        model="llama",
        tokens=[p for p, _, _ in pieces],
        types=[_SPM_TYPES.get(t, NORMAL) for _, _, t in pieces],
        scores=[s for _, s, _ in pieces],
        special=special,
        spm_bytes=data,
        add_space_prefix=_spm_add_dummy_prefix(data),
    )


# the pre-tokenizer regexes of tokenizer.json files -> llama.cpp's tokenizer.ggml.pre names (the names its
# converter gives these tokenizers; clover_cpu.tokenizer.PRE_TYPES maps them back to the regexes it runs)
KNOWN_PRE = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+": "qwen35",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "llama-bpe",
}


def _pre_name(pre) -> str:
    """tokenizer.ggml.pre for a tokenizer.json pre_tokenizer: a Split on a known regex followed by a
    ByteLevel without its own regex, or a plain ByteLevel (GPT-2's regex)."""
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    steps = [p for p in steps if isinstance(p, dict)]
    kinds = [p.get("type") for p in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        pattern = steps[0].get("pattern") or {}
        regex = pattern.get("Regex") if isinstance(pattern, dict) else None
        if regex in KNOWN_PRE and str(steps[0].get("behavior", "")).lower() == "isolated":
            return KNOWN_PRE[regex]
        raise ConvertError(f"tokenizer.json splits with a regex clover-cpu does not know ({str(regex)[:80]!r}); "
                           f"known: the {', '.join(sorted(set(KNOWN_PRE.values())))} and GPT-2 pre-tokenizers")
    raise ConvertError(f"tokenizer.json has a pre-tokenizer clover-cpu does not know ({' + '.join(map(str, kinds))}); "
                       "known: ByteLevel, or Split on the qwen2 / qwen35 / llama3 regex then ByteLevel")


def _read_bpe(path: Path) -> Vocab:
    try:
        tj = json.loads(path.read_text())
        model = tj["model"]
        if model.get("type") != "BPE":
            raise ValueError(f"model type {model.get('type')!r} is not BPE")
        vocab: dict[str, int] = model["vocab"]
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
        added = tj.get("added_tokens") or []
        pre = _pre_name(tj.get("pre_tokenizer"))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError) as e:
        raise ConvertError(f"cannot read tokenizer {path.name}: {e}") from None
    n = max([*vocab.values(), *(a["id"] for a in added)], default=-1) + 1
    tokens: list[str | None] = [None] * n
    types = [NORMAL] * n
    for tok, i in vocab.items():
        tokens[i] = tok
    for a in added:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = CONTROL if a.get("special") else USER_DEFINED
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i] = f"[PAD{i}]"
            types[i] = UNUSED
    return Vocab(model="gpt2", tokens=tokens, types=types, merges=merges or None, pre=pre)


def read_tokenizer(src: Path, vocab_size: int) -> Vocab:
    """The checkpoint's tokenizer, padded with unused [PAD{i}] tokens up to vocab_size."""
    if (src / "tokenizer.model").exists():
        v = _read_spm(src / "tokenizer.model")
    elif (src / "tokenizer.json").exists():
        v = _read_bpe(src / "tokenizer.json")
    else:
        raise ConvertError(f"no tokenizer in {src} (expected tokenizer.model or tokenizer.json)")
    if len(v.tokens) > vocab_size:
        raise ConvertError(f"the tokenizer has {len(v.tokens)} tokens but the model's vocab_size is {vocab_size}")
    if v.model == "gpt2" and not v.merges:
        raise ConvertError("tokenizer.json has no merges (llama.cpp needs at least one)")
    seen = set(v.tokens)
    for i in range(len(v.tokens), vocab_size):
        name = f"[PAD{i}]"
        if name in seen:
            raise ConvertError(f"the tokenizer already has a token named {name}")
        v.tokens.append(name)
        v.types.append(UNUSED)
        if v.scores is not None:
            v.scores.append(-1e9)
    if len(seen) != len(set(v.tokens[: len(seen)])) or len(set(v.tokens)) != len(v.tokens):
        raise ConvertError("the tokenizer has duplicate token strings (llama.cpp needs them unique)")
    tc = src / "tokenizer_config.json"
    if tc.exists():
        try:
            conf = json.loads(tc.read_text())
            if isinstance(conf.get("chat_template"), str):
                v.chat_template = conf["chat_template"]
            v.add_bos = bool(conf.get("add_bos_token", False))
        except ValueError as e:
            raise ConvertError(f"malformed tokenizer_config.json: {e}") from None
    if (src / "chat_template.jinja").exists():
        v.chat_template = (src / "chat_template.jinja").read_text()
    return v
