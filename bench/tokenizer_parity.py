"""Tokenizer parity and speed against llama.cpp, on real text nobody here wrote.

For each vocabulary (llama.cpp's own ggml-vocab-qwen2 / -qwen35 by default), every file of the corpus (real
code: llama.cpp b11434's sources, >= 1 MB; real multilingual text: Sphinx 8.2.3's translations into 20
languages, >= 1 MB) is tokenized by clover-cpu and by llama.cpp's `llama-tokenize` (the reference), and the ids
are compared. Then it times clover-cpu's encode against the Hugging Face pipeline a Qwen tokenizer.json
describes (NFC normalizer, the original regex, byte-level BPE: what AutoTokenizer runs), one thread each, on
the code and the text; long pathological lines (64 KB of one punctuation character; 64 KB of Chinese without
punctuation) at 4 lengths, to show linear time; and the vocabulary's load time.

    python bench/tokenizer_parity.py --llama-bin DIR [--json out.json] [--write-fixture]

DIR holds llama-tokenize (bench/setup_peers.sh builds it: .venv-peers/llama.cpp-b11434/build/bin).
--write-fixture stores each file's token count and id hash in tests/data/llama_tokenize_b11434.json, which
tests/test_tokenizer_real.py checks without llama.cpp.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers' thread pool: one thread, as clover-cpu's encode
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
import realfiles  # noqa: E402

VOCABS = ("qwen2", "qwen35")
FIXTURE = REPO / "tests" / "data" / "llama_tokenize_b11434.json"
CODE_GLOBS = ("src/*.cpp", "common/*.cpp", "gguf-py/gguf/*.py", "convert_hf_to_gguf.py")
LANGS = (
    "zh_CN",
    "ja",
    "ko",
    "ru",
    "ar",
    "hi",
    "fa",
    "el",
    "he",
    "ka",
    "uk",
    "tr",
    "vi",
    "de",
    "fr",
    "es",
    "pt_BR",
    "pl",
    "cs",
    "bn",
)
TARGET = 1 << 20


def corpus() -> list[tuple[str, str, Path]]:
    """(kind, name, path): code files in sorted order until >= 1 MB, then translations until >= 1 MB."""
    out, size = [], 0
    root = realfiles.llama_cpp()
    for pattern in CODE_GLOBS:
        for p in sorted(root.glob(pattern)):
            if size >= TARGET:
                break
            out.append(("code", f"llama.cpp/{p.relative_to(root)}", p))
            size += p.stat().st_size
    size = 0
    loc = realfiles.sphinx_locales()
    for lang in LANGS:
        p = loc / lang / "LC_MESSAGES" / "sphinx.po"
        if size >= TARGET or not p.exists():
            continue
        out.append(("text", f"sphinx/{lang}.po", p))
        size += p.stat().st_size
    return out


def ids_hash(ids) -> str:
    import numpy as np

    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


def llama_tokenize(binary: Path, vocab: Path, path: Path, special: bool) -> list[int]:
    r = subprocess.run(
        [str(binary), "-m", str(vocab), "--ids", "--no-bos", "--log-disable", "--no-escape", "-f", str(path)]
        + ([] if special else ["--no-parse-special"]),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode:
        raise RuntimeError(f"llama-tokenize failed on {path}: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def hf_reference(tok):
    """The pipeline of a Qwen tokenizer.json (NFC, the original `(?i:...)` regex, byte-level BPE), built
    from the same tokens and merges."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    original = {
        "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
        "qwen35": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"
        r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    }[tok.pre]
    vocab = {t: i for i, t in enumerate(tok.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in tok.merges]
    hf = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(original), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    hf.add_tokens([AddedToken(t, special=True, normalized=False) for t in tok.control_tokens()])
    return hf


def timed(fn, reps=3) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--llama-bin",
        type=Path,
        default=REPO / ".venv-peers" / "llama.cpp-b11434" / "build" / "bin",
        help="folder with llama-tokenize (default: the one bench/setup_peers.sh builds)",
    )
    ap.add_argument(
        "--vocab", action="append", choices=VOCABS, help="vocabularies (default: qwen2 and qwen35)"
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--write-fixture", action="store_true", help=f"store the reference ids' hashes in {FIXTURE}"
    )
    a = ap.parse_args(argv)
    from clover_cpu.tokenizer import load_tokenizer

    binary = a.llama_bin / "llama-tokenize"
    if not binary.exists():
        print(f"error: {binary} not found (run bench/setup_peers.sh, or pass --llama-bin)", file=sys.stderr)
        return 2
    files = corpus()
    texts = {name: p.read_text(encoding="utf-8") for _, name, p in files}
    models = realfiles.llama_cpp() / "models"
    results = {
        "machine": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
        "vocabs": {},
    }
    fixture = {}
    for v in a.vocab or VOCABS:
        path = models / f"ggml-vocab-{v}.gguf"
        t0 = time.perf_counter()
        tok = load_tokenizer(path)
        load_s = time.perf_counter() - t0
        tok.encode("warm up")
        rows, same_files, same_special = [], 0, 0
        fixture[v] = {}
        for kind, name, p in files:
            ref = llama_tokenize(binary, path, p, special=False)
            ours = tok.encode(texts[name], special=False)
            same = ours == ref
            same_files += same
            # with control tokens parsed: llama.cpp also promotes some ordinary tokens that look like control
            # tokens ("</s>", "<|endoftext|>", ...; llama-vocab.cpp) to control tokens; clover-cpu does not
            ref_sp = llama_tokenize(binary, path, p, special=True)
            ours_sp = tok.encode(texts[name], special=True)
            same_special += ours_sp == ref_sp
            rows.append(
                {
                    "file": name,
                    "kind": kind,
                    "bytes": p.stat().st_size,
                    "tokens": len(ref),
                    "equal": same,
                    "equal_parse_special": ours_sp == ref_sp,
                }
            )
            fixture[v][name] = {"tokens": len(ref), "sha256": ids_hash(ref)}
            for label, x, y in (("", ours, ref), (" (control tokens parsed)", ours_sp, ref_sp)):
                if x != y:
                    k = next(i for i, (a_, b_) in enumerate(zip(x + [None], y + [None])) if a_ != b_)
                    print(
                        f"  {v} {name}{label}: differs at token {k}: clover-cpu {[tok.tokens[i] for i in x[k : k + 4]]} "
                        f"llama.cpp {[tok.tokens[i] for i in y[k : k + 4]]}"
                    )
        code = "".join(texts[n] for k, n, _ in files if k == "code")
        text = "".join(texts[n] for k, n, _ in files if k == "text")
        hf = hf_reference(tok)
        speed = {}
        for label, s in (("code", code), ("text", text)):
            t_ours = timed(lambda: tok.encode(s))
            t_ref = timed(lambda: hf.encode(s, add_special_tokens=False))
            speed[label] = {
                "bytes": len(s.encode()),
                "clover_s": t_ours,
                "reference_s": t_ref,
                "clover_MB_s": len(s.encode()) / t_ours / 1e6,
                "reference_MB_s": len(s.encode()) / t_ref / 1e6,
            }
        cjk = "".join(c for c in text if "\u4e00" <= c <= "\u9fff")
        long = {}
        for label, unit in (("punct", "!"), ("chinese", cjk)):
            for kb in (8, 16, 32, 64):
                n = kb * 1024 // len(unit[0].encode())
                s = (unit * (n // len(unit) + 1))[:n]
                long[f"{label}_{kb}k"] = timed(lambda: tok.encode(s), reps=2)
        results["vocabs"][v] = {
            "load_seconds": load_s,
            "vocab": tok.vocab_size,
            "files": rows,
            "files_equal": same_files,
            "files_equal_parse_special": same_special,
            "files_total": len(files),
            "speed": speed,
            "long": long,
        }
        print(f"\n{v}: vocabulary of {tok.vocab_size} tokens loads in {load_s:.2f} s")
        print(
            f"  parity with llama-tokenize: {same_files}/{len(files)} files identical "
            f"({sum(r['bytes'] for r in rows) / 1e6:.2f} MB, {sum(r['tokens'] for r in rows)} tokens); "
            f"with control tokens parsed {same_special}/{len(files)}"
        )
        for label, sp in speed.items():
            print(
                f"  {label:5s} {sp['bytes'] / 1e6:.2f} MB: clover-cpu {sp['clover_MB_s']:.2f} MB/s, "
                f"HF tokenizer.json pipeline {sp['reference_MB_s']:.2f} MB/s ({sp['reference_s'] / sp['clover_s']:.2f}x)"
            )
        print("  long lines: " + ", ".join(f"{k} {t * 1e3:.1f} ms" for k, t in long.items()))
    if a.write_fixture:
        FIXTURE.parent.mkdir(exist_ok=True)
        FIXTURE.write_text(
            json.dumps({"llama.cpp": "b11434", "files": [n for _, n, _ in files], "ids": fixture}, indent=1)
            + "\n"
        )
        print(f"wrote {FIXTURE}")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["files_equal"] == r["files_total"] for r in results["vocabs"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
