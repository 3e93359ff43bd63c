"""The tokenizer against vocabularies, test cases and text nobody here wrote (tests/realfiles.py): llama.cpp
b11434's vocabulary-only GGUFs with its test-tokenizer-0 cases, 2.3 MB of real code and text in 20 languages
with the ids llama.cpp's llama-tokenize gives (tests/data/llama_tokenize_b11434.json, made by
bench/tokenizer_parity.py), and vocabularies broken on purpose."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import realfiles
from clover_cpu import load_tokenizer
from clover_cpu.gguf_file import GGUFError

# every byte-level BPE vocabulary in llama.cpp's models/ that has test cases (.inp / .out)
BPE_VOCABS = [
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gpt-2",
    "llama-bpe",
    "mpt",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
]
FIXTURE = Path(__file__).parent / "data" / "llama_tokenize_b11434.json"


@pytest.fixture(scope="module")
def models():
    return realfiles.llama_cpp() / "models"


@pytest.fixture(scope="module")
def qwen35(models):
    return load_tokenizer(models / "ggml-vocab-qwen35.gguf")


@pytest.mark.parametrize("name", BPE_VOCABS)
def test_llama_cpp_tokenizer_cases(models, name):
    """llama.cpp's own test-tokenizer-0 cases (parse_special off, no BOS), every one."""
    path = models / f"ggml-vocab-{name}.gguf"
    tok = load_tokenizer(path)
    cases = realfiles.vocab_cases(path)
    assert len(cases) >= 40
    bad = [(s, want, got) for s, want in cases if (got := tok.encode(s, special=False)) != want]
    assert not bad, f"{len(bad)} of {len(cases)} cases differ, first: {bad[0]!r}"
    for s, want in cases:  # and the ids decode back to the text
        assert tok.decode(want) == s, s


def test_other_vocabularies_refused_in_one_line(models):
    """Vocabularies clover-cpu cannot tokenize (WordPiece, T5, SentencePiece without the model bytes) are
    refused with a GGUFError naming the tokenizer, never a crash."""
    for path in sorted(models.glob("ggml-vocab-*.gguf")):
        try:
            tok = load_tokenizer(path)
        except GGUFError as e:
            msg = str(e)
            assert "\n" not in msg and ("tokenizer" in msg or "SentencePiece" in msg), msg
            continue
        assert tok.encode("Hello world") and tok.decode(tok.encode("Hello world")) == "Hello world", path.name


def test_real_text_matches_llama_tokenize(models):
    """2.3 MB of real code (llama.cpp's sources) and text in 20 languages (Sphinx's translations): the ids of
    every file equal llama-tokenize's (hashes recorded by bench/tokenizer_parity.py --write-fixture)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import tokenizer_parity

    fixture = json.loads(FIXTURE.read_text())
    files = tokenizer_parity.corpus()
    assert [n for _, n, _ in files] == fixture["files"]
    total = 0
    for vocab, expected in fixture["ids"].items():
        tok = load_tokenizer(models / f"ggml-vocab-{vocab}.gguf")
        for _, name, p in files:
            text = p.read_text(encoding="utf-8")
            ids = tok.encode(text, special=False)
            digest = hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()
            assert (len(ids), digest) == (expected[name]["tokens"], expected[name]["sha256"]), (
                f"{vocab}: {name} tokenizes differently from llama-tokenize ({len(ids)} ids, llama.cpp "
                f"{expected[name]['tokens']}); bench/tokenizer_parity.py shows where"
            )
            assert tok.decode(ids) == text
            total += p.stat().st_size
    assert total > 2 << 20


def test_special_tokens(qwen35):
    tok = qwen35
    im_end = tok.token_to_id("<|im_end|>")
    assert im_end == 151645
    text = "a<|im_end|>b"
    assert im_end in tok.encode(text)  # special=True: as llama-server and transformers treat a prompt
    plain = tok.encode(text, special=False)
    assert im_end not in plain and tok.decode(plain) == text
    assert tok.encode_plain(text) == plain
    assert tok.decode(tok.encode(text)) == "ab"  # control tokens are left out of decoded text by default
    assert tok.decode(tok.encode(text), skip_special=False) == text


def test_bytes_and_surrogates(qwen35):
    """Text Python made from undecodable bytes (lone surrogates) encodes as U+FFFD, not an exception; a
    character split between tokens decodes to U+FFFD, whole ones join again."""
    tok = qwen35
    assert tok.decode(tok.encode("abc\udcff\udcfe def")) == "abc\ufffd\ufffd def"
    ids = tok.encode("\u00e9\u4e2d\U0001f999")
    assert tok.decode(ids) == "\u00e9\u4e2d\U0001f999"
    assert b"".join(tok.token_bytes(i) for i in ids) == "\u00e9\u4e2d\U0001f999".encode()
    assert tok.encode("") == []


def test_model_tokenizer_is_the_same(tmp_path, models):
    """A model file and load_tokenizer give the same ids (the model uses load_tokenizer's class)."""
    import clover_cpu

    m = clover_cpu.load(clover_cpu.shipped_model())
    t = load_tokenizer(clover_cpu.shipped_model())
    s = "def f(x):\n    return x ** 2  # \u00e9\u4e2d"
    assert m.tokenize(s) == t.encode(s)
    assert m.detokenize(m.tokenize(s)) == t.decode(t.encode(s))


# -- vocabularies broken on purpose --


def _write_vocab(path, *, tokens, merges=None, types=None, pre="qwen2", model="gpt2", extra=None):
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_string("tokenizer.ggml.model", model)
    if pre is not None:
        w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", tokens)
    if types is not None:
        w.add_array("tokenizer.ggml.token_type", types)
    if merges is not None:
        w.add_array("tokenizer.ggml.merges", merges)
    for k, v in (extra or {}).items():
        w.add_key_value(k, *v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _byte_tokens():
    from clover_cpu.tokenizer import _byte_unicode

    return list(_byte_unicode().values())


@pytest.mark.parametrize(
    "case,msg",
    [
        ("no_merges", "merges is missing"),
        ("bad_merge", "not two tokens"),
        ("unknown_merge", "does not fit the vocabulary"),
        ("types_length", "token_type has"),
        ("types_strings", "not an array of numbers"),
        ("unknown_pre", "pre-tokenizer 'martian'"),
        ("unknown_model", "tokenizer model 'rwkv'"),
        ("empty", "tokenizer.ggml.tokens"),
        ("eos_outside", "not a token id"),
    ],
)
def test_broken_vocabularies(tmp_path, case, msg):
    import gguf

    toks = _byte_tokens() + ["ab", "<|im_end|>"]
    kw = dict(tokens=toks, merges=["a b"])
    if case == "no_merges":
        kw["merges"] = None
    elif case == "bad_merge":
        kw["merges"] = ["ab"]
    elif case == "unknown_merge":
        kw["merges"] = ["a zz"]
    elif case == "types_length":
        kw["types"] = [1, 1, 1]
    elif case == "types_strings":
        kw["types"] = ["x"] * len(toks)
    elif case == "unknown_pre":
        kw["pre"] = "martian"
    elif case == "unknown_model":
        kw["model"] = "rwkv"
    elif case == "empty":
        kw["tokens"] = []
    elif case == "eos_outside":
        kw["extra"] = {"tokenizer.ggml.eos_token_id": (10**6, gguf.GGUFValueType.UINT32)}
    path = _write_vocab(tmp_path / "v.gguf", **kw)
    with pytest.raises(GGUFError, match=msg):
        load_tokenizer(path)
    r = subprocess.run(
        [sys.executable, "-m", "clover_cpu", "run", "-m", str(path), "-p", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, (
        r.stderr
    )


def test_minimal_vocabulary_works(tmp_path):
    path = _write_vocab(
        tmp_path / "v.gguf",
        tokens=_byte_tokens() + ["ab", "<|im_end|>"],
        merges=["a b"],
        types=[1] * 257 + [3],
    )
    tok = load_tokenizer(path)
    assert tok.encode("ab") == [256]
    assert tok.encode("xab<|im_end|>") == [tok.tokens.index("x"), 256, 257]


def test_text_stream_equals_decode(qwen35):
    """Tokenizer.stream(): ids arriving a few at a time give, joined, exactly decode(all ids); a character cut
    between tokens never comes out half (no U+FFFD) before the end. Byte-level (Qwen3.5, on multibyte text
    whose characters span several tokens) and SentencePiece (the shipped model's vocabulary)."""
    import random

    import clover_cpu

    spm = load_tokenizer(clover_cpu.shipped_model())
    rng = random.Random(3)
    text = "déjà vu: 東京の天気は晴れ 🌤️, Ωmega <|im_end|> def f(x):\n    return x ** 2  # ok\n"
    for tok in (qwen35, spm):
        ids = tok.encode(text)
        ids = ids + list(reversed(ids))  # (reversed: byte pieces out of order, so some bytes stay invalid)
        want = tok.decode(ids)
        for _ in range(20):
            st, got, i = tok.stream(), [], 0
            while i < len(ids):
                j = i + rng.randint(1, 4)
                got.append(st.add(ids[i:j]))
                i = j
            assert "\ufffd" not in "".join(got) or "\ufffd" in want
            assert "".join(got) + st.finish() == want


def test_sentencepiece_control_tokens_in_text():
    """A SentencePiece vocabulary (the shipped model's): a control token's text in a prompt becomes that token
    with special=True and stays text otherwise (encode_plain too); a user-defined one (<|mask|>) is always
    matched, as in the byte-level path (SentencePiece itself matches its user-defined pieces, in
    encode_plain too)."""
    import clover_cpu

    tok = load_tokenizer(clover_cpu.shipped_model())
    bos, mask = tok.token_to_id("<s>"), tok.token_to_id("<|mask|>")
    plain = tok.encode_plain("a<s>b")
    assert tok.encode("a<s>b") == tok.encode("a") + [bos] + tok.encode("b")
    assert tok.encode("a<s>b", special=False) == plain and bos not in plain
    assert tok.encode("x<|mask|>", special=False) == tok.encode("x") + [mask]
    assert tok.decode(plain) == "a<s>b"  # (as text it round-trips)
