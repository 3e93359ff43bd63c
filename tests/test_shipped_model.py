"""The small Clover that ships in the package (made by train/train_clover.py): it is found without -m; the
runtime's logits on it equal the training script's own PyTorch model on the same weights (a second,
independent check of the forward pass and of block-causal attention); and the runtime's greedy
block-diffusion decoding gives the tokens of a slow PyTorch reference decoder that recomputes the whole
sequence at every step (no caches, no fused commit)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import check_close

import clover_cpu
from clover_cpu.commands.run import shipped_model

SCRIPT = Path(__file__).resolve().parent.parent / "train" / "train_clover.py"
PROMPTS = [
    "def fibonacci(n):\n",
    "class Stack:\n    def __init__(self):\n",
    "import os\n\n\ndef list_files(path):\n",
    "def _deepcopy_tuple(x, memo, deepcopy=deepcopy):\n",
    "    def __repr__(self):\n",
    "for i in range(10):\n    if i % 2 == 0:\n",
]


def test_model_ships():
    path = shipped_model()
    assert path is not None, "no GGUF under clover_cpu/models: run train/train_clover.py and copy it there"
    assert path.stat().st_size <= 20e6
    m = clover_cpu.load(path)
    assert m.config.arch == "clover" and m.config.block_length >= 1 and 0 < m.config.threshold <= 1
    assert m.detokenize(m.tokenize("def f(x):\n    return x\n")) == "def f(x):\n    return x\n"


@pytest.fixture(scope="module")
def tc():
    spec = importlib.util.spec_from_file_location("train_clover", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def pt(tc):
    """The PyTorch model with the shipped file's weights (dequantized)."""
    torch.set_num_threads(2)
    return tc.import_gguf(shipped_model())


@pytest.fixture(scope="module")
def f32(tc, pt, tmp_path_factory):
    """The same weights as an F32 file (no weight or activation quantization in the runtime)."""
    from clover_cpu.convert.hf import convert

    d = tmp_path_factory.mktemp("shipped")
    tc.export(pt, pt.tokenizer_bytes, d / "hf")
    convert(d / "hf", d / "m.gguf", out_type="f32", log=lambda s: None, progress=False)
    return clover_cpu.load(d / "m.gguf", kv_type="f32")


def ids_of(m, n_blocks=6):
    """The prompts' tokens, cut or padded (by repetition) to whole blocks."""
    B = m.config.block_length
    ids = sum((m.tokenize(p) for p in PROMPTS), [])
    return np.array(ids[: n_blocks * B], np.int64)


def test_logits_match_pytorch(pt, f32):
    ids = ids_of(f32)
    B = f32.config.block_length
    with torch.no_grad():
        want = pt(torch.from_numpy(ids)[None], "block", B)[0].numpy()
    check_close(f32.forward(ids), want, 1e-4, "F32 file, block-causal forward")
    # the shipped Q8_0 file itself: activations are quantized to 8 bits on the fly, so only close
    got = clover_cpu.load(shipped_model(), kv_type="f32").forward(ids)
    check_close(got, want, 5e-2, "shipped Q8_0 file")
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_decoding_matches_reference(tc, pt, f32, prompt):
    ids = f32.tokenize(prompt)
    threshold = f32.config.threshold
    want = tc.reference_decode(pt, ids, 24, threshold)
    got = f32.generate_text(ids, max_new_tokens=24)
    assert got["token_ids"] == want
    assert got["forwards"] >= 1
