"""A model file that parses but lies: a vocabulary that disagrees with the embedding, NaN/Inf weights,
a file rewritten or removed while it is mapped. Each is refused with an error naming what is wrong, or
(removal) does no harm; none produces garbage silently."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import clover_cpu
from clover_cpu.gguf_file import GGUFError, GGUFFile

SHIPPED = Path(clover_cpu.__file__).parent / "models" / "clover-small.gguf"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A tiny real clover file (f16 norms and q8_0 matrices, like the shipped model)."""
    from clover_cpu.convert.hf import convert
    from clover_cpu.convert.synthetic import write_random_checkpoint

    d = tmp_path_factory.mktemp("hostile")
    write_random_checkpoint(d / "hf", model_type="clover", seed=3)
    out = d / "m.gguf"
    convert(d / "hf", out, out_type="q8_0", log=lambda s: None, progress=False)
    return out


def rewrite(src: Path, dst: Path, change: dict) -> None:
    """Copy a GGUF with some metadata replaced (key -> new value, or None to drop it), tensors as they were."""
    import gguf

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        t = f.types[0]
        sub = f.types[-1] if t == gguf.GGUFValueType.ARRAY else None
        value = change.get(f.name, f.contents())
        if value is not None:
            w.add_key_value(f.name, value, t, sub_type=sub)
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data)
    w.close()


def test_rewrite_keeps_a_good_file_good(small, tmp_path):
    p = tmp_path / "same.gguf"
    rewrite(small, p, {})
    a, b = clover_cpu.load(small), clover_cpu.load(p)
    np.testing.assert_array_equal(a.forward([5, 6, 7]), b.forward([5, 6, 7]))


@pytest.mark.parametrize("delta", [-1, +1, -100])
def test_vocabulary_that_disagrees_with_the_embedding(small, tmp_path, delta):
    with GGUFFile(small) as g:
        tokens = list(g.kv["tokenizer.ggml.tokens"])
        n = len(tokens)
    new = tokens[: n + delta] if delta < 0 else tokens + [f"<extra{i}>" for i in range(delta)]
    p = tmp_path / "vocab.gguf"
    change = {"tokenizer.ggml.tokens": new}
    with GGUFFile(small) as g:  # the per-token arrays follow the tokens, so only the sizes disagree
        for k in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            if k in g.kv:
                v = list(g.kv[k])
                change[k] = v[: n + delta] if delta < 0 else v + [v[-1]] * delta
    rewrite(small, p, change)
    with pytest.raises(GGUFError, match=r"token_embd.weight has shape .*expected|outside the vocabulary"):
        clover_cpu.load(p)


def test_scores_that_disagree_with_the_tokens(small, tmp_path):
    with GGUFFile(small) as g:
        key = "tokenizer.ggml.scores" if "tokenizer.ggml.scores" in g.kv else "tokenizer.ggml.token_type"
        v = list(g.kv[key])
    p = tmp_path / "scores.gguf"
    rewrite(small, p, {key: v[:-3]})
    with pytest.raises(GGUFError, match=key.split(".")[-1]):
        clover_cpu.load(p)


def _poke(src: Path, dst: Path, tensor: str, value: float, where: int = 0) -> None:
    """Copy src with one float16 scale (block formats) or one value (float formats) of a tensor set."""
    raw = bytearray(src.read_bytes())
    with GGUFFile(src) as g:
        ti = g.tensors[tensor]
        fmt = {"f32": ("<f", 4), "f16": ("<e", 2)}.get(ti.type_name)
        if fmt:
            off = ti.offset + where * fmt[1]
            raw[off : off + fmt[1]] = struct.pack(fmt[0], value)
        else:
            assert ti.type_name == "q8_0"
            off = ti.offset + where * 34
            raw[off : off + 2] = struct.pack("<e", value)
    dst.write_bytes(bytes(raw))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_weights_in_a_matrix(small, tmp_path, value):
    """Matrices are not scanned at load (that reads the whole file); `info --verify` finds them, and a
    forward that meets them stops with an error instead of returning NaN logits."""
    with GGUFFile(small) as g:
        name = next(n for n, t in g.tensors.items() if t.type_name == "q8_0" and "ffn" in n and "blk.0" in n)
        name_out = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    p = tmp_path / "bad.gguf"
    _poke(small, p, name_out, value)
    with GGUFFile(p) as g:
        assert g.verify() == [name_out]
    with GGUFFile(small) as g:
        assert g.verify() == []
    m = clover_cpu.load(p)
    with pytest.raises(GGUFError, match="NaN or Inf logits.*info --verify"):
        list(m.generate("def f(x):", max_new_tokens=8))
    m.close()
    r = subprocess.run([sys.executable, "-m", "clover_cpu", "info", "--verify", str(p)], capture_output=True, text=True)
    assert r.returncode == 1 and f"CORRUPT: NaN or Inf in 1 tensors: {name_out}" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "clover_cpu", "run", "-m", str(p), "--prompt", "x", "-n", "4"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "NaN or Inf logits" in r.stderr and "Traceback" not in r.stderr, r.stderr
    q = tmp_path / "bad2.gguf"
    _poke(small, q, name, value, where=3)
    with GGUFFile(q) as g:
        assert g.verify() == [name]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("which", ["ffn_down_shexp", "ssm_out", "attn_qkv"])
def test_nonfinite_weights_in_a_layer(small, tmp_path, value, which):
    """A bad scale in a layer's matrix (not the output head) stops the forward too: the activation quantizer
    gives a block holding NaN or Inf a NaN scale, so the logits are NaN, where int8 quants used to carry
    finite garbage on (the model generated tokens)."""
    with GGUFFile(small) as g:
        name = next(n for n in g.tensors if n.startswith("blk.0.") and which in n)
    p = tmp_path / "bad.gguf"
    _poke(small, p, name, value, where=3)
    m = clover_cpu.load(p)
    with pytest.raises(GGUFError, match="NaN or Inf logits.*info --verify"):
        list(m.generate("def f(x):", max_new_tokens=8))
    m.close()


@pytest.mark.parametrize("fmt", ["f32", "f16", "bf16", "q4_0", "q4_k", "q5_k", "q6_k"])
def test_nonfinite_scan_of_every_format(tmp_path, fmt):
    """The scan looks at the right bytes of every block format: a quantized tensor with one scale set
    to Inf is found, the same tensor without it is not."""
    from clover_cpu import kernels

    w = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    blob = kernels.quantize(w, fmt).tobytes()
    spec = kernels.FORMATS[fmt]
    bad = bytearray(blob)
    if fmt in ("f32", "f16", "bf16"):
        bad[-spec["block_bytes"]:] = {"f32": struct.pack("<f", float("inf")), "f16": struct.pack("<e", float("inf")),
                                      "bf16": b"\x80\x7f"}[fmt]
    else:
        off = {"q6_k": 208}.get(fmt, 0) + spec["block_bytes"] * 5
        bad[off : off + 2] = struct.pack("<e", float("nan"))
    for data, want in ((blob, False), (bytes(bad), True)):
        p = tmp_path / f"{fmt}.gguf"
        p.write_bytes(_gguf_with_tensor(data, (512, 4), spec["ggml_type"]))
        with GGUFFile(p) as g:
            assert g.nonfinite("w", chunk=300) is want  # a small chunk: the scan crosses chunk edges


def _gguf_with_tensor(data: bytes, ne, ggml_type: int) -> bytes:
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    out = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + s("general.architecture") + struct.pack("<I", 8) + s("clover")
    out += s("w") + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", ggml_type, 0)
    out += b"\0" * (-len(out) % 32)
    return out + data


def test_file_rewritten_in_place_while_mapped(small, tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(small.read_bytes())
    m = clover_cpu.load(p)
    before = m.forward([1, 2, 3])
    with open(p, "r+b") as f:  # another program writes into the same file (same inode)
        f.seek(-64, os.SEEK_END)
        f.write(b"\x7f" * 64)
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a clock coarser than the write
    with pytest.raises(GGUFError, match="modified on disk after it was loaded.*load it again"):
        m.forward([1, 2, 3])
    with pytest.raises(GGUFError, match="modified on disk"):
        list(m.generate("x", max_new_tokens=4))
    m.close()
    m = clover_cpu.load(small)
    np.testing.assert_array_equal(m.forward([1, 2, 3]), before)


def test_file_removed_or_replaced_while_mapped(small, tmp_path):
    """Removing the file, or replacing it by name (what convert does), leaves the mapping intact: the
    loaded model goes on computing exactly what it did."""
    p = tmp_path / "m.gguf"
    p.write_bytes(small.read_bytes())
    m = clover_cpu.load(p)
    before = m.forward([4, 5, 6, 7])
    p.unlink()
    np.testing.assert_array_equal(m.forward([4, 5, 6, 7]), before)
    q = tmp_path / "other.gguf"
    q.write_bytes(b"GGUF" + b"\0" * 100)
    os.replace(q, p)
    np.testing.assert_array_equal(m.forward([4, 5, 6, 7]), before)
    m.close()


def test_detokenize_padding_and_out_of_range_ids(tmp_path):
    """Ids past the SentencePiece pieces (the rows that pad the vocabulary to the embedding) have no text;
    ids outside the vocabulary are a clear error (the fuzzer found sentencepiece raising IndexError)."""
    from clover_cpu.convert.hf import convert
    from clover_cpu.convert.synthetic import write_random_checkpoint

    write_random_checkpoint(tmp_path / "hf", model_type="clover", seed=3, overrides={"vocab_size": 1100})
    convert(tmp_path / "hf", tmp_path / "p.gguf", out_type="q8_0", log=lambda s: None, progress=False)
    m = clover_cpu.load(tmp_path / "p.gguf")
    assert m.tokenizer.sp.GetPieceSize() < m.config.vocab_size == 1100
    ids = m.tokenize("def f(x):")
    assert m.detokenize(ids + [m.config.vocab_size - 1]) == m.detokenize(ids)
    assert m.generate_text("def f(x):", max_new_tokens=4)["text"] is not None
    for bad in (-1, m.config.vocab_size, 2**40):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            m.detokenize(ids + [bad])
    m.close()
