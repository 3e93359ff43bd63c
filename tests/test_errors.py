"""Bad input raises ValueError with a message that says what is wrong; nothing crashes."""

import numpy as np
import pytest

from clover_cpu import _core, kernels


@pytest.fixture
def wq(rng):
    return kernels.quantize(rng.standard_normal((8, 256)).astype(np.float32), "q4_k")


def test_wrong_dtype(wq):
    with pytest.raises(ValueError, match="float32"):
        kernels.matmul(np.zeros((2, 256), np.float64), wq, "q4_k")
    with pytest.raises(ValueError, match="uint8"):
        kernels.matmul(np.zeros((2, 256), np.float32), wq.view(np.int8), "q4_k")
    with pytest.raises(ValueError, match="float32"):
        kernels.quantize(np.zeros((2, 256), np.int32), "q8_0")


def test_non_contiguous(wq):
    x = np.zeros((256, 4), np.float32).T
    with pytest.raises(ValueError, match="contiguous"):
        kernels.matmul(x, wq, "q4_k")
    with pytest.raises(ValueError, match="contiguous"):
        kernels.quantize(np.zeros((4, 512), np.float32)[:, ::2], "q8_0")


def test_shapes(wq):
    with pytest.raises(ValueError, match="columns"):
        kernels.matmul(np.zeros((2, 512), np.float32), wq, "q4_k")
    with pytest.raises(ValueError, match="2-D"):
        kernels.matmul(np.zeros(256, np.float32), wq, "q4_k")
    with pytest.raises(ValueError, match="whole number"):
        kernels.matmul(np.zeros((2, 256), np.float32), np.ascontiguousarray(wq[:, :100]), "q4_k")


def test_unknown_format(wq):
    with pytest.raises(ValueError, match="unknown format 'q3_z'"):
        kernels.matmul(np.zeros((2, 256), np.float32), wq, "q3_z")
    with pytest.raises(ValueError, match="unknown format"):
        kernels.quantize(np.zeros((2, 256), np.float32), "int4")


def test_k_not_block_multiple():
    with pytest.raises(ValueError, match="multiple of the q4_k block size 256"):
        kernels.quantize(np.zeros((2, 100), np.float32), "q4_k")
    with pytest.raises(ValueError, match="multiple of the q8_0 block size 32"):
        kernels.quantize(np.zeros((2, 33), np.float32), "q8_0")


def test_unknown_isa(wq):
    with pytest.raises(ValueError, match="not available"):
        kernels.matmul(np.zeros((2, 256), np.float32), wq, "q4_k", isa="sparc")


def test_moe_bad_inputs(rng):
    g = kernels.quantize(rng.standard_normal((4 * 256, 256)).astype(np.float32), "q8_0").reshape(4, 256, -1)
    d = g.copy()
    x = np.zeros((2, 256), np.float32)
    w = np.full((2, 2), 0.5, np.float32)
    with pytest.raises(ValueError, match="out of range"):
        kernels.moe(x, np.array([[0, 4], [1, 2]], np.int32), w, g, g, d, "q8_0")
    with pytest.raises(ValueError, match="out of range"):
        kernels.moe(x, np.array([[0, -1], [1, 2]], np.int32), w, g, g, d, "q8_0")
    with pytest.raises(ValueError, match="int32"):
        kernels.moe(x, np.array([[0, 1], [1, 2]], np.int64), w, g, g, d, "q8_0")
    with pytest.raises(ValueError, match="top_k"):
        kernels.moe(x, np.array([[0, 1, 2], [1, 2, 3]], np.int32), w, g, g, d, "q8_0")
    with pytest.raises(ValueError, match="3-D"):
        kernels.moe(x, np.array([[0, 1], [1, 2]], np.int32), w, g[0], g, d, "q8_0")


def test_negative_threads():
    with pytest.raises(ValueError, match="threads"):
        _core.set_num_threads(-1)
