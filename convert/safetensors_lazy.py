"""Lazy, validated access to safetensors checkpoints (one file or shards with an index).

The header of every file is parsed and checked against the file size before any tensor is read.
Tensors are read a chunk of rows at a time with positioned reads into fresh buffers, not through a
memory map: pages of a map that has been read stay in the process's resident set, so converting a
13 GB checkpoint through mmap peaked at over 10 GB RSS. numpy has no bf16: it is widened from its
raw bytes (by the quantizer threads when no transform is needed).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ConvertError

DTYPES = {"BF16": 2, "F16": 2, "F32": 4}
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header


_NP_DTYPE = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
_FILES: dict[Path, object] = {}


def _file(path: Path):
    f = _FILES.get(path)
    if f is None:
        f = _FILES[path] = open(path, "rb")
    return f


def close_files() -> None:
    for f in _FILES.values():
        f.close()
    _FILES.clear()


@dataclass
class LazyTensor:
    name: str
    dtype: str  # "BF16", "F16" or "F32"
    shape: tuple[int, ...]
    path: Path
    offset: int  # absolute byte offset of the data in the file

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype]

    def _read_rows(self, row_len: int, start: int, stop: int, out: np.ndarray) -> None:
        """Rows [start, stop) (of row_len elements, stored dtype) into out, with one positioned read."""
        esize = DTYPES[self.dtype]
        f = _file(self.path)
        f.seek(self.offset + start * row_len * esize)
        view = memoryview(out.reshape(-1).view(np.uint8))
        got = f.readinto(view)
        if got != view.nbytes:
            raise ConvertError(f"{self.path.name}: {self.name} ended early (file truncated while reading?)")

    def take_raw_rows(self, row_len: int, index: np.ndarray) -> np.ndarray:
        """Rows at the given indices in the stored dtype (bf16 as uint16): no widening. Runs of
        consecutive indices are read in one go."""
        index = np.asarray(index, dtype=np.int64)
        out = np.empty((len(index), row_len), dtype=_NP_DTYPE[self.dtype])
        if len(index) == 0:
            return out
        breaks = np.flatnonzero(np.diff(index) != 1) + 1
        for run_start, run_stop in zip(np.r_[0, breaks], np.r_[breaks, len(index)]):
            first = int(index[run_start])
            self._read_rows(row_len, first, first + (run_stop - run_start), out[run_start:run_stop])
        return out

    def take_rows(self, row_len: int, index: np.ndarray) -> np.ndarray:
        """float32 rows at the given indices."""
        raw = self.take_raw_rows(row_len, index)
        if self.dtype == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32)

    def rows(self, row_len: int, start: int, stop: int) -> np.ndarray:
        """float32 rows [start, stop) of the tensor seen as [numel // row_len, row_len]."""
        return self.take_rows(row_len, np.arange(start, stop))

    def full(self) -> np.ndarray:
        """The whole tensor as float32 in its shape (for small tensors only)."""
        n = self.shape[-1] if self.shape else 1
        return self.rows(n, 0, self.numel // n if n else 0).reshape(self.shape)


def read_header(path: Path) -> dict[str, LazyTensor]:
    """Parse and validate one safetensors file: every tensor's bytes must lie inside the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ConvertError(f"{path.name}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise ConvertError(
                    f"{path.name}: truncated or corrupt safetensors file (header of {n} bytes, file of {size})"
                )
            header_bytes = f.read(n)
    except OSError as e:
        raise ConvertError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        header = json.loads(header_bytes)
        if not isinstance(header, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ConvertError(f"{path.name}: corrupt safetensors header ({e})") from None
    data_start = 8 + n
    data_size = size - data_start
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ConvertError(f"{path.name}: corrupt safetensors entry for {name!r}") from None
        ints = (*shape, begin, end)
        if not isinstance(dtype, str) or not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
            raise ConvertError(f"{path.name}: corrupt safetensors entry for {name!r} (dtype, shape or offsets)")
        if any(d < 0 for d in shape) or not (0 <= begin <= end):
            raise ConvertError(f"{path.name}: corrupt safetensors entry for {name!r}")
        if end > data_size:
            raise ConvertError(
                f"{path.name}: truncated safetensors file: {name} needs bytes up to {data_start + end}, "
                f"the file has {size}"
            )
        t = LazyTensor(name, dtype, shape, path, data_start + begin)
        if dtype in DTYPES and t.nbytes != end - begin:
            raise ConvertError(f"{path.name}: {name} has {end - begin} bytes, its shape {list(shape)} needs {t.nbytes}")
        tensors[name] = t
    return tensors


def open_checkpoint(src: Path) -> dict[str, LazyTensor]:
    """All tensors of a checkpoint folder: model.safetensors, or the shards its index lists."""
    index = src / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise ValueError("weight_map is not an object")
            for shard in weight_map.values():
                if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
                    raise ValueError(f"shard {shard!r} is not a file name in the checkpoint folder")
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise ConvertError(f"{index.name}: malformed index ({e})") from None
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (src / s).exists()]
        if missing:
            raise ConvertError(f"shard {missing[0]} is listed in {index.name} but absent from {src}")
        tensors: dict[str, LazyTensor] = {}
        for shard in shards:
            tensors.update(read_header(src / shard))
        absent = [name for name, shard in weight_map.items() if name not in tensors]
        if absent:
            raise ConvertError(f"tensor {absent[0]} is listed in {index.name} but not in {weight_map[absent[0]]}")
        return tensors
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ConvertError(f"no *.safetensors files in {src}")
    tensors = {}
    for path in files:
        tensors.update(read_header(path))
    return tensors


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], object]]) -> None:
    """Stream a safetensors file. tensors: name -> (dtype, shape, producer), where producer() yields
    byte chunks of exactly the tensor's size in order (so multi-GB tensors never sit in memory)."""
    header = {}
    offset = 0
    for name, (dtype, shape, _) in tensors.items():
        n = DTYPES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, (dtype, shape, producer) in tensors.items():
            want = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            wrote = 0
            for chunk in producer():
                f.write(chunk)
                wrote += len(chunk)
            if wrote != want:
                raise RuntimeError(f"producer for {name} wrote {wrote} bytes, expected {want}")
    os.replace(tmp, path)


def to_bf16_bytes(x: np.ndarray) -> bytes:
    """float32 -> bf16 bytes, round to nearest even (as torch does)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r.tobytes()
