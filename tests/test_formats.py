"""Block formats: byte-exact against gguf.quants where it quantizes, same floats where it dequantizes."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq

from clover_cpu import kernels

GGUF_TYPES = {
    "f32": GT.F32,
    "f16": GT.F16,
    "bf16": GT.BF16,
    "q8_0": GT.Q8_0,
    "q4_0": GT.Q4_0,
    "q4_k": GT.Q4_K,
    "q5_k": GT.Q5_K,
    "q6_k": GT.Q6_K,
}
# Round-trip RMSE relative to the input RMS for Gaussian data (measured ~0.003 / 0.1 / 0.03 ...).
RMSE_TOL = {"f32": 0.0, "f16": 1e-3, "bf16": 5e-3, "q8_0": 0.01, "q4_0": 0.15, "q4_k": 0.12, "q5_k": 0.06, "q6_k": 0.03}


def inputs(rng, k):
    """Random and adversarial rows: gaussian, zeros, one outlier, huge, tiny, constant, negative-only."""
    rows = [
        rng.standard_normal(k),
        np.zeros(k),
        np.where(np.arange(k) == 3, 50.0, rng.standard_normal(k) * 0.01),
        rng.standard_normal(k) * 1e4,
        rng.standard_normal(k) * 1e-6,
        np.full(k, 0.75),
        -np.abs(rng.standard_normal(k)),
        rng.uniform(-1, 1, k) ** 3,
    ]
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "bf16", "f16", "f32"])
@pytest.mark.parametrize("k", [256, 2048])
def test_bytes_equal_gguf_quantize(fmt, k, rng):
    x = inputs(rng, k)
    ours = kernels.quantize(x, fmt)
    ref = gq.quantize(x, GGUF_TYPES[fmt]).reshape(ours.shape[0], -1).view(np.uint8)
    assert ours.shape == ref.shape
    mismatch = np.argwhere(ours != ref)
    assert mismatch.size == 0, f"{fmt}: {len(mismatch)} bytes differ, first at {mismatch[:3].tolist()}"


@pytest.mark.parametrize("fmt", list(GGUF_TYPES))
def test_dequantize_equals_gguf(fmt, rng):
    x = inputs(rng, 512)
    q = kernels.quantize(x, fmt)
    ours = kernels.dequantize(q, fmt)
    ref = gq.dequantize(q, GGUF_TYPES[fmt]).reshape(ours.shape)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("fmt", list(GGUF_TYPES))
def test_roundtrip_error(fmt, rng):
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    y = kernels.dequantize(kernels.quantize(x, fmt), fmt)
    rel = np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x**2))
    assert rel <= RMSE_TOL[fmt], f"{fmt}: relative RMSE {rel:.4f} > {RMSE_TOL[fmt]}"
    # all-zero input stays exactly zero
    z = kernels.dequantize(kernels.quantize(np.zeros((2, 256), np.float32), fmt), fmt)
    assert not z.any()


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k"])
def test_kquant_block_layout(fmt, rng):
    """Reference quantizer properties: scales fit their bit widths and the fp16 d/dmin are finite."""
    x = inputs(rng, 256)
    q = kernels.quantize(x, fmt)
    assert q.shape == (x.shape[0], kernels.FORMATS[fmt]["block_bytes"])
    y = kernels.dequantize(q, fmt)
    assert np.isfinite(y).all()
    # a row that is one constant is reproduced closely by a min/scale format
    np.testing.assert_allclose(y[5], x[5], rtol=0.02)


def test_f16_special_values():
    vals = np.array(
        [0.0, -0.0, 1.0, 65504.0, 65519.0, 65520.0, 1e6, 6.1e-5, 5.96e-8, 2.98e-8, 3e-8, 1e-10, np.inf, -np.inf],
        dtype=np.float32,
    )
    ours = kernels.quantize(vals[None, :], "f16")[0].view(np.uint16)
    with np.errstate(over="ignore"):
        want = vals.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(ours, want)
    nan = kernels.quantize(np.array([[np.nan]], np.float32), "f16").view(np.float16)
    assert np.isnan(nan).all()


def test_f16_all_halves_roundtrip():
    """Every finite fp16 value survives fp16 -> f32 -> fp16 unchanged; midpoints round to even."""
    h = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h)]
    f = h.astype(np.float32)[None, :]
    np.testing.assert_array_equal(kernels.quantize(f, "f16").view(np.uint16)[0], h.view(np.uint16))
    np.testing.assert_array_equal(kernels.dequantize(kernels.quantize(f, "f16"), "f16")[0], f[0])
    mid = (h[:-1].astype(np.float64) + h[1:].astype(np.float64)) / 2
    mid32 = mid.astype(np.float32)[None, :]
    np.testing.assert_array_equal(
        kernels.quantize(mid32, "f16").view(np.uint16)[0], mid32[0].astype(np.float16).view(np.uint16)
    )


def test_row_bytes_table():
    assert kernels.row_bytes("q4_k", 2048) == 8 * 144
    assert kernels.row_bytes("q6_k", 256) == 210
    assert kernels.row_bytes("q8_0", 64) == 68
    assert kernels.row_bytes("q4_0", 32) == 18
    assert kernels.row_bytes("bf16", 3) == 6
    with pytest.raises(ValueError):
        kernels.row_bytes("q4_k", 100)


@pytest.mark.parametrize("fmt,block_bytes", [("q4_k", 144), ("q5_k", 176), ("q6_k", 210)])
def test_fast_kquant_search_matches_reference(fmt, block_bytes, rng):
    """The SIMD twin of ggml's search picks the same quants except in rare near-ties."""
    from clover_cpu import _core

    x = rng.standard_normal((256, 1024)).astype(np.float32)
    try:
        _core.set_fast_quant_search(False)
        ref = kernels.quantize(x, fmt)
    finally:
        _core.set_fast_quant_search(True)
    fast = kernels.quantize(x, fmt)
    same = (ref.reshape(-1, block_bytes) == fast.reshape(-1, block_bytes)).all(1).mean()
    assert same >= 0.95, f"only {same:.3f} of the blocks are identical"
    e_ref = np.sqrt(np.mean((kernels.dequantize(ref, fmt) - x) ** 2))
    e_fast = np.sqrt(np.mean((kernels.dequantize(fast, fmt) - x) ** 2))
    assert e_fast <= e_ref * 1.001, f"fast search error {e_fast} vs reference {e_ref}"


def test_quantize_from_f16_and_bf16(rng):
    x = rng.standard_normal((8, 512)).astype(np.float32)
    h = x.astype(np.float16)
    np.testing.assert_array_equal(kernels.quantize(h, "q4_k"), kernels.quantize(h.astype(np.float32), "q4_k"))
    b = kernels.quantize(x, "bf16").view(np.uint16)
    wide = (b.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(kernels.quantize(b, "q8_0", bf16=True), kernels.quantize(wide, "q8_0"))
    with pytest.raises(ValueError, match="uint16"):
        kernels.quantize(x, "q8_0", bf16=True)
