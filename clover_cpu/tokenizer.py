"""The tokenizer of a GGUF file: byte-level BPE (`tokenizer.ggml.model = gpt2`) through Hugging Face
`tokenizers`, built in memory from the file's tokens and merges with the pre-tokenizer that llama.cpp's
llama-vocab.cpp chooses for `tokenizer.ggml.pre`; SentencePiece (`llama`) from the model bytes that
clover-cpu's converter embeds.

Special tokens (llama.cpp's rules): CONTROL tokens (`<|im_end|>`) are matched in the text only when
`encode(..., special=True)`; USER_DEFINED tokens (`<think>`) are always matched; `encode_plain` matches
none, for text that must never turn into a token the template writes (see chat.py).
"""

from __future__ import annotations

import codecs
import functools
import os
import threading

import numpy as np

from .gguf_file import GGUFError, GGUFFile, StringArray

SPM_MODEL_KEY = "tokenizer.clover.spm_model"
# llama.cpp's token types (llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer regexes, as llama-vocab.cpp (llama.cpp b11434) applies them for each `tokenizer.ggml.pre`:
# each regex splits the pieces the previous one left (matches and the text between them both kept).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# (written with escapes: some of these ranges end in characters that Unicode normalization would change)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)
_DEEPSEEK_LLM_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"


@functools.lru_cache(maxsize=1)
def _families() -> dict[str, tuple[tuple[str, ...], bool]]:
    """family -> (regexes, ignore_merges)."""
    return {
        "default": ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"), False),
        "gpt2": ((_GPT2,), False),
        "llama3": ((_LLAMA3,), True),
        "dbrx": ((_LLAMA3,), False),
        "qwen2": ((_QWEN2,), False),
        "qwen35": ((_QWEN35,), False),
        "deepseek-llm": (
            ("[\r\n]", _DEEPSEEK_LLM_LETTERS, _DEEPSEEK_LLM_PUNCT, "\\s+$", _CJK, r"\p{N}+"),
            False,
        ),
        "deepseek-coder": (("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"), False),
        "falcon": (
            (
                r"[\p{P}\$\+<=>\^~\|`]+",
                r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
                "[0-9][0-9][0-9]",
            ),
            False,
        ),
        "starcoder": ((r"\p{N}", _GPT2), False),
    }


# tokenizer.ggml.pre -> family, for the names llama-vocab.cpp maps to the families above
PRE_TYPES = {
    "default": "default",
    **dict.fromkeys(
        [
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "mpt",
            "olmo",
            "jais",
            "exaone4",
            "trillion",
            "granite-docling",
        ],
        "gpt2",
    ),
    **dict.fromkeys(
        [
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        "llama3",
    ),
    **dict.fromkeys(["dbrx", "smaug-bpe"], "dbrx"),
    **dict.fromkeys(
        ["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"],
        "qwen2",
    ),
    "qwen35": "qwen35",
    "deepseek-llm": "deepseek-llm",
    "deepseek-coder": "deepseek-coder",
    "falcon": "falcon",
    **dict.fromkeys(
        ["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"],
        "starcoder",
    ),
}


@functools.lru_cache(maxsize=1)
def _byte_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters (what byte-level BPE tokens are spelled in)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


@functools.lru_cache(maxsize=1)
def _unicode_byte() -> dict[str, int]:
    return {c: b for b, c in _byte_unicode().items()}


def _strings(kv: dict, key: str, required: bool = True) -> list[str] | None:
    v = kv.get(key)
    if v is None:
        if required:
            raise GGUFError(f"the file has no {key}")
        return None
    if not isinstance(v, (list, StringArray)):
        raise GGUFError(f"{key} is not an array of strings")
    return list(v)


class Tokenizer:
    """encode / decode for a GGUF vocabulary. Build it with `Tokenizer.from_gguf(kv)` or
    `clover_cpu.load_tokenizer(path)`."""

    def __init__(
        self,
        tokens: list[str],
        types: list[int],
        model: str,
        *,
        merges: list[str] | None = None,
        pre: str | None = None,
        spm_bytes: bytes | None = None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        unk_id: int | None = None,
        pad_id: int | None = None,
    ):
        self.tokens = tokens
        self.types = types
        self.model = model
        self.pre = pre
        self.bos_id, self.eos_id, self.unk_id, self.pad_id = bos_id, eos_id, unk_id, pad_id
        self.special_ids = {i for i, ty in enumerate(types) if ty == CONTROL}
        self.sp = None
        self._hf = None
        self._lock = threading.Lock()  # `encode_special_tokens` is a setting of the shared tokenizers object
        self._bytes: dict[int, bytes] = {}
        if model == "llama":
            if spm_bytes is None:
                raise GGUFError(
                    "this SentencePiece vocabulary has no embedded tokenizer model "
                    f"({SPM_MODEL_KEY}): clover-cpu reads SentencePiece vocabularies only from files that "
                    "clover-cpu convert wrote"
                )
            import sentencepiece as spm

            try:
                self.sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
            except Exception:
                raise GGUFError("the embedded SentencePiece model cannot be read") from None
            if self.sp.GetPieceSize() > len(tokens):
                raise GGUFError(
                    f"the embedded SentencePiece model has {self.sp.GetPieceSize()} pieces, more than "
                    f"the {len(tokens)} tokens of tokenizer.ggml.tokens"
                )
        elif model == "gpt2":
            self.merges = merges
            self._hf = self._build_bpe(merges)
        else:
            raise GGUFError(
                f"tokenizer model {model!r} is not supported (supported: gpt2, byte-level BPE; llama, "
                "SentencePiece, from files clover-cpu convert wrote)"
            )

    # -- construction --

    @classmethod
    def from_gguf(cls, kv: dict) -> "Tokenizer":
        model = kv.get("tokenizer.ggml.model")
        if not isinstance(model, str):
            raise GGUFError("the file has no usable tokenizer (tokenizer.ggml.model)")
        tokens = _strings(kv, "tokenizer.ggml.tokens")
        if not tokens:
            raise GGUFError("tokenizer.ggml.tokens is empty")
        types = kv.get("tokenizer.ggml.token_type")
        for key, arr in (("token_type", types), ("scores", kv.get("tokenizer.ggml.scores"))):
            if arr is not None and not (isinstance(arr, np.ndarray) and arr.dtype.kind in "iuf"):
                raise GGUFError(f"tokenizer.ggml.{key} is not an array of numbers")
            if arr is not None and len(arr) != len(tokens):
                raise GGUFError(f"tokenizer.ggml.{key} has {len(arr)} entries for {len(tokens)} tokens")
        types = [int(t) for t in types] if types is not None else [NORMAL] * len(tokens)
        merges = _strings(kv, "tokenizer.ggml.merges", required=False)
        pre = kv.get("tokenizer.ggml.pre")
        if pre is not None and not isinstance(pre, str):
            raise GGUFError("tokenizer.ggml.pre is not a string")
        spm_bytes = kv.get(SPM_MODEL_KEY)
        if spm_bytes is not None:
            if not isinstance(spm_bytes, np.ndarray) or spm_bytes.dtype.itemsize != 1:
                raise GGUFError(f"{SPM_MODEL_KEY} is not an array of bytes")
            spm_bytes = spm_bytes.tobytes()

        def token_id(key):
            v = kv.get(key)
            if v is None:
                return None
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= int(v) < len(tokens):
                raise GGUFError(f"{key} = {v!r} is not a token id of this vocabulary of {len(tokens)}")
            return int(v)

        return cls(
            tokens,
            types,
            model,
            merges=merges,
            pre=pre,
            spm_bytes=spm_bytes,
            bos_id=token_id("tokenizer.ggml.bos_token_id"),
            eos_id=token_id("tokenizer.ggml.eos_token_id"),
            unk_id=token_id("tokenizer.ggml.unknown_token_id"),
            pad_id=token_id("tokenizer.ggml.padding_token_id"),
        )

    def _build_bpe(self, merges):
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        if not merges:
            raise GGUFError(
                "tokenizer.ggml.merges is missing or empty: a byte-level BPE vocabulary needs its merges"
            )
        pre = self.pre if self.pre is not None else "default"
        family = PRE_TYPES.get(pre)
        if family is None:
            raise GGUFError(
                f"pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; supported: "
                f"{', '.join(sorted(PRE_TYPES))}"
            )
        regexes, ignore_merges = _families()[family]
        vocab: dict[str, int] = {}
        for i, t in enumerate(self.tokens):
            vocab[t] = i  # a repeated string keeps its last id, as llama.cpp's token_to_id does
        # Some real vocabularies (falcon, mpt, starcoder) have no token for bytes that never occur in valid
        # UTF-8 (0xC0, 0xC1, 0xF5-0xFF); both llama.cpp and tokenizers drop such a byte, and so do we.
        pairs = []
        for k, m in enumerate(merges):
            a, sep, b = m.partition(" ")
            if not sep or not a or not b:
                raise GGUFError(f"tokenizer.ggml.merges[{k}] = {m!r} is not two tokens separated by a space")
            pairs.append((a, b))
        try:
            bpe = models.BPE(vocab, pairs, fuse_unk=False, ignore_merges=ignore_merges)
        except Exception as e:  # the Rust side says which merge names a string outside the vocabulary
            raise GGUFError(
                f"tokenizer.ggml.merges does not fit the vocabulary: {str(e).splitlines()[0]}"
            ) from None
        hf = HFTokenizer(bpe)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        hf.decoder = decoders.ByteLevel()
        # CONTROL tokens as tokenizers' special tokens (skipped when encode_special_tokens is set), USER_DEFINED
        # as ordinary added tokens (always matched): llama.cpp's parse_special semantics
        added = [
            AddedToken(t, special=ty == CONTROL, normalized=False)
            for t, ty in zip(self.tokens, self.types)
            if ty in (CONTROL, USER_DEFINED) and t
        ]
        if added:
            hf.add_tokens(added)
        return hf

    # -- encode / decode --

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of `text` (no BOS added). special=True: control-token strings (`<|im_end|>`) in the text
        become those tokens, as llama-server and transformers do with a prompt; special=False: they stay text."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        text = _valid_text(text)
        if self.sp is not None:
            return self._sp_encode(text, special)
        with self._lock:
            self._hf.encode_special_tokens = not special
            try:
                return self._hf.encode(text, add_special_tokens=False).ids
            finally:
                self._hf.encode_special_tokens = False

    def _sp_encode(self, text: str, special: bool) -> list[int]:
        """SentencePiece never makes a control or user-defined piece from text: those strings are matched here
        first (control ones only with `special`, user-defined ones always, as the BPE path and llama.cpp
        do), the text between them goes to SentencePiece."""
        if not hasattr(self, "_sp_added"):
            import re

            def alternatives(strings):  # longest first, so that a token is never matched by its prefix
                strings = sorted(strings, key=len, reverse=True)
                return re.compile("|".join(map(re.escape, strings))) if strings else None

            added = {t: i for i, (t, ty) in enumerate(zip(self.tokens, self.types)) if ty in (CONTROL, USER_DEFINED) and t}
            self._sp_added = added
            self._sp_match = {True: alternatives(added),
                              False: alternatives([t for t, i in added.items() if self.types[i] == USER_DEFINED])}
        pattern = self._sp_match[special]
        if pattern is None:
            return list(self.sp.encode(text))
        ids: list[int] = []
        pos = 0
        for m in pattern.finditer(text):
            if m.start() > pos:
                ids += self.sp.encode(text[pos : m.start()])
            ids.append(self._sp_added[m.group()])
            pos = m.end()
        if pos < len(text):
            ids += self.sp.encode(text[pos:])
        return ids

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` with no added token matched at all, control or user-defined: for text from a
        user that the model must read as text (chat.py)."""
        text = _valid_text(text)
        if self.sp is not None:
            return list(self.sp.encode(text))
        ids = []
        model = self._hf.model
        for piece, _ in self._hf.pre_tokenizer.pre_tokenize_str(text):
            ids.extend(t.id for t in model.tokenize(piece))
        return ids

    def token_bytes(self, i: int) -> bytes:
        """The bytes of token `i` (control tokens: their text), for output that must not split UTF-8."""
        b = self._bytes.get(i)
        if b is None:
            if not 0 <= i < len(self.tokens):
                raise ValueError(f"token id {i} is outside the vocabulary of {len(self.tokens)}")
            if self.sp is not None:
                n = self.sp.GetPieceSize()
                b = self.sp.decode([i]).encode("utf-8") if i < n else b""
            elif self.types[i] in (CONTROL, USER_DEFINED, UNUSED) or not self.tokens[i]:
                b = self.tokens[i].encode("utf-8")
            else:
                dec = _unicode_byte()
                t = self.tokens[i]
                b = bytes(dec[c] for c in t) if all(c in dec for c in t) else t.encode("utf-8")
            self._bytes[i] = b
        return b

    def decode(self, ids, skip_special: bool = True) -> str:
        """The text of `ids`; control tokens are left out unless skip_special=False. Invalid UTF-8 (a
        character cut between tokens) becomes U+FFFD."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < len(self.tokens)]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {len(self.tokens)}")
        if skip_special:
            ids = [i for i in ids if i not in self.special_ids]
        if self.sp is not None:
            # ids past the SentencePiece model's pieces are the padding rows that round the vocabulary up to
            # the embedding's size: they have no text
            n = self.sp.GetPieceSize()
            return self.sp.decode([i for i in ids if i < n])
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def stream(self) -> TextStream:
        """A decoder for ids that arrive a few at a time (TextStream)."""
        return TextStream(self)

    def token_to_id(self, text: str) -> int | None:
        """The id of the token spelled `text` exactly (e.g. '<|im_end|>'), or None."""
        if self._hf is not None:
            return self._hf.token_to_id(text)
        i = self.sp.PieceToId(text)
        return i if self.sp.IdToPiece(i) == text else None

    def special_token_strings(self) -> dict[str, str]:
        """bos_token / eos_token / ... as a chat template reads them (the file's special token ids)."""
        out = {}
        for name, i in (
            ("bos_token", self.bos_id),
            ("eos_token", self.eos_id),
            ("unk_token", self.unk_id),
            ("pad_token", self.pad_id),
        ):
            if i is not None:
                out[name] = self.tokens[i]
        return out

    def control_tokens(self) -> list[str]:
        return [self.tokens[i] for i in sorted(self.special_ids) if self.tokens[i]]

    def added_tokens(self) -> list[str]:
        """Control and user-defined tokens: the strings that encode() can turn into a single token."""
        return [t for t, ty in zip(self.tokens, self.types) if ty in (CONTROL, USER_DEFINED) and t]


class TextStream:
    """The text of a growing id list, piece by piece, as it becomes final: a character whose UTF-8 bytes are
    cut between tokens waits for the token that completes it (control tokens are left out, as decode does).
    Byte-level vocabularies go through an incremental UTF-8 decoder; SentencePiece ones decode a short
    window (from the last piece given out) so that each call costs the new ids, not the whole text."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace") if tokenizer.sp is None else None
        self._ids: list[int] = []
        self._prefix = 0  # SentencePiece: the window starts here; its text up to _read was given out
        self._read = 0

    def add(self, ids) -> str:
        """The new text that `ids` (appended to the earlier ones) make final."""
        if self._utf8 is not None:
            special = self.tok.special_ids
            return self._utf8.decode(b"".join(self.tok.token_bytes(int(i)) for i in ids if int(i) not in special))
        self._ids.extend(int(i) for i in ids)
        done = self.tok.decode(self._ids[self._prefix : self._read])
        text = self.tok.decode(self._ids[self._prefix :])
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(done) :]

    def finish(self) -> str:
        """What is held back at the end (an incomplete character as U+FFFD)."""
        if self._utf8 is not None:
            return self._utf8.decode(b"", final=True)
        done = self.tok.decode(self._ids[self._prefix : self._read])
        text = self.tok.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(done) :]


def _valid_text(text: str) -> str:
    """`text` as valid Unicode. Python turns undecodable bytes in arguments, files and environment variables
    into lone surrogates (U+DC80..U+DCFF), which no encoder can write as UTF-8: they become the bytes they
    stand for, and every invalid byte then U+FFFD, as a UTF-8 decoder with errors="replace" does."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError:  # surrogates outside the escape range
            raw = text.encode("utf-8", errors="surrogatepass")
        return raw.decode("utf-8", errors="replace")


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """The tokenizer of any GGUF file, read from its vocabulary alone (tensors are not read; vocabulary-only
    files work too): `tok.encode(text)`, `tok.decode(ids)`, as transformers' AutoTokenizer gives."""
    with GGUFFile(path) as g:
        return Tokenizer.from_gguf(g.kv)
