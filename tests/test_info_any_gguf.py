"""`clover-cpu info` describes any GGUF gguf-py can read (other architectures, tensor types clover-cpu
cannot run, vocabulary-only files), and `run` refuses what it cannot run in one line that names it."""

import json
import subprocess
import sys

import numpy as np
import pytest

import realfiles


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "clover_cpu", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def _write(path, arch, tensors):
    """A GGUF written by gguf-py: `tensors` maps name -> (float32 array, GGMLQuantizationType)."""
    import gguf
    from gguf import quants

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    for name, (x, qtype) in tensors.items():
        data = quants.quantize(x, qtype) if qtype not in (gguf.GGMLQuantizationType.F32,) else x
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    import gguf

    T = gguf.GGMLQuantizationType
    d = tmp_path_factory.mktemp("foreign")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    llama = _write(
        d / "llama-tq1_0.gguf",
        "llama",
        {
            "blk.0.ffn_down.weight": (x, T.TQ1_0),
            "blk.0.ffn_up.weight": (x, T.TQ2_0),
            "output_norm.weight": (x[0], T.F32),
        },
    )
    ours = _write(
        d / "qwen35moe-tq1_0.gguf",
        "qwen35moe",
        {"blk.0.ffn_down.weight": (x, T.TQ1_0), "blk.0.attn_q.weight": (x, T.Q8_0)},
    )
    return llama, ours


def test_info_describes_other_architectures_and_types(foreign):
    llama, _ = foreign
    r = cli("info", llama)
    assert r.returncode == 0, r.stderr
    assert "architecture:  llama" in r.stdout
    assert "TQ1_0" in r.stdout and "TQ2_0" in r.stdout and "cannot run this type" in r.stdout
    assert "cannot run it:" in r.stdout and "'llama' model" in r.stdout
    d = json.loads(cli("info", "--json", llama).stdout)
    assert d["types"]["TQ1_0"]["tensors"] == 1 and d["types"]["TQ1_0"]["runs"] is False
    assert d["types"]["F32"]["runs"] is True and d["runnable"] is False
    v = cli("info", "--verify", llama)  # types it cannot check are skipped, not a crash
    assert v.returncode == 0 and "Traceback" not in v.stderr


def test_run_refuses_in_one_line(foreign):
    llama, ours = foreign
    r = cli("run", "-m", llama, "-p", "x")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "'llama' model" in line and "qwen35moe" in line
    r = cli("run", "-m", ours, "-p", "x")
    line = r.stderr.strip()
    assert r.returncode == 2 and "\n" not in line and "TQ1_0" in line and "Q4_K" in line, line


def test_vocabulary_only_files():
    """llama.cpp's own vocabulary files: info describes every one; run says it holds no tensors."""
    models = realfiles.llama_cpp() / "models"
    for path in sorted(models.glob("ggml-vocab-*.gguf")):
        r = cli("info", "--json", path)
        assert r.returncode == 0, (path.name, r.stderr)
        d = json.loads(r.stdout)
        assert d["tensors"] == 0 and d["runnable"] is False and d["tokenizer"]["vocab"] > 1000
    d = json.loads(cli("info", "--json", models / "ggml-vocab-qwen35.gguf").stdout)
    assert (
        d["architecture"] == "qwen2"
        and d["tokenizer"]["pre"] == "qwen35"
        and d["tokenizer"]["supported"] is None
    )
    assert d["chat_template"]["renders"] is True
    r = cli("run", "-m", models / "ggml-vocab-qwen35.gguf", "-p", "x")
    assert r.returncode == 2 and "no tensors" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_unknown_type_code(tmp_path, foreign):
    """A tensor type id that is not ggml's at all is a corrupt file: one line."""
    _, ours = foreign
    raw = bytearray(ours.read_bytes())
    from clover_cpu.gguf_file import GGUFFile

    with GGUFFile(ours) as g:
        n_tensors = len(g.tensors)
    # the type field of the first tensor info: find the name and skip dims
    name = b"blk.0.ffn_down.weight"
    i = raw.index(name) + len(name)
    n_dims = int.from_bytes(raw[i : i + 4], "little")
    t = i + 4 + 8 * n_dims
    raw[t : t + 4] = (250).to_bytes(4, "little")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(raw))
    assert n_tensors == 2
    r = cli("info", bad)
    assert r.returncode == 2 and "ggml type 250" in r.stderr and "Traceback" not in r.stderr
