"""A validating GGUF reader: every length, count, type, shape and byte range is checked against the
file before anything is used, and tensors are memory-mapped in place (never copied).

Format: magic "GGUF", version (2 or 3), tensor count, kv count, the kv pairs, the tensor infos
(name, dims in ggml `ne` order, type, offset), then the data section at the next multiple of
`general.alignment` (default 32); tensor offsets are relative to it.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .kernels import FORMATS


class GGUFError(ValueError):
    """The file is not a GGUF file we can use; the message says what is wrong."""


# value type id -> (struct format, size)
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
            7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
       10: np.uint64, 11: np.int64, 12: np.float64}
STRING, ARRAY = 8, 9
# every ggml tensor type (ggml.h; gguf-py's GGML_QUANT_SIZES): id -> (name, block size, bytes per block).
# Any of them can be read and described; the kernels run the ones in kernels.FORMATS.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
TYPE_NAMES = {t: name.lower() for t, (name, _, _) in GGML_TYPES.items()}
BLOCKS = {name.lower(): (bs, nb) for name, bs, nb in GGML_TYPES.values()}
MAX_DIMS = 4
MAX_KEY = 1 << 16
# where a block format keeps its float16 scales: (byte offset in the block, how many). The other bytes of
# a block are small integers, so a block's values are finite exactly when these scales are.
_F16_SCALES = {"q8_0": (0, 1), "q4_0": (0, 1), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208, 1)}
# a float is NaN or Inf exactly when its exponent bits are all ones: (view dtype, exponent mask)
_EXP_MASK = {"f32": (np.uint32, 0x7F800000), "f16": (np.uint16, 0x7C00), "bf16": (np.uint16, 0x7F80)}


@dataclass
class TensorInfo:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    type_name: str  # ggml's type name in lower case: f32, q8_0, q4_k, iq2_xs, ...
    offset: int  # absolute offset in the file (in the part that holds it)
    nbytes: int
    part: int = 0  # which file of a split model holds it (0: the first, or the only one)

    @property
    def supported(self) -> bool:
        """Whether clover-cpu's kernels run this tensor's type."""
        return self.type_name in FORMATS

    @property
    def ggml_type(self) -> str:
        """The type as llama.cpp names it (Q4_K, IQ2_XS, F16)."""
        return self.type_name.upper()

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order (the reverse of ne)."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n


class StringArray:
    """A GGUF array of strings, bounds-checked at open and decoded on first use (a 248K-token
    vocabulary costs ~1 s to decode in Python; most runs never need it)."""

    def __init__(self, buf, start: int, count: int, key: str):
        self._buf, self._start, self._count, self._key = buf, start, count, key
        self._items: list[str] | None = None

    def _decode(self) -> list[str]:
        if self._items is None:
            out, pos, buf = [], self._start, self._buf
            for i in range(self._count):
                n = struct.unpack_from("<Q", buf, pos)[0]
                try:
                    out.append(bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8"))
                except UnicodeDecodeError:
                    raise GGUFError(f"element {i} of {self._key} is not valid UTF-8") from None
                pos += 8 + n
            self._items = out
        return self._items

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        return self._decode()[i]

    def __iter__(self):
        return iter(self._decode())

    def __eq__(self, other):
        return list(self) == list(other)


class _Cursor:
    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(f"truncated file: {what} at byte {self.pos} needs {n} bytes, the file has {self.size}")

    def scalar(self, t: int, what: str):
        fmt, n = _SCALARS[t]
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.u64(f"length of {what}")
        if limit is not None and n > limit:
            raise GGUFError(f"{what} is {n} bytes long (limit {limit})")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{what} is not valid UTF-8") from None

    def value(self, t: int, key: str, depth: int = 0):
        if t in _SCALARS:
            return self.scalar(t, f"value of {key}")
        if t == STRING:
            return self.string(f"value of {key}")
        if t == ARRAY:
            if depth > 0:
                raise GGUFError(f"{key}: nested arrays are not supported")
            et = self.u32(f"element type of {key}")
            n = self.u64(f"length of {key}")
            if et in _SCALARS:
                size = _SCALARS[et][1]
                self.need(n * size, f"array {key} ({n} elements)")
                arr = np.frombuffer(self.buf, dtype=_NP[et], count=n, offset=self.pos).copy()
                self.pos += n * size
                return arr
            if et == STRING:
                # each string needs at least its 8-byte length: refuse absurd counts before looping
                self.need(n * 8, f"array {key} ({n} strings)")
                start = self.pos
                unpack, buf, pos, size = struct.unpack_from, self.buf, self.pos, self.size
                for i in range(n):  # walk the lengths now (bounds), decode on first use
                    if pos + 8 > size:
                        self.pos = pos
                        self.need(8, f"length of element {i} of {key}")
                    ln = unpack("<Q", buf, pos)[0]
                    pos += 8 + ln
                    if pos > size:
                        self.pos = pos - ln
                        self.need(ln, f"element {i} of {key}")
                self.pos = pos
                return StringArray(buf, start, n, key)
            raise GGUFError(f"{key}: unknown array element type {et}")
        raise GGUFError(f"{key}: unknown value type {t}")


SPLIT_NAME = re.compile(r"(.*)-(\d{5})-of-(\d{5})\.gguf")


class GGUFFile:
    """An open, validated GGUF file. `kv` holds the metadata; `tensors` the tensor infos. A model split by
    llama-gguf-split (or `clover-cpu convert --split-max-size`) opens from its first part,
    NAME-00001-of-0000K.gguf: every part is mapped and checked (split.no, split.count,
    split.tensors.count), its tensors joined into `tensors`."""

    def __init__(self, path: str | os.PathLike, *, _part_no: int | None = None):
        self.path = Path(path)
        self._parts: list[GGUFFile] = []
        try:
            self._file = open(self.path, "rb")
        except OSError as e:
            raise GGUFError(f"cannot open {self.path}: {e.strerror or e}") from None
        st = os.fstat(self._file.fileno())
        self.file_size = st.st_size
        self._identity = (st.st_size, st.st_mtime_ns)
        if self.file_size < 24:
            self._file.close()
            raise GGUFError(f"{self.path.name} is not a GGUF file ({self.file_size} bytes)")
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._maps = [self._mm]
        try:
            self._parse()
            self._join_split(_part_no)
        except GGUFError:
            self.close()
            raise

    def _split_key(self, key: str) -> int | None:
        v = self.kv.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) < 1 << 16:
            raise GGUFError(f"{self.path.name}: {key} = {v!r} is not a part number")
        return int(v)

    def _join_split(self, part_no: int | None) -> None:
        """Open and check the other parts of a split model (this file being its first), or, for a part
        opened by its first, check that it is the part expected."""
        count, no = self._split_key("split.count"), self._split_key("split.no")
        total = self._split_key("split.tensors.count")
        name = self.path.name
        if part_no is not None:  # a later part, opened by the first
            return
        if count is None or count <= 1:
            if no:
                raise GGUFError(f"{name} has split.no = {no} but no split.count")
            return
        m = SPLIT_NAME.fullmatch(name)
        if no is None or no >= count:
            raise GGUFError(f"{name}: split.no = {no} does not fit split.count = {count}")
        if no != 0:
            first = f"{m.group(1)}-00001-of-{count:05d}.gguf" if m else "its first part"
            raise GGUFError(f"{name} is part {no + 1} of {count} of a split model: open {first}")
        if not m:
            raise GGUFError(f"{name} is the first of {count} parts of a split model, but its name is not "
                            f"NAME-00001-of-{count:05d}.gguf, so the other parts cannot be found")
        if int(m.group(3)) != count:
            raise GGUFError(f"{name} is named as one of {int(m.group(3))} parts but says split.count = {count}")
        n_tensors = len(self.tensors)
        for k in range(1, count):
            path = self.path.with_name(f"{m.group(1)}-{k + 1:05d}-of-{count:05d}.gguf")
            if not path.exists():
                raise GGUFError(f"the model is split into {count} parts and part {k + 1}, {path.name}, is missing")
            part = GGUFFile(path, _part_no=k)
            self._parts.append(part)
            p_count, p_no = part._split_key("split.count"), part._split_key("split.no")
            p_total = part._split_key("split.tensors.count")
            if (p_count, p_no, p_total) != (count, k, total):
                raise GGUFError(f"{path.name} does not belong with {name} (split.count {p_count}, split.no {p_no}, "
                                f"split.tensors.count {p_total}; expected {count}, {k}, {total}): parts of two "
                                "different models?")
            self._maps.append(part._mm)
            for tname, ti in part.tensors.items():
                if tname in self.tensors:
                    raise GGUFError(f"tensor {tname} is in two parts of the split model ({name}, {path.name})")
                ti.part = k
                self.tensors[tname] = ti
            n_tensors += len(part.tensors)
        if total is not None and n_tensors != total:
            raise GGUFError(f"the {count} parts of {m.group(1)} hold {n_tensors} tensors, split.tensors.count says "
                            f"{total}")
        self.file_size = sum([self.file_size] + [p.file_size for p in self._parts])

    @property
    def paths(self) -> list[Path]:
        """The file, and the other parts of a split model."""
        return [self.path] + [p.path for p in self._parts]

    def _parse(self) -> None:
        c = _Cursor(self._mm, self.file_size)
        if bytes(self._mm[:4]) != b"GGUF":
            raise GGUFError(f"{self.path.name} is not a GGUF file (bad magic {bytes(self._mm[:4])!r})")
        c.pos = 4
        self.version = c.u32("version")
        if self.version not in (2, 3):
            raise GGUFError(f"unsupported GGUF version {self.version} (supported: 2, 3)")
        n_tensors = c.u64("tensor count")
        n_kv = c.u64("kv count")
        # every kv needs >= 13 bytes and every tensor info >= 28: refuse impossible counts up front
        if n_kv * 13 > self.file_size or n_tensors * 28 > self.file_size:
            raise GGUFError(f"truncated or corrupt file: {n_tensors} tensors and {n_kv} keys cannot fit in {self.file_size} bytes")
        self.kv: dict[str, object] = {}
        for i in range(n_kv):
            key = c.string(f"key {i}", limit=MAX_KEY)
            t = c.u32(f"type of {key}")
            if key in self.kv:
                raise GGUFError(f"duplicate key {key}")
            self.kv[key] = c.value(t, key)
        self.alignment = int(self.kv.get("general.alignment", 32))
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise GGUFError(f"general.alignment {self.alignment} is not a power of two")
        infos = []
        for i in range(n_tensors):
            name = c.string(f"name of tensor {i}", limit=MAX_KEY)
            n_dims = c.u32(f"dims of {name}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFError(f"tensor {name} has {n_dims} dimensions (1..{MAX_DIMS} supported)")
            ne = tuple(c.u64(f"dim {d} of {name}") for d in range(n_dims))
            t = c.u32(f"type of {name}")
            offset = c.u64(f"offset of {name}")
            infos.append((name, ne, t, offset))
        self.data_offset = -(-c.pos // self.alignment) * self.alignment
        data_size = self.file_size - self.data_offset
        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, t, offset in infos:
            if name in self.tensors:
                raise GGUFError(f"duplicate tensor {name}")
            if t not in TYPE_NAMES:
                raise GGUFError(f"tensor {name} has ggml type {t}, which is not a type of ggml (not even in "
                                "gguf-py's table): the file is corrupt or newer than clover-cpu")
            block_size, block_bytes = BLOCKS[TYPE_NAMES[t]]
            if any(d <= 0 or d >= 1 << 40 for d in ne):
                raise GGUFError(f"tensor {name} has an invalid shape {list(ne)}")
            if ne[0] % block_size:
                raise GGUFError(f"tensor {name}: row of {ne[0]} is not a multiple of the {TYPE_NAMES[t].upper()} "
                                "block size")
            n = 1
            for d in ne:
                n *= d
            if n >= 1 << 48:
                raise GGUFError(f"tensor {name} is impossibly large ({list(ne)})")
            nbytes = n // block_size * block_bytes
            if offset % self.alignment:
                raise GGUFError(f"tensor {name} is misaligned (offset {offset}, alignment {self.alignment})")
            if offset + nbytes > data_size:
                raise GGUFError(f"truncated file: tensor {name} needs bytes up to {self.data_offset + offset + nbytes}, "
                                f"the file has {self.file_size}")
            self.tensors[name] = TensorInfo(name, ne, TYPE_NAMES[t], self.data_offset + offset, nbytes)
        spans = sorted((ti.offset, ti.offset + ti.nbytes, ti.name) for ti in self.tensors.values())
        for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
            if s1 < e0:
                raise GGUFError(f"tensors {n0} and {n1} overlap")

    @property
    def arch(self) -> str:
        a = self.kv.get("general.architecture")
        if not isinstance(a, str):
            raise GGUFError("missing general.architecture")
        return a

    def data(self, name: str) -> np.ndarray:
        """The tensor's bytes as uint8 rows [n_rows, row_bytes] (a view of the mapped file)."""
        ti = self.tensors[name]
        block_size, block_bytes = BLOCKS[ti.type_name]
        rb = ti.ne[0] // block_size * block_bytes
        arr = np.frombuffer(self._maps[ti.part], dtype=np.uint8, count=ti.nbytes, offset=ti.offset)
        return arr.reshape(-1, rb)

    def check_unchanged(self) -> None:
        """Refuse to go on when the open file was rewritten in place since it was mapped (its size or
        modification time moved): the mapped bytes are no longer the ones that were validated. Removing
        or replacing the file by name (as `clover-cpu convert` does: write aside, then rename) leaves the
        mapping intact and is fine."""
        try:
            st = os.fstat(self._file.fileno())
        except (OSError, ValueError):
            raise GGUFError(f"{self.path.name} is closed") from None
        if (st.st_size, st.st_mtime_ns) != self._identity:
            raise GGUFError(f"{self.path} was modified on disk after it was loaded ({self._identity[0]} -> "
                            f"{st.st_size} bytes); load it again")
        for part in self._parts:
            part.check_unchanged()

    def nonfinite(self, name: str, chunk: int = 1 << 24) -> bool:
        """True when tensor `name` holds a NaN or Inf (for block formats: a NaN or Inf scale). Reads the
        tensor's bytes (or only its scales) in chunks, without decoding the weights."""
        ti = self.tensors[name]
        raw = np.frombuffer(self._maps[ti.part], dtype=np.uint8, count=ti.nbytes, offset=ti.offset)
        if ti.type_name in _EXP_MASK:
            dt, mask = _EXP_MASK[ti.type_name]
            words = raw.view(dt)
            step = chunk // words.itemsize
            return any(bool(((words[i : i + step] & mask) == mask).any()) for i in range(0, words.size, step))
        off, n = _F16_SCALES[ti.type_name]
        blocks = raw.reshape(-1, BLOCKS[ti.type_name][1])
        step = max(1, chunk // blocks.shape[1])
        for i in range(0, blocks.shape[0], step):
            scales = np.ascontiguousarray(blocks[i : i + step, off : off + 2 * n]).view(np.uint16)
            if ((scales & 0x7C00) == 0x7C00).any():
                return True
        return False

    def can_verify(self, name: str) -> bool:
        """Whether nonfinite() knows where this tensor's type keeps its floats (float types and the block
        formats clover-cpu runs)."""
        t = self.tensors[name].type_name
        return t in _EXP_MASK or t in _F16_SCALES

    def verify(self, progress=None) -> list[str]:
        """Names of the tensors holding NaN or Inf (every tensor of a type can_verify() knows is read once:
        slow on a big file). progress(done_bytes, total_bytes) is called after each tensor."""
        bad, done = [], 0
        total = sum(ti.nbytes for ti in self.tensors.values())
        for name, ti in self.tensors.items():
            if self.can_verify(name) and self.nonfinite(name):
                bad.append(name)
            done += ti.nbytes
            if progress:
                progress(done, total)
        return bad

    def close(self) -> None:
        for part in getattr(self, "_parts", []):
            part.close()
        try:
            self._mm.close()
        except (BufferError, AttributeError):
            pass  # numpy views still alive keep the map open
        try:
            self._file.close()
        except AttributeError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
