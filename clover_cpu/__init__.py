"""clover-cpu: a CPU runtime for Clover block-diffusion mixture-of-experts models."""

from __future__ import annotations

import os
from pathlib import Path

try:
    from . import _core
except ImportError as _missing:  # imported from a source checkout: the installed copy takes over
    from ._checkout import installed_copy

    _core = installed_copy(__name__, __file__, _missing)._core

__version__ = "0.1.0"


def system_info() -> dict:
    """Which kernel path (ISA) runs, on how many threads, and what the CPU reports. Raises ValueError
    when CLOVER_ISA or CLOVER_THREADS holds a value that cannot be used."""
    check_environment()
    return _core.system_info()


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_threads(value, what: str = "--threads") -> int:
    """A thread count given by a user (a flag or CLOVER_THREADS): an integer from 1 to the CPUs this
    process may use, else ValueError naming `what`. More threads than CPUs only wait on each other."""
    cpus = available_cpus()
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{what} must be a whole number of threads from 1 to {cpus}, got {value!r}") from None
    if not 1 <= n <= cpus:
        raise ValueError(f"{what} must be from 1 to {cpus} (the CPUs this process may use), got {n}; "
                         "leave it out for one thread per physical core")
    return n


_environment_checked = False


def check_environment() -> None:
    """Apply CLOVER_THREADS and choose the kernels (CLOVER_ISA, else the best this CPU has). A bad value
    raises ValueError naming the variable and what it accepts, here and on every later call (import
    itself never fails on them, so the command line can report them in one line)."""
    global _environment_checked
    if _environment_checked:
        return
    value = os.environ.get("CLOVER_THREADS", "").strip()
    if value:
        _core.set_num_threads(parse_threads(value, "CLOVER_THREADS"))
    try:
        _core.system_info()
    except ValueError as e:
        raise ValueError(f"CLOVER_ISA: {e}") from None
    _environment_checked = True


def set_num_threads(n: int) -> None:
    """Threads for every kernel; 0 means one per physical core (the default)."""
    _core.set_num_threads(int(n))


def load(path, *, threads: int | None = None, ctx_len: int | None = None, kv_type: str = "f16",
         prefetch: str = "auto", repack: str = "auto"):
    """Open a clover or qwen35moe GGUF file (validated, weights memory-mapped in place; see
    clover_cpu.model.load for the options)."""
    from .model import load as _load

    check_environment()
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


try:
    check_environment()  # choose the ISA now, not in the middle of the first forward
except ValueError:
    pass  # reported by system_info(), load() and the command line

__all__ = ["load", "load_tokenizer", "shipped_model", "system_info", "set_num_threads", "check_environment",
           "__version__"]
