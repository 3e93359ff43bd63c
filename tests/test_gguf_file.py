"""Corrupt and hostile GGUF files are refused with a clear error before any kernel sees them."""

import struct

import numpy as np
import pytest

import clover_cpu
from clover_cpu.gguf_file import GGUFError, GGUFFile

U32, STR, ARR = 4, 8, 9


def s(x: str) -> bytes:
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def build(kv=None, tensors=None, *, magic=b"GGUF", version=3, n_tensors=None, n_kv=None, align=32, data=None):
    """A GGUF byte string with every field under the test's control.
    tensors: list of (name, ne, type, offset); data: the bytes after the aligned header."""
    kv = kv if kv is not None else [("general.architecture", STR, s("qwen35moe"))]
    tensors = tensors if tensors is not None else [("t", (32, 2), 0, 0)]
    out = magic + struct.pack("<I", version)
    out += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors, len(kv) if n_kv is None else n_kv)
    for key, t, raw in kv:
        out += s(key) + struct.pack("<I", t) + raw
    for name, ne, t, off in tensors:
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", t, off)
    out += b"\0" * (-len(out) % align)
    if data is None:
        data = np.arange(64, dtype=np.float32).tobytes()
    return out + data


def refuse(tmp_path, blob, pattern):
    p = tmp_path / "x.gguf"
    p.write_bytes(blob)
    with pytest.raises(GGUFError, match=pattern):
        GGUFFile(p)


def test_valid_minimal(tmp_path):
    p = tmp_path / "ok.gguf"
    p.write_bytes(build())
    with GGUFFile(p) as g:
        assert g.arch == "qwen35moe"
        assert g.tensors["t"].shape == (2, 32)
        np.testing.assert_array_equal(g.data("t").view(np.float32).reshape(-1), np.arange(64, dtype=np.float32))


def test_magic_and_version(tmp_path):
    refuse(tmp_path, build(magic=b"GGML"), "not a GGUF file")
    refuse(tmp_path, build(version=1), "unsupported GGUF version 1")
    refuse(tmp_path, build(version=0xFFFFFFFF), "unsupported GGUF version")
    refuse(tmp_path, b"GGUF", "not a GGUF file")


def test_truncated_at_every_section(tmp_path):
    blob = build()
    header_end = len(blob) - 256
    for cut in [5, 8, 12, 20, 24, 30, 40, 60, header_end - 10, header_end + 10, len(blob) - 1]:
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(blob[:cut])
        with pytest.raises(GGUFError, match="truncated|not a GGUF"):
            GGUFFile(p)


def test_huge_counts_and_lengths(tmp_path):
    refuse(tmp_path, build(n_tensors=2**64 - 1), "cannot fit")
    refuse(tmp_path, build(n_kv=2**64 - 1), "cannot fit")
    refuse(tmp_path, build(n_kv=2**40), "cannot fit")
    bad_key = struct.pack("<Q", 2**64 - 1) + b"general.architecture"
    blob = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + bad_key
    refuse(tmp_path, blob, "limit|truncated")
    bad_str = [("general.architecture", STR, struct.pack("<Q", 2**64 - 1) + b"qwen")]
    refuse(tmp_path, build(kv=bad_str), "truncated")
    bad_arr = [("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, 2**64 - 1))]
    refuse(tmp_path, build(kv=bad_arr), "truncated")
    bad_arr = [("x", ARR, struct.pack("<IQ", U32, 2**62))]
    refuse(tmp_path, build(kv=bad_arr), "truncated")


def test_tensor_table(tmp_path):
    refuse(tmp_path, build(tensors=[("t", (32, 2), 0, 1 << 20)]), "truncated file: tensor t")
    refuse(tmp_path, build(tensors=[("t", (32, 2), 0, 4)]), "misaligned")
    refuse(tmp_path, build(tensors=[("a", (32, 2), 0, 0), ("b", (32, 1), 0, 128)]), "overlap")
    refuse(tmp_path, build(tensors=[("t", (32, 2), 99, 0)]), "ggml type 99")
    p = tmp_path / "tq1_0.gguf"  # TQ1_0: ggml's, read and described; the model loader refuses it (test_info_any_gguf)
    p.write_bytes(build(tensors=[("t", (256, 2), 34, 0)]))
    with GGUFFile(p) as g:
        assert g.tensors["t"].ggml_type == "TQ1_0" and not g.tensors["t"].supported and g.tensors["t"].nbytes == 108
    p = tmp_path / "iq1_s.gguf"  # IQ1_S: read and run
    p.write_bytes(build(tensors=[("t", (256, 2), 19, 0)]))
    with GGUFFile(p) as g:
        assert g.tensors["t"].ggml_type == "IQ1_S" and g.tensors["t"].supported and g.tensors["t"].nbytes == 100
    refuse(tmp_path, build(tensors=[("t", (2**63, 2**63), 0, 0)]), "invalid shape|impossibly large")
    refuse(tmp_path, build(tensors=[("t", (2**32, 2**32), 0, 0)]), "invalid shape|impossibly large")
    refuse(tmp_path, build(tensors=[("t", (0, 2), 0, 0)]), "invalid shape")
    refuse(tmp_path, build(tensors=[("t", (33, 2), 8, 0)]), "multiple of the Q8_0 block size")
    refuse(tmp_path, build(tensors=[("t", (1, 1, 1, 1, 1), 0, 0)]), "dimensions")
    refuse(tmp_path, build(tensors=[("t", (32,), 0, 0), ("t", (32,), 0, 128)]), "duplicate tensor")
    refuse(tmp_path, build(kv=[("k", U32, struct.pack("<I", 1)), ("k", U32, struct.pack("<I", 2))]), "duplicate key")
    refuse(tmp_path, build(kv=[("k", 77, b"")]), "unknown value type 77")


def test_model_level_checks(tmp_path):
    """A parseable file that is not a usable model: the loader names what is wrong."""
    from clover_cpu.gguf_file import GGUFError as E

    p = tmp_path / "m.gguf"
    p.write_bytes(build())
    with pytest.raises(E, match="missing metadata key qwen35moe.block_count"):
        clover_cpu.load(p)
    p.write_bytes(build(kv=[("general.architecture", STR, s("llama"))]))
    with pytest.raises(E, match="is a 'llama' model; clover-cpu runs the architectures clover, qwen35moe"):
        clover_cpu.load(p)


def test_real_file_wrong_shape_and_nan(tmp_path):
    """Tensors of a real converted file: a wrong shape or NaN in a norm is refused by name."""
    from clover_cpu.convert.hf import convert
    from clover_cpu.convert.synthetic import write_random_checkpoint

    write_random_checkpoint(tmp_path / "hf", model_type="clover", seed=1)
    good = tmp_path / "m.gguf"
    convert(tmp_path / "hf", good, out_type="f32", log=lambda x: None, progress=False)
    clover_cpu.load(good).close()
    raw = bytearray(good.read_bytes())
    with GGUFFile(good) as g:
        ti = g.tensors["blk.0.attn_norm.weight"]
        off = ti.offset
    # NaN in a norm weight
    bad = bytearray(raw)
    bad[off : off + 4] = struct.pack("<f", float("nan"))
    p = tmp_path / "nan.gguf"
    p.write_bytes(bytes(bad))
    with pytest.raises(GGUFError, match="blk.0.attn_norm.weight holds NaN"):
        clover_cpu.load(p)
    # truncated in the middle of the data
    p.write_bytes(bytes(raw[: len(raw) // 2]))
    with pytest.raises(GGUFError, match="truncated file"):
        clover_cpu.load(p)
