"""llama.cpp's importance matrices (what `llama-imatrix` writes), read as llama-quantize reads them
(tools/quantize/quantize.cpp load_imatrix): per weight tensor, the mean squared activation of each input
column, one row of them per expert for stacked experts.

- GGUF: tensors NAME.in_sum2 (F32, n_expert x n_cols) and NAME.counts (F32, n_expert); the importance is
  in_sum2 / count per expert (1 where the count is 0).
- legacy .dat: int32 n_entries, then per entry int32 name length, name, int32 ncall, int32 nval, nval float32
  sums (already divided by the count, times ncall); the importance is sums / ncall.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from .errors import ConvertError


def load_imatrix(path: str | Path) -> dict[str, np.ndarray]:
    """tensor name -> float32 importances (n_expert x n_cols, flattened; n_cols for a matrix)."""
    path = Path(path)
    try:
        head = path.read_bytes()[:4]
    except OSError as e:
        raise ConvertError(f"cannot read the importance matrix {path}: {e.strerror or e}") from None
    out = _load_gguf(path) if head == b"GGUF" else _load_legacy(path)
    if not out:
        raise ConvertError(f"{path.name} holds no importance matrix entries")
    for name, v in out.items():
        if not np.isfinite(v).all() or (v < 0).any():
            raise ConvertError(f"{path.name}: the importances of {name} are not all finite and >= 0")
    return out


def _load_gguf(path: Path) -> dict[str, np.ndarray]:
    from clover_cpu.gguf_file import GGUFError, GGUFFile

    try:
        g = GGUFFile(path)
    except GGUFError as e:
        raise ConvertError(f"{path.name} is not a readable imatrix GGUF: {e}") from None
    with g:
        sums, counts = {}, {}
        for name, ti in g.tensors.items():
            for suffix, table in ((".in_sum2", sums), (".counts", counts)):
                if name.endswith(suffix):
                    if ti.type_name != "f32":
                        raise ConvertError(f"{path.name}: {name} is {ti.ggml_type}, not F32")
                    table[name[: -len(suffix)]] = np.frombuffer(g.data(name).tobytes(), dtype=np.float32).copy()
        out = {}
        for name, s in sums.items():
            c = counts.get(name)
            if c is None or c.size == 0 or s.size % c.size:
                raise ConvertError(f"{path.name}: {name} has sums and counts that do not match")
            ne0 = s.size // c.size
            v = np.ones_like(s)
            for j, count in enumerate(np.rint(c).astype(np.int64)):
                if count > 0:
                    v[j * ne0 : (j + 1) * ne0] = s[j * ne0 : (j + 1) * ne0] / np.float32(count)
            out[name] = v
    return out


def _load_legacy(path: Path) -> dict[str, np.ndarray]:
    data = path.read_bytes()
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(data):
            raise ConvertError(f"{path.name}: truncated importance matrix ({what} at byte {pos})")
        b = data[pos : pos + n]
        pos += n
        return b

    (n_entries,) = struct.unpack("<i", take(4, "entry count"))
    if not 1 <= n_entries <= 1 << 20:
        raise ConvertError(f"{path.name} is neither a GGUF nor a legacy imatrix file ({n_entries} entries)")
    out = {}
    for i in range(n_entries):
        (n,) = struct.unpack("<i", take(4, f"name length {i}"))
        if not 0 < n <= 1 << 12:
            raise ConvertError(f"{path.name}: entry {i} has a name of {n} bytes")
        try:
            name = take(n, f"name {i}").decode("utf-8")
        except UnicodeDecodeError:
            raise ConvertError(f"{path.name}: entry {i}'s name is not UTF-8") from None
        ncall, nval = struct.unpack("<ii", take(8, f"counts of {name}"))
        if nval < 1:
            raise ConvertError(f"{path.name}: {name} has {nval} values")
        s = np.frombuffer(take(4 * nval, f"values of {name}"), dtype=np.float32).copy()
        out[name] = s / np.float32(ncall) if ncall > 0 else s
    return out
