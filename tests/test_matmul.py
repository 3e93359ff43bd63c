"""Quantized matrix products: every ISA against the scalar path and against a float64 reference."""

import numpy as np
import pytest

import clover_cpu
from clover_cpu import kernels

from conftest import check_close, int8_exact

ISAS = clover_cpu.system_info()["available_isas"]
SIMD_ISAS = [i for i in ISAS if i != "ref"]
FORMATS = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"]
BLOCK = {f: kernels.FORMATS[f]["block_size"] for f in FORMATS}

# vs float64 on the dequantized weights: float formats see rounding only; integer formats also see
# the int8 quantization of the activations (relative to the largest output).
TOL_FLOAT64 = {"f32": 1e-5, "f16": 1e-5, "bf16": 1e-5, "q8_0": 3e-2, "q4_0": 3e-2, "q4_k": 3e-2, "q5_k": 3e-2, "q6_k": 3e-2}
# SIMD vs scalar: the same integer block dots, only the float summation order differs.
TOL_VS_REF = 2e-5
# From this many tokens AVX-512's q5_K products expand each thread's rows to bytes (csrc/kernels_avx512.cpp)
Q5_BYTES_FROM = 16


def make(rng, fmt, n, k, scale=1.0):
    w = (rng.standard_normal((n, k)) * scale).astype(np.float32)
    q = kernels.quantize(w, fmt)
    return q, kernels.dequantize(q, fmt).astype(np.float64)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 33])
def test_matmul_vs_float64(fmt, m, rng):
    k = 2 * 256
    q, wd = make(rng, fmt, 19, k)  # 19 rows: not a multiple of any tile
    x = rng.standard_normal((m, k)).astype(np.float32)
    want = x.astype(np.float64) @ wd.T
    for isa in ISAS:
        check_close(kernels.matmul(x, q, fmt, isa=isa), want, TOL_FLOAT64[fmt], f"{fmt} {isa} M={m}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 4, 7, 64, 130])
def test_simd_equals_scalar(fmt, m, rng):
    if not SIMD_ISAS:
        pytest.skip("no SIMD path on this machine")
    k = 4 * 256
    q, wd = make(rng, fmt, 37, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ref = kernels.matmul(x, q, fmt, isa="ref")
    for isa in SIMD_ISAS:
        if int8_exact(isa, m, fmt):
            check_close(kernels.matmul(x, q, fmt, isa=isa), ref, TOL_VS_REF, f"{fmt} {isa} vs ref M={m}")
        else:  # (bf16 AMX tiles)
            check_close(kernels.matmul(x, q, fmt, isa=isa), x.astype(np.float64) @ wd.T, TOL_FLOAT64[fmt],
                        f"{fmt} {isa} M={m}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_smallest_k_one_row(fmt, rng):
    k = BLOCK[fmt] if BLOCK[fmt] > 1 else 8
    q, wd = make(rng, fmt, 1, k)
    x = rng.standard_normal((1, k)).astype(np.float32)
    want = x.astype(np.float64) @ wd.T
    for isa in ISAS:
        check_close(kernels.matmul(x, q, fmt, isa=isa), want, TOL_FLOAT64[fmt], f"{fmt} {isa} K={k}")


@pytest.mark.parametrize("fmt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("k", [1, 7, 9, 31])
def test_float_formats_any_k(fmt, k, rng):
    q, wd = make(rng, fmt, 5, k)
    x = rng.standard_normal((3, k)).astype(np.float32)
    for isa in ISAS:
        check_close(kernels.matmul(x, q, fmt, isa=isa), x.astype(np.float64) @ wd.T, 1e-5, f"{fmt} {isa} K={k}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_adversarial(fmt, rng):
    k = 512
    for isa in ISAS:
        # all-zero weights and activations give exact zeros
        zq = kernels.quantize(np.zeros((6, k), np.float32), fmt)
        assert not kernels.matmul(rng.standard_normal((3, k)).astype(np.float32), zq, fmt, isa=isa).any()
        q, wd = make(rng, fmt, 6, k)
        assert not kernels.matmul(np.zeros((3, k), np.float32), q, fmt, isa=isa).any()
        # large values (weights ~1e3, activations ~1e4): relative error unchanged
        q, wd = make(rng, fmt, 6, k, scale=1e3)
        x = (rng.standard_normal((5, k)) * 1e4).astype(np.float32)
        check_close(kernels.matmul(x, q, fmt, isa=isa), x.astype(np.float64) @ wd.T, TOL_FLOAT64[fmt], f"{fmt} {isa} large")
        # one dominant activation per block, the rest tiny
        x = np.where(np.arange(k) % 32 == 5, 100.0, 1e-3 * rng.standard_normal((2, k))).astype(np.float32)
        check_close(kernels.matmul(x, q, fmt, isa=isa), x.astype(np.float64) @ wd.T, TOL_FLOAT64[fmt], f"{fmt} {isa} spiky")


def test_extreme_quants_no_overflow(rng):
    """Largest integer products the formats allow do not saturate the int16 pair sums."""
    k = 256
    x = np.full((2, k), 1.0, np.float32)
    x[1] = -1.0
    for fmt in ["q8_0", "q4_0", "q4_k", "q5_k", "q6_k"]:
        w = np.where(np.arange(k) % 2 == 0, 1.0, -1.0)[None, :].repeat(3, 0).astype(np.float32)
        w[1] = 1.0
        w[2] = -1.0
        q = kernels.quantize(w, fmt)
        want = x.astype(np.float64) @ kernels.dequantize(q, fmt).astype(np.float64).T
        for isa in ISAS:
            check_close(kernels.matmul(x, q, fmt, isa=isa), want, 1e-5, f"{fmt} {isa} extremes")


@pytest.mark.parametrize("m", [16, 23, 40])
def test_q5_k_many_tokens_extremes(m):
    """q5_K at its largest codes, scales and mins (31, 63, 63) against activations at +-127, over enough tokens
    for AVX-512's expanded rows (exact int32 sums per super-block there): no overflow, and every ISA within
    rounding of float64. 21 rows: a group of 16 and a part of one."""
    k, rows = 1024, 21
    blocks = np.zeros((rows, k // 256, 176), np.uint8)
    blocks[..., 0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)  # d
    blocks[..., 2:4] = np.frombuffer(np.float16(0.25).tobytes(), np.uint8)  # dmin
    blocks[..., 4:16] = 0xFF  # every scale and min 63
    blocks[::2, :, 16:] = 0xFF  # every code 31 (qh and qs all ones) on even rows, 0 on odd ones
    blocks[5, 1, 16:48] = 0x55  # a row with mixed fifth bits
    q = blocks.reshape(rows, -1)
    wd = kernels.dequantize(q, "q5_k").astype(np.float64)
    x = np.ones((m, k), np.float32)
    x[1::2] = -1.0
    x[2, ::3] = -1.0
    want = x.astype(np.float64) @ wd.T
    for isa in ISAS:
        check_close(kernels.matmul(x, q, "q5_k", isa=isa), want, 1e-5, f"q5_k {isa} M={m} extremes")


@pytest.mark.parametrize("k,m", [(64, 3), (512, 9)])  # (512, 9: AVX-512's lane tiles)
def test_q8_0_minus_128(rng, k, m):
    """A file may hold -128 in a Q8_0 block (the quantizer never writes it); the kernels must agree."""
    q = kernels.quantize(rng.standard_normal((2, k)).astype(np.float32), "q8_0")
    q[:, 2:34] = np.frombuffer(np.full(32, -128, np.int8).tobytes(), np.uint8)
    wd = kernels.dequantize(q, "q8_0").astype(np.float64)
    x = np.full((m, k), 127.0, np.float32)
    x[1::2] = -127.0
    for isa in ISAS:
        check_close(kernels.matmul(x, q, "q8_0", isa=isa), x.astype(np.float64) @ wd.T, 1e-5, f"q8_0 {isa} -128")


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k", "q8_0", "q4_0"])
@pytest.mark.parametrize("m", [9, 19])
def test_row_results_do_not_depend_on_their_group(fmt, m, rng):
    # The lane-layout tiles reduce rows eight at a time; a row's result must not depend on its place in
    # that group (or tasks and chunks would change results): the rows of W[s:] start s places earlier.
    # 19 tokens make several token groups on every ISA.
    q, _ = make(rng, fmt, 40, 1024)
    x = rng.standard_normal((m, 1024)).astype(np.float32)
    for isa in ISAS:
        whole = kernels.matmul(x, q, fmt, isa=isa)
        for s in range(1, 8):
            np.testing.assert_array_equal(kernels.matmul(x, q[s:], fmt, isa=isa), whole[:, s:], f"{isa} from row {s}")


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k"])
def test_avx2_lane_tiles_equal_avxvnni(fmt, rng):
    # Both tables run kernel_lanes256.h's tiles from 4 tokens (AVX-VNNI from 2; AVX2 takes its one-row
    # register tiles up to 3 tokens of q4_K / q5_K, which sum in another order), AVX2 chaining vpmaddubsw
    # int16 sums where AVX-VNNI has vpdpbusd: the integer sums and their order of use are the same, so the
    # results are bit-identical. Extreme weights and activations (q4 0/15, q5 0/31, q6 0/63, q8_K +-127)
    # check the chains never saturate.
    if not {"avx2", "avxvnni"} <= set(ISAS):
        pytest.skip("needs both the avx2 and avxvnni tables")
    q, _ = make(rng, fmt, 37, 2048)
    xs = [rng.standard_normal((m, 2048)).astype(np.float32) for m in (4, 7, 19)]
    w = np.where(np.arange(2048) % 3 == 0, 1.0, -1.0)[None, :].repeat(9, 0).astype(np.float32)
    w[::2] *= -1
    qe = kernels.quantize(w, fmt)
    xe = np.where(np.arange(2048) % 5 == 0, -1.0, 1.0)[None, :].repeat(4, 0).astype(np.float32)
    xe[1] *= -1
    for wq, x in [(q, x) for x in xs] + [(qe, xe)]:
        np.testing.assert_array_equal(kernels.matmul(x, wq, fmt, isa="avx2"), kernels.matmul(x, wq, fmt, isa="avxvnni"))


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k", "q8_0", "q4_0"])
@pytest.mark.parametrize("m", [9, 19])
def test_threads_do_not_change_results(fmt, m, rng):
    q, _ = make(rng, fmt, 203, 1024)
    x = rng.standard_normal((m, 1024)).astype(np.float32)
    before = clover_cpu.system_info()["threads"]
    try:
        clover_cpu.set_num_threads(1)
        one = kernels.matmul(x, q, fmt)
        clover_cpu.set_num_threads(3)
        three = kernels.matmul(x, q, fmt)
    finally:
        clover_cpu.set_num_threads(before)
    np.testing.assert_array_equal(one, three)  # rows are split across threads, never a dot product


def test_large_m_and_n(rng):
    q, wd = make(rng, "q4_0", 300, 256)
    x = rng.standard_normal((512, 256)).astype(np.float32)
    check_close(kernels.matmul(x, q, "q4_0"), x.astype(np.float64) @ wd.T, 3e-2, "q4_0 M=512")


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k", "q8_0", "q4_0"])
@pytest.mark.parametrize("rows,k,m", [(130, 16384, 19), (1500, 1024, 30)])
def test_kquant_tiles_span_row_chunks_and_token_groups(fmt, rows, k, m, rng):
    # One thread's task spans several L2-sized weight chunks (192 KB), so the first token group stores
    # each chunk's rows unpacked and the others load them, chunk by chunk.
    # - K = 16384: a row is 9-13 KB (130 rows over 4 tasks); K runs in blocks (k_block: one token's
    #   activations take 20-24 KB, too many for a whole group in L1, on any L1d up to 64 KB), the 19
    #   tokens in groups of equal size (AVX-512 q4_K 10 + 9, q6_K 7 + 7 + 5; AVX2 q4_K 5 + 5 + 5 + 4).
    # - K = 1024: groups sized to the whole K (up to 12 or 8 tokens on an L1d of 32 KB or more), evened
    #   out (30 tokens of q4_K: 10 + 10 + 10); 1500 rows are tasks of 384 rows, more than a chunk of
    #   180-341.
    if not SIMD_ISAS:
        pytest.skip("no SIMD path on this machine")
    q, _ = make(rng, fmt, rows, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ref = kernels.matmul(x, q, fmt, isa="ref")
    before = clover_cpu.system_info()["threads"]
    try:
        clover_cpu.set_num_threads(1)
        for isa in SIMD_ISAS:
            check_close(kernels.matmul(x, q, fmt, isa=isa), ref, TOL_VS_REF, f"{fmt} {isa} {rows}x{k} M={m}")
    finally:
        clover_cpu.set_num_threads(before)


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k", "q8_0", "q4_0"])
@pytest.mark.parametrize("k,m", [(4096, 5), (4096, 6), (4096, 8), (2048, 11)])
def test_kquant_tiles_one_group_past_the_l1_size(fmt, k, m, rng):
    # Up to 1.5x the L1-sized token group, the tokens run as one group of up to Kind::GROUP, with no rows
    # stored unpacked: on a 32 KB L1d 4 -> 5-6 tokens at K = 4096 and 8 -> 11 at 2048 (AVX-512 q4_K), on a
    # 48 KB one 6 -> 8 at K = 4096.
    if not SIMD_ISAS:
        pytest.skip("no SIMD path on this machine")
    q, wd = make(rng, fmt, 45, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ref = kernels.matmul(x, q, fmt, isa="ref")
    check_close(ref, x.astype(np.float64) @ wd.T, TOL_FLOAT64[fmt], f"{fmt} ref {k} M={m}")
    for isa in SIMD_ISAS:
        check_close(kernels.matmul(x, q, fmt, isa=isa), ref, TOL_VS_REF, f"{fmt} {isa} K={k} M={m}")


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k", "q8_0", "q4_0"])
@pytest.mark.parametrize("k,m", [(4096, 8), (4096, 32), (16384, 32)])
def test_kquant_tiles_cut_long_k_into_blocks(fmt, k, m, rng):
    # Where a whole group's activations would not fit in L1, its pass covers K one block at a time
    # and every row's partial sums carry over to the next block (k_block; at K = 16384 on any L1d
    # up to 64 KB, at 4096 on AVX-512 with a 32 KB one). A token's results do not depend on that:
    # they equal, bit for bit, those of another product on the same lane tiles with other groups: 8 tokens
    # (one group, whole K where 32 would be blocked) and 16 (the 8 twice). (Fewer tokens may take the
    # one-row register tiles, which sum in another order: AVX2 up to 3 tokens of q4_K / q5_K, 7 of q6_K.)
    # 8 tokens: one group (rows unpacked as they pass); 32: several (rows stored and reloaded).
    # (AVX-512's q5_K from Q5_BYTES_FROM tokens expands each thread's rows to bytes instead, one summation
    # order for any K and token count there: its 32 tokens are compared with 16-token slices, 8 with nothing.)
    if not SIMD_ISAS:
        pytest.skip("no SIMD path on this machine")
    q, wd = make(rng, fmt, 70, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    for isa in SIMD_ISAS:
        full = kernels.matmul(x, q, fmt, isa=isa)
        n = Q5_BYTES_FROM if fmt == "q5_k" and isa in ("avx512", "amx") else 8  # the slices' tokens
        if m == 8 and n == 8:
            twice = kernels.matmul(np.concatenate([x, x]), q, fmt, isa=isa)
            np.testing.assert_array_equal(full, twice[:8], err_msg=f"{fmt} {isa} K={k} 8 tokens against 16")
            np.testing.assert_array_equal(full, twice[8:], err_msg=f"{fmt} {isa} K={k} 8 tokens against 16")
        for t0 in sorted({0, 12, m - n}) if m > n else ():
            np.testing.assert_array_equal(full[t0:t0 + n], kernels.matmul(x[t0:t0 + n], q, fmt, isa=isa),
                                          err_msg=f"{fmt} {isa} K={k} tokens {t0}..{t0 + n - 1}")
        check_close(full, x.astype(np.float64) @ wd.T, TOL_FLOAT64[fmt], f"{fmt} {isa} K={k} M={m}")


def test_empty_inputs(rng):
    q, _ = make(rng, "q4_k", 4, 256)
    assert kernels.matmul(np.zeros((0, 256), np.float32), q, "q4_k").shape == (0, 4)


@pytest.mark.parametrize("m", [1, 3, 16, 33])
def test_matmul_many_equals_matmul(m, rng):
    # every format (three activation formats), large and tiny matrices, one call: bit-equal products
    ws = [(make(rng, f, n, 512)[0], f) for f, n in
          [("q4_k", 1100), ("q6_k", 16), ("q8_0", 40), ("f32", 3), ("q4_0", 300), ("f16", 64), ("q4_k", 1)]]
    x = rng.standard_normal((m, 512)).astype(np.float32)
    for isa in ISAS:
        got = kernels.matmul_many(x, ws, isa=isa)
        assert len(got) == len(ws)
        for y, (w, f) in zip(got, ws):
            np.testing.assert_array_equal(y, kernels.matmul(x, w, f, isa=isa), err_msg=f"{isa} {f} m={m}")
    assert kernels.matmul_many(x, []) == []


def test_matmul_many_bad_input(rng):
    q, _ = make(rng, "q4_k", 8, 256)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    with pytest.raises(ValueError, match="columns"):
        kernels.matmul_many(x, [(q, "q4_k"), (make(rng, "q4_k", 8, 512)[0], "q4_k")])
    with pytest.raises(ValueError, match="not an array"):
        kernels.matmul_many(x, [("weights", "q4_k")])
    with pytest.raises(ValueError):
        kernels.matmul_many(x, [(q, "q9_9")])
    with pytest.raises(ValueError, match="float32"):
        kernels.matmul_many(x.astype(np.float64), [(q, "q4_k")])


@pytest.mark.parametrize("kind,block", [("q8_a", 32), ("q8_K", 256)])
def test_activation_quantizer_nonfinite_blocks(kind, block, rng):
    # a block holding NaN or Inf: scale NaN, quants (and sums) 0 on both paths, so products with it are NaN
    # (int8 quants would carry finite garbage on); the other blocks as usual
    from clover_cpu import _core

    x = rng.standard_normal((2, 4 * block)).astype(np.float32)
    x[0, block + 7] = np.nan
    x[0, 2 * block] = np.inf
    x[1, 4 * block - 1] = -np.inf
    size = 36 if kind == "q8_a" else 292
    got = {simd: _core.quantize_acts(x, kind, simd).reshape(2, 4, size) for simd in (True, False)}
    np.testing.assert_array_equal(got[True], got[False])
    q = got[True]
    d = q[:, :, :4].copy().view(np.float32)[:, :, 0]
    bad = np.zeros((2, 4), bool)
    bad[0, 1] = bad[0, 2] = bad[1, 3] = True
    assert np.isnan(d[bad]).all() and np.isfinite(d[~bad]).all() and (d[~bad] > 0).all()
    assert not q[bad][:, 4:].any()  # quants and (q8_K) sub-block sums all 0
    assert q[~bad][:, 4 : 4 + block].any()
    # through a product, every ISA (the q4_k one also repacked): a row that meets such a block is NaN, a
    # finite row stays finite
    fmt = "q8_0" if kind == "q8_a" else "q4_k"
    w, _ = make(rng, fmt, 32, 4 * block)
    xs = np.vstack([x, np.ones((1, 4 * block), np.float32)])
    for isa in ISAS:
        for ww, f in [(w, fmt)] + ([(kernels.repack_r16([w], "q4_k")[0], "q4_k_r16")] if fmt == "q4_k" else []):
            y = kernels.matmul(xs, ww, f, isa=isa)
            assert np.isnan(y[:2]).all() and np.isfinite(y[2]).all(), (isa, f)


@pytest.mark.parametrize("kind,block", [("q8_a", 32), ("q8_K", 256)])
def test_activation_quantizer_simd_equals_scalar(kind, block, rng):
    # the kernels' activation quantizer: the AVX2 twin (where present) gives the scalar one's bytes
    from clover_cpu import _core

    x = rng.standard_normal((6, 4 * block)).astype(np.float32) * 3
    x[0, :block] = 0.0  # an all-zero block (scale 0)
    x[0, 3 * block :] = np.where(np.arange(block) % 2, 1e-37, -2e-38)  # a scale whose inverse overflows
    x[1, 5] = 3e38  # a huge value
    x[2, :block] = -1e-30  # tiny values
    ties = np.arange(block, dtype=np.float32) - block / 2 + 0.5  # exact halves after scaling by 1
    ties[0] = 127.0  # amax 127: d = 1, so every value lands on a tie (round half to even)
    x[3, :block] = ties
    x[4] *= 1e4
    x[5, block : 2 * block] = -x[5, block : 2 * block]
    for simd in (True, False):
        assert _core.quantize_acts(x, kind, simd).shape == (6, 4 * (36 if kind == "q8_a" else 292))
    np.testing.assert_array_equal(_core.quantize_acts(x, kind, True), _core.quantize_acts(x, kind, False))
    # every value within +-127 (the products' int16 chains count on it); the overflowing block quantizes to 0
    size = 36 if kind == "q8_a" else 292
    qs = _core.quantize_acts(x, kind, True).reshape(6, 4, size)[:, :, 4 : 4 + block].view(np.int8)
    assert qs.min() >= -127 and qs.max() <= 127
    assert not qs[0, 3].any()
