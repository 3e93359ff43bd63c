"""The converter's low-bit recipes (q3_k_m, q3_k_s, q2_k, iq4_xs, iq4_nl) and its importance-matrix reader.

The type of every tensor equals what llama.cpp b11434's llama-quantize chose for the same checkpoints
(tests/data/llama_quantize_recipes.json, written by bench/check_convert_lowbit.py from llama-quantize runs
on our F16 files of these checkpoints), with and without an importance matrix; the files load and run; the
imatrix reader reads llama-imatrix's GGUF and legacy .dat files as llama-quantize does, and refuses broken
ones in one line."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import clover_cpu
from clover_cpu.convert.errors import ConvertError
from clover_cpu.convert.hf import convert
from clover_cpu.convert.imatrix import load_imatrix

FIXTURE = Path(__file__).parent / "data" / "llama_quantize_recipes.json"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))


def write_imatrix_gguf(path: Path, entries: dict[str, np.ndarray], counts: dict[str, np.ndarray]) -> Path:
    """An importance matrix in llama-imatrix's GGUF layout: NAME.in_sum2 and NAME.counts, F32."""
    import gguf

    w = gguf.GGUFWriter(str(path), "imatrix")
    w.add_array("imatrix.datasets", ["test"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 128)
    for name, v in entries.items():
        w.add_tensor(name + ".in_sum2", v.astype(np.float32))
        w.add_tensor(name + ".counts", counts[name].astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def fixture():
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, fixture):
    import check_convert_lowbit

    out = {}
    for shape in fixture["types"]:
        d = tmp_path_factory.mktemp(shape)
        out[shape] = check_convert_lowbit.checkpoint(d / "hf", shape)
    return out


def _imatrix_for(ckpt: Path, tmp: Path) -> Path:
    """Any valid importance matrix over the checkpoint's quantized tensors (the recipe looks only at
    whether one is given; the values steer the quantizer)."""
    f32 = tmp / "f32.gguf"
    convert(ckpt, f32, out_type="f32", log=lambda s: None, progress=False, force=True)
    from clover_cpu.gguf_file import GGUFFile

    rng = np.random.default_rng(0)
    entries, counts = {}, {}
    with GGUFFile(f32) as g:
        for name, ti in g.tensors.items():
            if len(ti.ne) >= 2:
                n_expert = ti.ne[2] if len(ti.ne) == 3 else 1
                entries[name] = rng.uniform(0.1, 2.0, n_expert * ti.ne[0]) * 7
                counts[name] = np.full(n_expert, 7.0)
    return write_imatrix_gguf(tmp / "imatrix.gguf", entries, counts)


@pytest.mark.parametrize("recipe", ["q3_k_m", "q3_k_s", "q2_k", "iq4_xs", "iq4_nl"])
def test_recipes_choose_as_llama_quantize(fixture, checkpoints, tmp_path, recipe):
    for shape, ckpt in checkpoints.items():
        for use_im in (False, True):
            key = f"{recipe}{'+imatrix' if use_im else ''}"
            (tmp_path / f"{shape}-{key}").mkdir(exist_ok=True)
            imatrix = _imatrix_for(ckpt, tmp_path / f"{shape}-{key}") if use_im else None
            out = tmp_path / f"{shape}-{key}.gguf"
            info = convert(ckpt, out, out_type=recipe, log=lambda s: None, progress=False, imatrix=imatrix)
            want = fixture["types"][shape][key]
            got = {n: t for n, t in info["types"].items() if t not in ("f32", "f16")}
            assert got == want, (shape, key, {n: (got.get(n), want.get(n)) for n in set(got) | set(want)
                                              if got.get(n) != want.get(n)})
            if shape == "w256_e16_mtp" and not use_im:
                m = clover_cpu.load(out)
                assert np.isfinite(m.forward([1, 2, 3, 4])).all()


def test_imatrix_gguf_as_llama_quantize_reads_it(tmp_path):
    """GGUF: in_sum2 / count per expert; an expert with count 0 gets importance 1."""
    v = np.arange(1, 9, dtype=np.float32)
    p = write_imatrix_gguf(tmp_path / "m.gguf", {"a.weight": v, "e.weight": np.concatenate([v, v])},
                           {"a.weight": np.array([4.0]), "e.weight": np.array([2.0, 0.0])})
    m = load_imatrix(p)
    np.testing.assert_array_equal(m["a.weight"], v / 4)
    np.testing.assert_array_equal(m["e.weight"], np.concatenate([v / 2, np.ones(8, np.float32)]))


def test_imatrix_legacy_dat(tmp_path):
    """Legacy .dat: entries of name, ncall, values (divided by ncall on reading); trailing chunk count and
    dataset name."""
    v = np.arange(1, 5, dtype=np.float32) * 3
    name = b"blk.0.attn_q.weight"
    data = struct.pack("<i", 1) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 3, 4) + v.tobytes()
    data += struct.pack("<i", 10) + struct.pack("<i", 4) + b"wiki"
    p = tmp_path / "m.dat"
    p.write_bytes(data)
    np.testing.assert_array_equal(load_imatrix(p)["blk.0.attn_q.weight"], v / 3)


@pytest.mark.parametrize("case,msg", [
    ("truncated", "truncated"), ("empty", "neither a GGUF"), ("negative", "finite and >= 0"),
    ("mismatch", "do not match"),
])
def test_imatrix_refusals(tmp_path, case, msg):
    p = tmp_path / "m.dat"
    if case == "truncated":
        name = b"x.weight"
        p.write_bytes(struct.pack("<i", 1) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 1, 100))
    elif case == "empty":
        p.write_bytes(struct.pack("<i", 0))
    elif case == "negative":
        name = b"x.weight"
        p.write_bytes(struct.pack("<i", 1) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 1, 2)
                      + np.array([1.0, -1.0], np.float32).tobytes())
    elif case == "mismatch":
        p = write_imatrix_gguf(tmp_path / "m.gguf", {"a.weight": np.ones(9, np.float32)},
                               {"a.weight": np.array([1.0, 1.0])})
    with pytest.raises(ConvertError, match=msg):
        load_imatrix(p)


def test_imatrix_for_another_model_is_refused(checkpoints, tmp_path):
    ckpt = checkpoints["w256_e8"]
    p = write_imatrix_gguf(tmp_path / "m.gguf", {"blk.0.ffn_up_exps.weight": np.ones(7 * 3, np.float32)},
                           {"blk.0.ffn_up_exps.weight": np.ones(3)})
    r = subprocess.run([sys.executable, "-m", "clover_cpu", "convert", str(ckpt), "-o", str(tmp_path / "o.gguf"),
                        "--type", "iq4_xs", "--imatrix", str(p), "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "made for another model" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o.gguf").exists()
