"""The Q2_K .. Q6_K, IQ4_NL, IQ4_XS, Q4_0, Q4_1, Q5_0 and Q5_1 quantizers (csrc/quants_kquant_low.cpp,
csrc/quants.cpp, csrc/quants_lowbit.cpp) write llama.cpp b11434's bytes:
tests/data/ggml_quants_b11434.npz holds ggml_quantize_chunk's output on fixed rows (ordinary weights,
outliers, tiny and graded magnitudes, constant rows, zeros, sparse and one-signed rows), without and with an
importance matrix, made by bench/native/ggml_quantize_fixture.py from llama.cpp's own libggml-base; every
case must match byte for byte, through the threaded row chunks and the bf16 input path too. The dequantized
rows are near the input where the fp16 scales can hold them."""

import os

import numpy as np
import pytest

from clover_cpu import kernels

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "ggml_quants_b11434.npz")
TYPES = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "q4_0", "q4_1", "q5_0", "q5_1"]
CASES = ["gauss", "outliers", "tiny", "const", "zeros", "sparse"]
BF16_CASES = ["outliers", "tiny", "sparse"]  # rows that hold bf16 values
# relative RMS error of the dequantized rows (Gaussian-like rows sit near 0.30, 0.16, 0.08, 0.08)
REL_RMS = {"q2_k": 0.40, "q3_k": 0.20, "q4_k": 0.13, "q5_k": 0.07, "q6_k": 0.05, "iq4_nl": 0.13, "iq4_xs": 0.13,
           "q4_0": 0.15, "q4_1": 0.13, "q5_0": 0.12, "q5_1": 0.07}


@pytest.fixture(scope="module", autouse=True)
def reference_search():
    """ggml's own search for the plain q4_K / q5_K / q6_K quantizers (clover-cpu's default is a SIMD twin of
    it, which picks other quants in rare near-ties: tests/test_formats.py); the importance-matrix paths take
    no search of that kind."""
    from clover_cpu import _core

    _core.set_fast_quant_search(False)
    yield
    _core.set_fast_quant_search(True)


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE) as d:
        return {k: d[k] for k in d.files}


def case_id(t, case, imatrix):
    return f"{t}_{case}" + ("_imatrix" if imatrix else "")


def quantize_case(fx, t, case, imatrix):
    return kernels.quantize(fx[f"x_{case}"], t, imatrix=fx[f"imatrix_{case}"] if imatrix else None)


def assert_bytes_equal(ours, ref, what):
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != ggml's {ref.shape}"
    bad = np.argwhere(ours != ref)
    assert len(bad) == 0, (f"{what}: {len(bad)} bytes differ from ggml's, in rows {sorted(set(bad[:, 0].tolist()))}; "
                           f"first at row {bad[0][0]} byte {bad[0][1]}: ours {ours[tuple(bad[0])]}, "
                           f"ggml {ref[tuple(bad[0])]}")


def test_fixture_complete(fixture):
    assert str(fixture["source"]).startswith("llama.cpp b11434")
    for case in CASES:
        assert fixture[f"x_{case}"].shape == (6, 1024) and fixture[f"x_{case}"].dtype == np.float32
        assert (fixture[f"imatrix_{case}"] > 0).all()
        for t in TYPES:
            for im in (False, True):
                assert fixture[case_id(t, case, im)].shape == (6, kernels.row_bytes(t, 1024))


@pytest.mark.parametrize("imatrix", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("t", TYPES)
def test_bytes_equal_ggml(fixture, t, case, imatrix):
    ours = quantize_case(fixture, t, case, imatrix)
    assert_bytes_equal(ours, fixture[case_id(t, case, imatrix)], case_id(t, case, imatrix))


@pytest.mark.parametrize("t", TYPES)
def test_bytes_equal_ggml_threaded(fixture, t):
    """Many rows: py_quantize splits them into chunks on the worker threads, each row on its own."""
    reps = 40  # 240 rows of 1024: several chunks of 64 rows
    for im in (False, True):
        x = np.tile(fixture["x_gauss"], (reps, 1))
        ours = kernels.quantize(x, t, imatrix=fixture["imatrix_gauss"] if im else None)
        assert_bytes_equal(ours, np.tile(fixture[case_id(t, "gauss", im)], (reps, 1)), case_id(t, "gauss", im))


@pytest.mark.parametrize("t", TYPES)
def test_bf16_input_with_imatrix(fixture, t):
    """bf16 rows (uint16 bits, widened on the workers) quantize as their float32 values."""
    for case in BF16_CASES:
        x = fixture[f"x_{case}"]
        bits = (x.view(np.uint32) >> 16).astype(np.uint16)
        assert np.array_equal((bits.astype(np.uint32) << 16).view(np.float32), x)
        for im in (False, True):
            ours = kernels.quantize(bits, t, bf16=True, imatrix=fixture[f"imatrix_{case}"] if im else None)
            assert_bytes_equal(ours, fixture[case_id(t, case, im)], case_id(t, case, im) + " (bf16 input)")


@pytest.mark.parametrize("imatrix", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("t", TYPES)
def test_dequantized_near_input(fixture, t, imatrix):
    for case in CASES:
        x = fixture[f"x_{case}"].astype(np.float64)
        y = kernels.dequantize(quantize_case(fixture, t, case, imatrix), t).astype(np.float64)
        assert np.isfinite(y).all()
        # never further from a value than the row's largest magnitude (all-zero output for rows whose fp16
        # scales underflow); the formats with a min (q5_K, q4_1, q5_1) keep it in fp16, which goes subnormal on
        # "tiny"'s 1e-5 row, where ggml's own bytes (equal to ours) land up to 1.6x that far: for them the rows
        # with scales well inside fp16's range
        near = np.abs(y - x).max(1) <= np.abs(x).max(1)
        if t in ("q5_k", "q4_1", "q5_1"):
            near |= np.sqrt(np.mean(x ** 2, axis=1)) <= 1e-4
        assert near.all(), case
        rms = np.sqrt(np.mean(x ** 2, axis=1))
        live = rms > 1e-4  # scales well inside fp16's range
        rel = np.sqrt(np.mean((y - x) ** 2, axis=1))[live] / rms[live]
        assert (rel <= REL_RMS[t]).all(), f"{case_id(t, case, imatrix)}: relative RMS errors {rel}"
        assert (y[~x.any(axis=1)] == 0).all()  # zero rows stay zero


def test_imatrix_errors(fixture):
    x = fixture["x_gauss"]
    with pytest.raises(ValueError, match="takes no importance matrix"):
        kernels.quantize(x, "q8_0", imatrix=fixture["imatrix_gauss"])
    with pytest.raises(ValueError, match="imatrix has 512 values for rows of 1024"):
        kernels.quantize(x, "q2_k", imatrix=fixture["imatrix_gauss"][:512].copy())
    with pytest.raises(ValueError, match="float32"):
        kernels.quantize(x, "q3_k", imatrix=fixture["imatrix_gauss"].astype(np.float64))
    with pytest.raises(ValueError, match="1-D"):
        kernels.quantize(x, "iq4_xs", imatrix=fixture["imatrix_gauss"].reshape(2, 512))
    # None is the plain quantizer
    assert_bytes_equal(kernels.quantize(x, "iq4_nl", imatrix=None), fixture["iq4_nl_gauss"], "iq4_nl_gauss")
