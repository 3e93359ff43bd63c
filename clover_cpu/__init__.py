"""clover-cpu: a CPU runtime for Clover block-diffusion mixture-of-experts models."""

from __future__ import annotations

import os
from pathlib import Path

from . import _core

__version__ = "0.1.0"


def system_info() -> dict:
    """Which kernel path (ISA) runs, on how many threads, and what the CPU reports."""
    return _core.system_info()


def set_num_threads(n: int) -> None:
    """Threads for every kernel; 0 means one per physical core (the default)."""
    _core.set_num_threads(int(n))


def load(path, *, threads: int | None = None, ctx_len: int | None = None, kv_type: str = "f16",
         prefetch: str = "auto", repack: str = "auto"):
    """Open a clover or qwen35moe GGUF file (validated, weights memory-mapped in place; see
    clover_cpu.model.load for the options)."""
    from .model import load as _load

    return _load(path, threads=threads, ctx_len=ctx_len, kv_type=kv_type, prefetch=prefetch, repack=repack)


def load_tokenizer(path):
    """The tokenizer of any GGUF file, from its vocabulary alone (vocabulary-only files too):
    `tok.encode(text)` -> ids, `tok.decode(ids)` -> text (see clover_cpu.tokenizer.Tokenizer)."""
    from .tokenizer import load_tokenizer as _load_tokenizer

    return _load_tokenizer(path)


def shipped_model() -> Path:
    """The path of the small Clover model that ships inside the package (what `clover-cpu run` uses
    without -m): `clover_cpu.load(clover_cpu.shipped_model())`."""
    files = sorted((Path(__file__).resolve().parent / "models").glob("*.gguf"))
    if not files:
        raise FileNotFoundError("this installation of clover-cpu ships no model (clover_cpu/models/ is empty)")
    return files[0]


def _init_threads() -> None:
    value = os.environ.get("CLOVER_THREADS")
    if value:
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"CLOVER_THREADS must be an integer, got {value!r}") from None
        set_num_threads(n)


_init_threads()
system_info()  # choose the ISA now: a bad CLOVER_ISA fails at import, not mid-run

__all__ = ["load", "load_tokenizer", "shipped_model", "system_info", "set_num_threads", "__version__"]
