"""The tokenizer embedded in a GGUF file: SentencePiece (exact, from the embedded model bytes) or
byte-level BPE (`tokenizer.ggml.model = gpt2`, GPT-2 byte mapping, rank-ordered merges)."""

from __future__ import annotations

import functools
import re
import numpy as np

from .gguf_file import GGUFError, StringArray

SPM_MODEL_KEY = "tokenizer.clover.spm_model"
CONTROL, USER_DEFINED = 3, 4
# Qwen's pre-tokenizer, with \p{L} / \p{N} approximated by Python's re classes
_PRETOKENIZE = re.compile(
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\w]?[^\W\d_]+|\d|[^\r\n\w]?_+[^\W\d_]*| ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


@functools.lru_cache(maxsize=1)
def _byte_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class Tokenizer:
    def __init__(self, tokens: list[str], types: list[int], model: str, merges=None, spm_bytes: bytes | None = None,
                 eos_id: int | None = None):
        self.tokens = tokens
        self.types = types
        self.model = model
        self.eos_id = eos_id
        self.sp = None
        if spm_bytes is not None:
            import sentencepiece as spm

            try:
                self.sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
            except Exception:
                raise GGUFError("the embedded SentencePiece model cannot be read") from None
            if self.sp.GetPieceSize() > len(tokens):
                raise GGUFError(f"the embedded SentencePiece model has {self.sp.GetPieceSize()} pieces, more than "
                                f"the {len(tokens)} tokens of tokenizer.ggml.tokens")
        elif model == "gpt2":
            self._merges = merges
            self.ranks = None  # the BPE tables are built on first use
        elif model != "llama":
            raise GGUFError(f"tokenizer model {model!r} is not supported (supported: llama with embedded "
                            "SentencePiece model, gpt2)")
        self.special_ids = {i for i, ty in enumerate(types) if ty == CONTROL}

    @classmethod
    def from_gguf(cls, kv: dict) -> "Tokenizer":
        tokens = kv.get("tokenizer.ggml.tokens")
        model = kv.get("tokenizer.ggml.model")
        if not isinstance(tokens, (list, StringArray)) or not isinstance(model, str):
            raise GGUFError("the file has no usable tokenizer (tokenizer.ggml.model / tokens)")
        types = kv.get("tokenizer.ggml.token_type")
        for key, arr in (("token_type", types), ("scores", kv.get("tokenizer.ggml.scores"))):
            if arr is not None and not isinstance(arr, np.ndarray):
                raise GGUFError(f"tokenizer.ggml.{key} is not an array of numbers")
            if arr is not None and len(arr) != len(tokens):
                raise GGUFError(f"tokenizer.ggml.{key} has {len(arr)} entries for {len(tokens)} tokens")
        types = [int(t) for t in types] if types is not None else [1] * len(tokens)
        merges = kv.get("tokenizer.ggml.merges")
        if merges is not None and not isinstance(merges, (list, StringArray)):
            raise GGUFError("tokenizer.ggml.merges is not an array of strings")
        spm_bytes = kv.get(SPM_MODEL_KEY)
        if spm_bytes is not None:
            spm_bytes = bytes(bytearray(int(b) for b in spm_bytes)) if not hasattr(spm_bytes, "tobytes") else spm_bytes.tobytes()
        elif model == "llama":
            raise GGUFError("this SentencePiece-tokenized file has no embedded tokenizer model "
                            f"({SPM_MODEL_KEY}); re-convert it with clover-cpu convert")
        eos = kv.get("tokenizer.ggml.eos_token_id")
        return cls(tokens, types, model, merges, spm_bytes, int(eos) if eos is not None else None)

    # -- BPE --

    def _tables(self) -> None:
        if self.ranks is not None:
            return
        self.ranks = {tuple(m.split(" ", 1)): i for i, m in enumerate(self._merges or []) if " " in m}
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.byte_enc = _byte_unicode()
        self.byte_dec = {v: k for k, v in self.byte_enc.items()}
        specials = [t for t, ty in zip(self.tokens, self.types) if ty in (CONTROL, USER_DEFINED) and t]
        self.special_re = (re.compile("(" + "|".join(map(re.escape, sorted(specials, key=len, reverse=True))) + ")")
                           if specials else None)

    def _bpe(self, word: str) -> list[int]:
        parts = list(word)
        while len(parts) > 1:
            best, best_rank = None, None
            for j in range(len(parts) - 1):
                r = self.ranks.get((parts[j], parts[j + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = j, r
            if best is None:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        out = []
        for p in parts:
            i = self.vocab.get(p)
            if i is None:
                out.extend(self.vocab[ch] for ch in p if ch in self.vocab)
            else:
                out.append(i)
        return out

    def encode(self, text: str) -> list[int]:
        if self.sp is not None:
            return list(self.sp.encode(text))
        self._tables()
        out: list[int] = []
        pieces = self.special_re.split(text) if self.special_re else [text]
        for k, piece in enumerate(pieces):
            if not piece:
                continue
            if self.special_re and k % 2 == 1:
                out.append(self.vocab[piece])
                continue
            for word in _PRETOKENIZE.findall(piece):
                out.extend(self._bpe("".join(self.byte_enc[b] for b in word.encode("utf-8"))))
        return out

    def decode(self, ids, skip_special: bool = True) -> str:
        ids = [int(i) for i in ids if not (skip_special and int(i) in self.special_ids)]
        bad = [i for i in ids if not 0 <= i < len(self.tokens)]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {len(self.tokens)}")
        if self.sp is not None:
            # ids past the SentencePiece model's pieces are the padding rows that round the vocabulary up to
            # the embedding's size: they have no text
            n = self.sp.GetPieceSize()
            return self.sp.decode([i for i in ids if i < n])
        self._tables()
        data = bytearray()
        for i in ids:
            t = self.tokens[i]
            if self.types[i] in (CONTROL, USER_DEFINED):
                data += t.encode("utf-8")
            else:
                data += bytes(self.byte_dec[ch] for ch in t if ch in self.byte_dec)
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, i: int) -> bytes:
        """The bytes of one token, for streaming output that must not split UTF-8 sequences."""
        return self.decode([i], skip_special=True).encode("utf-8")
