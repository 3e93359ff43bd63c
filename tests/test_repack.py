"""q4_k, q3_k, q2_k, q5_k, q6_k, iq4_xs, iq3_xxs, iq3_s, iq4_nl and mxfp4 weights repacked at load into groups of
16 rows (formats "q4_k_r16", "q3_k_r16", "q2_k_r16", "q5_k_r16", "q6_k_r16", "iq4_xs_r16", "iq3_xxs_r16",
"iq3_s_r16", "iq4_nl_r16", "mxfp4_r16", csrc/formats.h): the
same weights, the reference kernel's results bit for bit,
every ISA's within rounding, the model's forward with and without it."""

import mmap
import os

import numpy as np
import pytest

import clover_cpu
from clover_cpu import kernels

from conftest import check_close, int8_exact

ISAS = clover_cpu.system_info()["available_isas"]
TOL_VS_REF = 2e-5  # the same integer sums; the float work in another order


# bytes per row and super-block, repacked (144, 110, 84, 176, 210, 136, 98, 110, 144, 136 in the file)
SHARE = {"q4_k": 148, "q3_k": 114, "q2_k": 84, "q5_k": 180, "q6_k": 210, "iq4_xs": 138, "iq3_xxs": 138, "iq3_s": 138,
         "iq4_nl": 144, "mxfp4": 136}
BLOCK = {"iq3_xxs": 98, "iq3_s": 110}  # (raw blocks: no quantizer here; the fp16 d first)
FORMATS = list(SHARE)


def mxfp4_blocks(rng, rows, k, exponents=(118, 130)):
    """Raw mxfp4 rows (no quantizer here): every code, E8M0 exponents drawn from [lo, hi)."""
    raw = rng.integers(0, 256, (rows, k // 32, 17), dtype=np.uint8)
    raw[:, :, 0] = rng.integers(*exponents, (rows, k // 32))
    return np.ascontiguousarray(raw.reshape(rows, -1))


def quant(rng, rows, k, fmt="q4_k", scale=1.0):
    if fmt == "mxfp4":
        return mxfp4_blocks(rng, rows, k, (118 + int(np.log2(scale)), 130 + int(np.log2(scale))))
    if fmt in BLOCK:  # raw blocks: every grid index, sign and scale, d ~ 0.01 scale
        raw = rng.integers(0, 256, (rows, k // 256, BLOCK[fmt]), dtype=np.uint8)
        d = (np.abs(rng.standard_normal((rows, k // 256, 1))) * 0.01 * scale).astype(np.float16)
        raw[:, :, :2] = d.view(np.uint8)
        return np.ascontiguousarray(raw.reshape(rows, -1))
    return kernels.quantize((rng.standard_normal((rows, k)) * scale).astype(np.float32), fmt)


def q4k(rng, rows, k, scale=1.0):
    return quant(rng, rows, k, "q4_k", scale)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,k", [(16, 256), (48, 768), (512, 2048)])
def test_repack_is_lossless(rows, k, fmt, rng):
    q = quant(rng, rows, k, fmt)
    (r,) = kernels.repack_r16([q], fmt)
    assert r.dtype == np.uint8 and r.shape == (rows, k // 256 * SHARE[fmt])
    assert np.array_equal(kernels.dequantize(r, fmt + "_r16"), kernels.dequantize(q, fmt))
    # and the weights gguf's own dequantizer (llama.cpp's Python package) reads from the file's bytes
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    want = gq.dequantize(q, GGMLQuantizationType[fmt.upper()]).reshape(rows, k)
    assert np.array_equal(kernels.dequantize(r, fmt + "_r16"), want.astype(np.float32))
    # stacked experts keep their shape; several arrays share one buffer, each its own view
    e = quant(rng, 3 * 32, k, fmt).reshape(3, 32, -1)
    r2, r3 = kernels.repack_r16([q, e], fmt)
    assert r3.shape == (3, 32, k // 256 * SHARE[fmt]) and np.array_equal(r2, r)
    for i in range(3):
        assert np.array_equal(kernels.dequantize(np.ascontiguousarray(r3[i]), fmt + "_r16"),
                              kernels.dequantize(np.ascontiguousarray(e[i]), fmt))


def test_one_call_repacks_every_format(rng):
    ws = [quant(rng, 16 * (i + 1), 512, f) for i, f in enumerate(kernels.R16_FORMATS)]
    rs = kernels.repack_r16(ws, kernels.R16_FORMATS)
    for i, (f, w, r) in enumerate(zip(kernels.R16_FORMATS, ws, rs)):
        assert r.shape == (16 * (i + 1), 2 * SHARE[f])
        assert np.array_equal(kernels.dequantize(r, f + "_r16"), kernels.dequantize(w, f))
    with pytest.raises(ValueError, match="2 arrays but 1 formats"):
        kernels.repack_r16(ws[:2], ["q4_k"])
    with pytest.raises(ValueError, match="takes q4_k, q3_k, q2_k, q5_k, q6_k, iq4_xs, iq3_xxs, iq3_s, iq4_nl or mxfp4"):
        kernels.repack_r16(ws[:1], "q8_0")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 13, 70])
def test_reference_kernel_is_the_file_layouts_bit_for_bit(m, fmt, rng):
    q = quant(rng, 48, 1024, fmt)
    (r,) = kernels.repack_r16([q], fmt)
    x = rng.standard_normal((m, 1024)).astype(np.float32)
    assert np.array_equal(kernels.matmul(x, r, fmt + "_r16", isa="ref"), kernels.matmul(x, q, fmt, isa="ref"))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 32, 33, 40, 47, 48, 49, 64, 65, 96, 130])
@pytest.mark.parametrize("rows,k", [(16, 256), (80, 2048), (1024, 512)])
def test_every_isa_matches_the_reference(m, rows, k, fmt, rng):
    q = quant(rng, rows, k, fmt)
    (r,) = kernels.repack_r16([q], fmt)
    x = rng.standard_normal((m, k)).astype(np.float32)
    ref = kernels.matmul(x, q, fmt, isa="ref")
    for isa in ISAS:
        if int8_exact(isa, m, fmt + "_r16"):
            check_close(kernels.matmul(x, r, fmt + "_r16", isa=isa), ref, TOL_VS_REF, f"{isa} M={m} {rows}x{k}")
        else:  # (bf16 AMX tiles, from the repacked layout: against float64 on the file's weights)
            want = x.astype(np.float64) @ kernels.dequantize(q, fmt).astype(np.float64).T
            check_close(kernels.matmul(x, r, fmt + "_r16", isa=isa), want, 3e-2, f"{isa} M={m} {rows}x{k}")


@pytest.mark.skipif(not {"avx2", "avx512"} <= set(ISAS), reason="needs a CPU with AVX-512 VNNI")
@pytest.mark.parametrize("fmt", ["q3_k", "iq4_xs", "iq3_xxs", "iq3_s"])
def test_avx512_tiles_equal_avx2s_bit_for_bit(fmt, rng):
    # both sum each group exactly in int32 (AVX2 by vpmaddubsw, AVX-512 by vpdpbusd of unsigned codes, the
    # offset taken off through the group's activation sum) and do the same float work per super-block
    q = quant(rng, 1024, 1024, fmt, scale=4.0)
    (r,) = kernels.repack_r16([q], fmt)
    for m in (1, 2, 5, 6, 7, 13, 48, 49, 100):
        x = (rng.standard_normal((m, 1024)) * np.where(rng.random((m, 1024)) < 0.05, 50.0, 1.0)).astype(np.float32)
        assert np.array_equal(kernels.matmul(x, r, fmt + "_r16", isa="avx512"),
                              kernels.matmul(x, r, fmt + "_r16", isa="avx2")), f"{fmt} M={m}"


def test_raw_blocks_and_extreme_activations(rng):
    # every 6-bit scale and min and every nibble (raw bytes with finite fp16 d, dmin), against activation
    # rows that quantize to +-127 throughout and to spikes
    rows, k = 64, 1024
    raw = rng.integers(0, 256, (rows, k // 256, 144), dtype=np.uint8)
    halves = (rng.standard_normal((rows, k // 256, 2)) * 0.01).astype(np.float16).view(np.uint8)
    raw[:, :, :4] = halves.reshape(rows, k // 256, 4)
    raw[[0, 9, 30], :, 16:] = 0xFF  # every nibble 15: against +-127 throughout, the AVX2 kernel's int16 chains
    raw[[5, 17], :, 16:] = 0xF0  # at their largest (8 x 2 x 15 x 127)
    q = np.ascontiguousarray(raw.reshape(rows, -1))
    (r,) = kernels.repack_r16([q], "q4_k")
    assert np.array_equal(kernels.dequantize(r, "q4_k_r16"), kernels.dequantize(q, "q4_k"))
    x = np.where(rng.random((9, k)) < 0.5, 1.0, -1.0).astype(np.float32)
    x[0] = 1.0
    x[1] = -1.0
    x[2] = 0.0
    x[3, ::97] = 1e4
    for m in (1, 4, 9):
        ref = kernels.matmul(x[:m], q, "q4_k", isa="ref")
        assert np.array_equal(kernels.matmul(x[:m], r, "q4_k_r16", isa="ref"), ref)
        for isa in ISAS:
            check_close(kernels.matmul(x[:m], r, "q4_k_r16", isa=isa), ref, TOL_VS_REF, f"raw {isa} M={m}")


# Raw blocks per format: (block bytes, where the fp16 scales lie (d; q5_K's d and dmin), the code bytes, (code
# byte for the rows at the int16 chains' largest, code byte for the other extreme)): q3_K every weight 3 or
# -4, q2_K 3 or 0 (every scale and min byte random), q5_K 31 or 0, q6_K 31 or -32, iq4_xs nibble 0 (-127, one vpmaddubsw pair at 2 x 127 x 127) or 15,
# iq3_xxs / iq3_s last grid entry with every sign set and scale 31, or entry 0 with none and scale 1.
RAW = {"q3_k": (110, slice(108, 110), slice(0, 96), (0xFF, 0x00)),
       "q2_k": (84, slice(80, 84), slice(16, 80), (0xFF, 0x00)),
       "q5_k": (176, slice(0, 4), slice(16, 176), (0xFF, 0x00)),
       "q6_k": (210, slice(208, 210), slice(0, 192), (0xFF, 0x00)),
       "iq4_xs": (136, slice(0, 2), slice(8, 136), (0x00, 0xFF)),
       "iq3_xxs": (98, slice(0, 2), slice(2, 98), (0xFF, 0x00)),
       "iq3_s": (110, slice(0, 2), slice(2, 110), (0xFF, 0x00))}


def check_raw_repacked(rng, q, fmt, k):
    """Raw rows q of fmt, repacked, hold the file's weights, and every ISA's product equals the reference's on
    the file's blocks: against activations at +-1 throughout, all 1, all -1, all 0, spikes, and one block of 32
    far smaller than the rest of its row, 1, 4 and 9 tokens."""
    (r,) = kernels.repack_r16([q], fmt)
    assert np.array_equal(kernels.dequantize(r, fmt + "_r16"), kernels.dequantize(q, fmt))
    x = np.where(rng.random((9, k)) < 0.5, 1.0, -1.0).astype(np.float32)
    x[0], x[1], x[2] = 1.0, -1.0, 0.0
    x[3, ::97] = 1e4
    x[4, :32] = 1e-3
    for m in (1, 4, 9):
        ref = kernels.matmul(x[:m], q, fmt, isa="ref")
        assert np.array_equal(kernels.matmul(x[:m], r, fmt + "_r16", isa="ref"), ref)
        for isa in ISAS:
            check_close(kernels.matmul(x[:m], r, fmt + "_r16", isa=isa), ref, TOL_VS_REF, f"raw {fmt} {isa} M={m}")


@pytest.mark.parametrize("fmt", list(RAW))
def test_raw_low_bit_blocks_and_extreme_activations(fmt, rng):
    # every scale and every code (raw bytes with a finite fp16 d), rows whose codes all sit at an extreme,
    # against check_raw_repacked's activations
    bb, d, codes, (most, least) = RAW[fmt]
    rows, k = 64, 1024
    raw = rng.integers(0, 256, (rows, k // 256, bb), dtype=np.uint8)
    raw[:, :, d] = (rng.standard_normal((rows, k // 256, (d.stop - d.start) // 2)) * 0.01).astype(np.float16).view(np.uint8)
    raw[[0, 9, 30], :, codes] = most
    raw[[5, 17], :, codes] = least
    check_raw_repacked(rng, np.ascontiguousarray(raw.reshape(rows, -1)), fmt, k)


@pytest.mark.parametrize("fmt", ["iq4_nl", "mxfp4"])
def test_blocks_of_32_raw_scales_and_extreme_activations(fmt, rng):
    # every code; each block's own scale (iq4_nl: fp16 d of either sign, 0 and subnormal; mxfp4: E8M0
    # exponents 0 and 1, whose halves are subnormal floats, and large ones); rows at the extreme codes; against
    # the activations of check_raw_repacked (blocks of 32 quantized each with their own scale)
    rows, k = 48, 1024
    if fmt == "mxfp4":
        q = mxfp4_blocks(rng, rows, k, (0, 160)).reshape(rows, k // 32, 17)
        q[[1, 7], :, 0] = rng.integers(0, 2, (2, k // 32))
        codes, most, least = slice(1, 17), 0x77, 0xFF  # 6 and -6 (doubled: 12, -12)
    else:
        q = kernels.quantize(rng.standard_normal((rows, k)).astype(np.float32), "iq4_nl").reshape(rows, k // 32, 18)
        d = (rng.standard_normal((rows, k // 32)) * 0.01).astype(np.float16)
        d[3, ::5], d[4, ::3] = 0, np.float16(3e-8)  # zero and subnormal scales
        q[:, :, :2] = d.view(np.uint8).reshape(rows, k // 32, 2)
        codes, most, least = slice(2, 18), 0xFF, 0x00  # 113 and -127
    q[[0, 9, 30], :, codes] = most
    q[[5, 17], :, codes] = least
    check_raw_repacked(rng, np.ascontiguousarray(q.reshape(rows, -1)), fmt, k)


def test_native_kernel_where_it_exists():
    # the loader repacks only for kernels that have a product of their own (q4_k, iq4_xs, iq4_nl, mxfp4,
    # iq3_xxs, iq3_s: AVX2, AVX-VNNI, AVX-512, and NEON on a CPU with sdot; q3_k: AVX2 and the tables built
    # on it; q2_k: AVX-512 alone;
    # q5_k, q6_k: AVX2 alone,
    # the AVX-VNNI and AVX-512 tables multiply their file layouts with their own); the others carry the loops
    assert not any(kernels.has_native_r16(f, "ref") for f in kernels.R16_FORMATS)
    dotprod = clover_cpu.system_info()["cpu_features"].get("dotprod", False)
    for isa in ISAS:
        # (the "amx" table is AVX-512's with AMX prompt products: the same layouts)
        x86 = isa in ("avx2", "avxvnni", "avx512", "amx")
        assert kernels.has_native_r16("q4_k", isa) == (x86 or (isa == "neon" and dotprod))
        for fmt in ("iq4_xs", "iq3_xxs", "iq3_s", "iq4_nl", "mxfp4"):
            assert kernels.has_native_r16(fmt, isa) == (x86 or (isa == "neon" and dotprod))
        assert kernels.has_native_r16("q3_k", isa) == x86
        assert kernels.has_native_r16("q2_k", isa) == (isa in ("avx512", "amx"))
        for fmt in ("q5_k", "q6_k"):
            assert kernels.has_native_r16(fmt, isa) == (isa == "avx2")


@pytest.mark.parametrize("fmt", FORMATS[1:])
def test_low_bit_moe(fmt, rng):
    H, I, E, top_k, M = 512, 256, 6, 2, 9
    x = rng.standard_normal((M, H)).astype(np.float32)
    gate, up = quant(rng, E * I, H, fmt).reshape(E, I, -1), quant(rng, E * I, H, fmt).reshape(E, I, -1)
    down = quant(rng, E * H, I, fmt).reshape(E, H, -1)
    rg, ru, rd = kernels.repack_r16([gate, up, down], fmt)
    ids = np.stack([rng.permutation(E)[:top_k] for _ in range(M)]).astype(np.int32)
    w = rng.random((M, top_k)).astype(np.float32)
    want, n = kernels.moe(x, ids, w, gate, up, down, fmt, isa="ref")
    for isa in ISAS:
        got, n2 = kernels.moe(x, ids, w, rg, ru, rd, fmt + "_r16", isa=isa)
        assert n == n2
        if isa == "ref":
            assert np.array_equal(got, want)
        else:
            check_close(got, want, 1e-3, f"{fmt} moe {isa}")


def test_matmul_many_and_moe(rng):
    H, I, E, top_k, M = 512, 256, 6, 2, 9
    a, b = q4k(rng, 64, H), kernels.quantize(rng.standard_normal((32, H)).astype(np.float32), "q8_0")
    ra, = kernels.repack_r16([a], "q4_k")
    x = rng.standard_normal((M, H)).astype(np.float32)
    ys = kernels.matmul_many(x, [(ra, "q4_k_r16"), (b, "q8_0"), (a, "q4_k")])
    assert np.array_equal(ys[0], kernels.matmul(x, ra, "q4_k_r16"))  # matmul_many's contract holds
    check_close(ys[0], ys[2], TOL_VS_REF, "matmul_many r16 vs q4_k")
    gate, up = q4k(rng, E * I, H).reshape(E, I, -1), q4k(rng, E * I, H).reshape(E, I, -1)
    down = q4k(rng, E * H, I).reshape(E, H, -1)
    rg, ru, rd = kernels.repack_r16([gate, up, down], "q4_k")
    ids = np.stack([rng.permutation(E)[:top_k] for _ in range(M)]).astype(np.int32)
    w = rng.random((M, top_k)).astype(np.float32)
    for isa in ISAS:
        want, n = kernels.moe(x, ids, w, gate, up, down, "q4_k", isa="ref")
        got, n2 = kernels.moe(x, ids, w, rg, ru, rd, "q4_k_r16", isa=isa)
        assert n == n2
        if isa == "ref":
            assert np.array_equal(got, want)
        else:  # (the down products see activations quantized from slightly different values)
            check_close(got, want, 1e-3, f"moe {isa}")


def test_bad_input_is_refused(rng):
    q = q4k(rng, 32, 256)
    with pytest.raises(ValueError, match="groups of 16"):
        kernels.repack_r16([q[:8]], "q4_k")
    with pytest.raises(ValueError, match="groups of 16"):
        kernels.repack_r16([np.ascontiguousarray(q.reshape(4, 8, -1))], "q4_k")
    with pytest.raises(ValueError, match="144 bytes"):
        kernels.repack_r16([np.zeros((16, 100), np.uint8)], "q4_k")
    with pytest.raises(ValueError, match="uint8"):
        kernels.repack_r16([q.astype(np.int16)], "q4_k")
    with pytest.raises(ValueError, match="not an array"):
        kernels.repack_r16(["q"], "q4_k")
    with pytest.raises(ValueError, match="not a format to quantize to"):
        kernels.quantize(np.zeros((16, 256), np.float32), "q4_k_r16")
    (r,) = kernels.repack_r16([q], "q4_k")
    x = np.zeros((1, 256), np.float32)
    for bad in (lambda: kernels.matmul(x, np.ascontiguousarray(r[:8]), "q4_k_r16"),
                lambda: kernels.dequantize(np.ascontiguousarray(r[:8]), "q4_k_r16")):
        with pytest.raises(ValueError, match="groups of 16"):
            bad()
    # iq4_nl / mxfp4 rows (blocks of 32) only as whole runs of 8 blocks, 256 weights
    nl = kernels.quantize(rng.standard_normal((16, 288)).astype(np.float32), "iq4_nl")
    with pytest.raises(ValueError, match="not whole iq4_nl super-blocks \\(144 bytes per 256 weights\\)"):
        kernels.repack_r16([nl], "iq4_nl")
    # the loader's test for whole runs (kernels.R16_RUN_BYTES) is the one repack_r16 applies
    for f in kernels.R16_FORMATS:
        run, blk = kernels.R16_RUN_BYTES[f], kernels.FORMATS[f]["block_bytes"]
        assert kernels.repack_r16([np.zeros((16, 2 * run), np.uint8)], f)[0].shape[0] == 16
        if blk < run:
            with pytest.raises(ValueError, match="not whole"):
                kernels.repack_r16([np.zeros((16, 2 * run + blk), np.uint8)], f)
    # not a file format: a GGUF cannot name it
    assert "q4_k_r16" not in kernels.FORMATS
    assert kernels.repack_r16([], "q4_k") == []


def mapping_rss_kb(address):
    """Rss of the mapping that holds address (/proc/self/smaps), or None where there is none."""
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("Rss:"):
            return int(line.split()[1])
    return None


def test_release_leaves_the_mapped_file_readable(tmp_path, rng):
    q = q4k(rng, 512, 2048)  # 590 KB: whole pages to release
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * 100 + q.tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        view = np.frombuffer(mm, np.uint8, count=q.size, offset=100).reshape(q.shape)
        assert int(view.sum(dtype=np.int64)) == int(q.sum(dtype=np.int64))  # every page in memory
        before = mapping_rss_kb(view.ctypes.data)
        (r,) = kernels.repack_r16([view], "q4_k", release=True)
        if before is not None:  # (Linux) the file's pages left this process, but for the partial ones at the ends
            after = mapping_rss_kb(view.ctypes.data)
            assert before >= 576 and after <= 2 * mmap.PAGESIZE // 1024, (before, after)
        assert np.array_equal(view, q)  # the dropped pages fault back in from the file
        assert np.array_equal(kernels.dequantize(r, "q4_k_r16"), kernels.dequantize(q, "q4_k"))
        del view
        mm.close()
    # memory of the process's own is never released: an anonymous array's pages would come back as zeros,
    # a private mapping's without its changes
    keep = q.copy()
    (r2,) = kernels.repack_r16([q], "q4_k", release=True)
    assert np.array_equal(q, keep) and np.array_equal(r2, r)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: its changes live in its own pages
        view = np.frombuffer(mm, np.uint8, count=q.size, offset=100).reshape(q.shape)
        view[:] = 0
        changed = view.copy()
        kernels.repack_r16([view], "q4_k", release=True)
        assert np.array_equal(view, changed)
        del view
        mm.close()


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["q4_k_m", "q3_k_m", "iq4_xs"])
def q4_model(request, tmp_path_factory):
    """A tiny Qwen3.5-MoE whose layer weights take q4_k (rows of 256), converted as Q4_K_M, and the same as
    Q3_K_M (q3_k experts and projections, q4_k / q5_k others) and IQ4_XS."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    from clover_cpu.convert.hf import convert
    from clover_cpu.convert.synthetic import train_spm

    d = tmp_path_factory.mktemp("q4")
    cfg = Qwen3_5MoeTextConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
        shared_expert_intermediate_size=256, vocab_size=512, rms_norm_eps=1e-6, max_position_embeddings=4096,
        full_attention_interval=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    torch.manual_seed(0)
    Qwen3_5MoeForCausalLM(cfg).eval().save_pretrained(d / "hf", safe_serialization=True)
    (d / "hf" / "tokenizer.model").write_bytes(train_spm(512))
    convert(d / "hf", d / "q4.gguf", out_type=request.param, log=lambda s: None, progress=False)
    return d / "q4.gguf"


def test_model_forward_with_and_without_repack(q4_model):
    ids = np.random.default_rng(1).integers(0, 512, 21)
    off = clover_cpu.load(q4_model, repack="off")
    if not kernels.has_native_r16("q4_k"):  # the scalar loops would run every q4_k product: refused
        with pytest.raises(ValueError, match="repack on needs the AVX2, AVX-512 or NEON dot-product kernels"):
            clover_cpu.load(q4_model, repack="on")
        assert not clover_cpu.load(q4_model).repacked
        pytest.skip("no native q4_k_r16 kernel on this machine")
    on = clover_cpu.load(q4_model, repack="on")
    assert not off.repacked and on.repacked
    before = {name: w.fmt for name, w in off.layers[0].items() if hasattr(w, "fmt")}
    fmts = {name: w.fmt for name, w in on.layers[0].items() if hasattr(w, "fmt")}
    expert = before["gate_exps"]  # q4_k, q3_k, iq4_xs: the file's, repacked where the kernels multiply it
    assert fmts["gate_exps"] == fmts["up_exps"] == (expert + "_r16" if kernels.has_native_r16(expert) else expert)
    # every layer matrix of those formats whose rows come in whole groups of 16 (not alpha / beta: a row
    # per head)
    whole = {n for n, w in off.layers[0].items() if hasattr(w, "fmt") and w.data.shape[-2] % 16 == 0}
    def packed(f, whole_rows):
        return f + "_r16" if f in kernels.R16_FORMATS and kernels.has_native_r16(f) and whole_rows else f

    assert fmts == {n: packed(f, n in whole) for n, f in before.items()}, fmts
    # the head too (this model's is its own, not the embedding), the embedding never (rows looked up by id)
    assert on.output.fmt == packed(off.output.fmt, True) and on.embed.fmt == off.embed.fmt
    # The native kernels sum in another order than the file layout's, and in this random model one
    # rounding difference that moves an activation across a quantization step (or the router across a
    # near-tie) parts the forwards by ~1e-2 from that position on: under the AVX2 kernels these two part
    # at position 15 (1.3e-2), and every native forward parts from the reference kernels' at position 13.
    # Weights misread would give differences of the logits' own size. The exact
    # check is the reference kernels' (test_loader_repack_is_exact_with_the_reference_kernels).
    want = off.forward(ids)
    check_close(on.forward(ids), want, 5e-2, "repacked forward")
    # the fused layers and the operator-by-operator path see the repacked weights alike
    on.fused = False
    check_close(on.forward(ids), want, 5e-2, "repacked, operator path")
    auto = clover_cpu.load(q4_model)
    assert auto.repacked == kernels.has_native_r16("q4_k")
    with pytest.raises(ValueError, match="repack must be one of"):
        clover_cpu.load(q4_model, repack="yes")


def test_loader_repack_is_exact_with_the_reference_kernels(q4_model):
    # The reference product on q4_k_r16 is q4_k's bit for bit, so with the reference kernels a model whose
    # layers the loader repacked (every q4_k matrix and expert tensor it picks, through the fused layers
    # and the operator path) must give the file layout's logits exactly. (repack="on" refuses the
    # reference kernels, so the loader's own step runs on a model loaded without it.)
    import subprocess
    import sys

    script = """
import sys, numpy as np, clover_cpu
m = clover_cpu.load(sys.argv[1], repack="off")
ids = np.random.default_rng(1).integers(0, 512, 21)
want = m.forward(ids)
m._load_weights(list(clover_cpu.kernels.R16_FORMATS))
fmts = {n: w.fmt for L in m.layers for n, w in L.items() if hasattr(w, "fmt")}
assert m.repacked and fmts["gate_exps"] == fmts["up_exps"] and fmts["gate_exps"].endswith("_r16"), fmts
got = m.forward(ids)
m.fused = False
print(np.array_equal(got, want), np.array_equal(m.forward(ids), want), np.abs(got - want).max())
"""
    env = dict(os.environ, CLOVER_ISA="ref")
    r = subprocess.run([sys.executable, "-c", script, str(q4_model)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["True", "True"], r.stdout


def test_cli_repack_flag(q4_model):
    import json
    import subprocess
    import sys

    base = [sys.executable, "-m", "clover_cpu", "run", "-m", str(q4_model), "-p", "hello", "--max-new-tokens", "3",
            "--ignore-eos", "--json"]
    for mode in ("on", "off") if kernels.has_native_r16("q4_k") else ("off", "auto"):
        r = subprocess.run(base + ["--repack", mode], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert len(json.loads(r.stdout)["token_ids"]) == 3
    r = subprocess.run(base + ["--repack", "maybe"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--repack" in r.stderr and "Traceback" not in r.stderr
    # the reference kernels lack the native product: on is refused, auto leaves the file's layout
    env = dict(os.environ, CLOVER_ISA="ref")
    r = subprocess.run(base + ["--repack", "on"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and "AVX2, AVX-512 or NEON dot-product" in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    r = subprocess.run(base + ["--repack", "auto"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
