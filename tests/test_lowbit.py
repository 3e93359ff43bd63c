"""The low-bit and legacy formats laptops' GGUFs use (Q2_K, Q3_K, IQ4_XS, IQ4_NL, IQ3_S, IQ3_XXS, IQ2_S,
IQ2_XS, IQ2_XXS, IQ1_S, IQ1_M, MXFP4, Q4_1, Q5_0, Q5_1): blocks of random bytes (every bit pattern is a valid block, the
float scales kept finite) dequantize bit for bit as gguf.quants.dequantize does; the legacy quantizers write
gguf.quants.quantize's bytes; every ISA's product equals the float64 product of the dequantized weights
within the activations' int8 rounding, and the scalar reference's within float summation order; the MoE
product and a model whose weights are in each format run as their float twins."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq

import clover_cpu
from clover_cpu import kernels

from conftest import check_close, int8_exact

ISAS = clover_cpu.system_info()["available_isas"]
SIMD_ISAS = [i for i in ISAS if i != "ref"]
LOWBIT = ["q2_k", "q3_k", "iq4_xs", "iq4_nl", "iq3_s", "iq3_xxs", "iq2_s", "iq2_xs", "iq2_xxs", "iq1_s", "iq1_m", "mxfp4",
          "q4_1", "q5_0", "q5_1"]
QUANTIZERS = ["q4_1", "q5_0", "q5_1"]
# byte offsets of each block's fp16 scales (d, and the min/dmin where there is one)
F16_FIELDS = {"q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "iq4_nl": [0], "q2_k": [80, 82], "q3_k": [108], "iq4_xs": [0],
              "iq2_xxs": [0], "iq2_xs": [0], "iq2_s": [0], "iq3_xxs": [0], "iq3_s": [0], "iq1_s": [0]}
# iq1_m keeps its fp16 d in the top nibbles of the 4 little-endian words at this byte offset (word 0's the lowest)
IQ1_M_WORDS = 48
TOL_FLOAT64 = 1e-5  # against float64 on the int8-rounded activations: float summation order only
TOL_VS_REF = 2e-5  # the same integer dots, another float summation order
Q8_K_FORMATS = {"q2_k", "q3_k", "iq4_xs", "iq3_s", "iq3_xxs", "iq2_s", "iq2_xs", "iq2_xxs", "iq1_s", "iq1_m"}


def set_fp16_scale(raw, fmt, off, d):
    """Write fp16 scales d (one per block: raw.shape[:-1]) into the field at byte offset off of blocks raw
    (..., block bytes); iq1_m's into its scale words' top nibbles."""
    bits = np.asarray(d, np.float16).view(np.uint16)
    if fmt == "iq1_m":
        w = raw[..., off:off + 8].copy().view(np.uint16)
        for k in range(4):
            w[..., k] = (w[..., k] & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12)
        raw[..., off:off + 8] = w.view(np.uint8)
    else:
        raw[..., off:off + 2] = bits.view(np.uint8).reshape(*bits.shape, 2)


def act_rounded(x, fmt):
    """The activations as the kernels see them: blocks of 32 (q8_a) or 256 (q8_K), d = amax / 127, q =
    round-half-even(x / d) (clover's activation quantizers, every ISA the same)."""
    n = 256 if fmt in Q8_K_FORMATS else 32
    b = x.reshape(x.shape[0], -1, n).astype(np.float32)
    d = np.abs(b).max(-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


def gtype(fmt):
    return GGMLQuantizationType[fmt.upper()]


def random_blocks(rng, fmt, rows, k, scale=(0.004, 0.06), rms=None):
    """Random bytes as blocks, with finite fp16 scales of random sign in `scale` (mxfp4: exponents near 1);
    rms: scales chosen instead so that the weights' RMS is about `rms`."""
    bs, nb = GGML_QUANT_SIZES[gtype(fmt)]
    raw = rng.integers(0, 256, (rows, k // bs, nb), dtype=np.uint8)
    if rms is not None:
        unit = random_blocks(rng, fmt, 4, 1024, scale=(1.0, 1.0))
        if fmt == "mxfp4":
            unit.reshape(-1, nb)[:, 0] = 128
        r = float(np.sqrt(np.mean(gq.dequantize(unit, gtype(fmt)).astype(np.float64) ** 2)))
        scale = (0.5 * rms / r, 1.5 * rms / r)
    for off in F16_FIELDS.get(fmt, [IQ1_M_WORDS] if fmt == "iq1_m" else []):
        d = rng.uniform(*scale, raw.shape[:2]) * rng.choice([-1, 1], raw.shape[:2])
        set_fp16_scale(raw, fmt, off, d.astype(np.float16))
    if fmt == "mxfp4":
        e = 128 + (np.log2(np.sqrt(scale[0] * scale[1])) if rms is not None else 0)
        raw[..., 0] = rng.integers(int(e) - 2, int(e) + 3, raw.shape[:2])
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("fmt", LOWBIT)
def test_dequantize_bit_for_bit_as_gguf_py(fmt, rng):
    w = random_blocks(rng, fmt, 13, 1024)
    want = gq.dequantize(w, gtype(fmt)).reshape(13, 1024)
    got = kernels.dequantize(w, fmt)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), f"{fmt}: {np.abs(want - got).max()}"


@pytest.mark.parametrize("fmt", LOWBIT)
def test_dequantize_extreme_scales(fmt, rng):
    """Subnormal, huge and zero scales, all-ones and all-zeros bytes: still gguf.quants' floats."""
    bs, nb = GGML_QUANT_SIZES[gtype(fmt)]
    rows = [random_blocks(rng, fmt, 1, 256 if bs == 256 else 64, scale=s) for s in ((1e-7, 6e-5), (1e3, 6e4))]
    rows += [np.zeros_like(rows[0]), np.full_like(rows[0], 0xff)]
    for off in F16_FIELDS.get(fmt, [IQ1_M_WORDS] if fmt == "iq1_m" else []):
        ones = rows[-1].reshape(-1, nb)
        set_fp16_scale(ones, fmt, off, np.full(ones.shape[0], -2.5, np.float16))
    w = np.concatenate(rows)
    want = gq.dequantize(w, gtype(fmt)).reshape(len(rows), -1)
    got = kernels.dequantize(w, fmt)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("fmt", QUANTIZERS)
def test_legacy_quantizers_byte_for_byte(fmt, rng):
    from test_formats import inputs

    x = inputs(rng, 256)
    assert np.array_equal(kernels.quantize(x, fmt), gq.quantize(x, gtype(fmt)))


def test_no_quantizer_is_a_clear_error():
    with pytest.raises(ValueError, match="no quantizer for iq2_xxs"):
        kernels.quantize(np.zeros((2, 256), np.float32), "iq2_xxs")


@pytest.mark.parametrize("fmt", LOWBIT)
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 17])
def test_matmul_vs_float64(fmt, m, rng):
    k = 512
    w = random_blocks(rng, fmt, 19, k)  # 19 rows: not a multiple of any tile
    wd = kernels.dequantize(w, fmt).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    want = act_rounded(x, fmt) @ wd.T
    for isa in ISAS:
        check_close(kernels.matmul(x, w, fmt, isa=isa), want, TOL_FLOAT64, f"{fmt} {isa} M={m}")


@pytest.mark.parametrize("fmt", LOWBIT)
@pytest.mark.parametrize("m", [1, 4, 7, 15, 33, 70])
def test_simd_equals_scalar(fmt, m, rng):
    if not SIMD_ISAS:
        pytest.skip("no SIMD path on this machine")
    k = 1024
    w = random_blocks(rng, fmt, 37, k)
    x = (rng.standard_normal((m, k)) * np.where(rng.random(k) < 0.02, 30, 1)).astype(np.float32)  # outliers
    ref = kernels.matmul(x, w, fmt, isa="ref")
    for isa in SIMD_ISAS:
        if int8_exact(isa, m, fmt):
            check_close(kernels.matmul(x, w, fmt, isa=isa), ref, TOL_VS_REF, f"{fmt} {isa} vs ref M={m}")
        else:  # (bf16 AMX tiles: against float64, as close as the int8 activations' rounding allows)
            want = x.astype(np.float64) @ kernels.dequantize(w, fmt).astype(np.float64).T
            check_close(kernels.matmul(x, w, fmt, isa=isa), want, 3e-2, f"{fmt} {isa} M={m}")


@pytest.mark.parametrize("fmt,bits", [("iq2_xxs", 8), ("iq2_xs", 9), ("iq2_s", 10)])
@pytest.mark.parametrize("m", [1, 3, 9])
def test_iq2_every_grid_entry(fmt, bits, m, rng):
    # every grid index once (row r, group g: index 32 r + g), random signs and scales: the SIMD kernels (the
    # AVX-512 ones hold the grids as 2-bit code tables) against float64 on gguf's dequantization
    rows = (1 << bits) // 32
    w = random_blocks(rng, fmt, rows, 256).reshape(rows, -1)
    idx = np.arange(rows * 32).reshape(rows, 32)
    if fmt == "iq2_xxs":  # qs: per group of 32, 4 index bytes then 4 x 7 sign bits and the scale
        for g in range(32):
            w[:, 2 + 8 * (g // 4) + g % 4] = idx[:, g]
    elif fmt == "iq2_xs":  # qs[i] = 9-bit index | 7 sign bits << 9
        qs = w[:, 2:66].copy().view(np.uint16)
        qs[:] = (qs & 0xFE00) | idx.astype(np.uint16)
        w[:, 2:66] = qs.view(np.uint8)
    else:  # low 8 bits in qs[0..31], 2 high bits in qh[i / 4] at bit 2 (i % 4)
        w[:, 2:34] = idx & 0xFF
        qh = np.zeros((rows, 8), np.uint8)
        for g in range(32):
            qh[:, g // 4] |= ((idx[:, g] >> 8) << (2 * (g % 4))).astype(np.uint8)
        w[:, 66:74] = qh
    x = rng.standard_normal((m, 256)).astype(np.float32)
    want = act_rounded(x, fmt) @ kernels.dequantize(w, fmt).astype(np.float64).T
    for isa in ISAS:
        check_close(kernels.matmul(x, w, fmt, isa=isa), want, TOL_FLOAT64, f"{fmt} {isa} M={m}")


@pytest.mark.parametrize("fmt", ["iq1_s", "iq1_m"])
@pytest.mark.parametrize("m", [1, 3, 9, 20])
def test_iq1_every_grid_entry(fmt, m, rng):
    # every one of the 2048 grid indices once (row r, entry i: index 32 r + i) with both delta signs and
    # random scales: every ISA against float64 on gguf's dequantization (20 tokens: the lane tiles)
    rows = 2048 // 32
    w = random_blocks(rng, fmt, rows, 256).reshape(rows, -1)
    idx = np.arange(rows * 32).reshape(rows, 32)
    neg = rng.random((rows, 32)) < 0.5
    if fmt == "iq1_s":  # qs[i] low 8 bits; qh[i / 4]: bits 3 (i % 4) high 3, bits 12-14 s, bit 15 delta's sign
        w[:, 2:34] = idx & 0xFF
        qh = w[:, 34:50].copy().view(np.uint16) & 0x7000
        for i in range(32):
            qh[:, i // 4] |= ((idx[:, i] >> 8) << (3 * (i % 4))).astype(np.uint16)
        qh |= np.where(neg[:, ::4], 0x8000, 0).astype(np.uint16)
        w[:, 34:50] = qh.view(np.uint8)
    else:  # qs[i] low 8 bits; nibble i % 2 of qh[i / 2]: 3 high bits, then delta's sign
        w[:, 0:32] = idx & 0xFF
        nib = (idx >> 8) | np.where(neg, 8, 0)
        w[:, 32:48] = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    x = rng.standard_normal((m, 256)).astype(np.float32)
    want = act_rounded(x, fmt) @ kernels.dequantize(w, fmt).astype(np.float64).T
    for isa in ISAS:
        check_close(kernels.matmul(x, w, fmt, isa=isa), want, TOL_FLOAT64, f"{fmt} {isa} M={m}")


@pytest.mark.parametrize("fmt", LOWBIT)
def test_one_block_one_row(fmt, rng):
    k = GGML_QUANT_SIZES[gtype(fmt)][0]
    w = random_blocks(rng, fmt, 1, k)
    x = rng.standard_normal((1, k)).astype(np.float32)
    want = act_rounded(x, fmt) @ kernels.dequantize(w, fmt).astype(np.float64).T
    for isa in ISAS:
        check_close(kernels.matmul(x, w, fmt, isa=isa), want, TOL_FLOAT64, f"{fmt} {isa}")


@pytest.mark.parametrize("fmt", ["q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4"])
@pytest.mark.parametrize("m", [1, 3, 9])
def test_blocks_of_32_odd_count(fmt, m, rng):
    # 7 blocks of 32: not a whole super-block (the SIMD tiles' register path, not the lane layout) and an odd
    # count (the last block without a partner in the AVX-512 block pairs)
    w = random_blocks(rng, fmt, 21, 224)
    x = rng.standard_normal((m, 224)).astype(np.float32)
    want = act_rounded(x, fmt) @ kernels.dequantize(w, fmt).astype(np.float64).T
    for isa in ISAS:
        check_close(kernels.matmul(x, w, fmt, isa=isa), want, TOL_FLOAT64, f"{fmt} {isa} M={m}")


@pytest.mark.parametrize("fmt", ["q2_k", "iq2_xxs", "iq3_s", "iq4_xs", "q5_1", "mxfp4", "iq1_m"])
def test_threads_do_not_change_results(fmt, rng):
    w = random_blocks(rng, fmt, 300, 1024)
    x = rng.standard_normal((9, 1024)).astype(np.float32)
    outs = []
    for n in (1, 2, 3):
        clover_cpu.set_num_threads(n)
        outs.append(kernels.matmul(x, w, fmt))
    clover_cpu.set_num_threads(0)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("fmt,down_fmt", [("q3_k", "q5_1"), ("iq2_xxs", "iq4_xs"), ("iq3_xxs", "q2_k"),
                                          ("iq4_nl", "mxfp4"), ("iq2_s", "iq3_s"), ("iq2_xs", "q5_0"), ("q4_1", "q3_k"),
                                          ("iq1_s", "iq1_m")])
@pytest.mark.parametrize("m", [1, 6])
def test_moe(fmt, down_fmt, m, rng):
    from test_moe import reference, route

    E, H, I, K = 8, 256, 256, 2
    g, u = (random_blocks(rng, fmt, E * I, H).reshape(E, I, -1) for _ in range(2))
    d = random_blocks(rng, down_fmt, E * H, I).reshape(E, H, -1)
    deq = lambda q, f, rows, k: kernels.dequantize(q.reshape(-1, q.shape[-1]), f).reshape(E, rows, k).astype(np.float64)  # noqa: E731
    x = rng.standard_normal((m, H)).astype(np.float32)
    ids, w = route(rng, m, E, K)
    want = reference(x.astype(np.float64), ids, w, deq(g, fmt, I, H), deq(u, fmt, I, H), deq(d, down_fmt, H, I))
    for isa in ISAS:
        out, _ = kernels.moe(x, ids, w, g, u, d, fmt, fmt, down_fmt, isa=isa)
        check_close(out, want, 5e-2, f"moe {fmt}/{down_fmt} {isa} M={m}")


@pytest.mark.parametrize("fmt", ["q3_k", "iq2_xxs", "iq4_xs", "iq3_s", "mxfp4", "q5_1", "iq1_m"])
def test_model_in_each_format_runs_as_its_float_twin(fmt, rng, tmp_path):
    """The shipped Clover (trained weights) with its routed experts' down projections (the MoE product) and
    its mixers' output projections (dense products) rewritten as small random blocks of `fmt`, against the
    same network with those blocks dequantized to F32: the loader, the fused layers and the MoE read the
    format, and the two agree within the activations' int8 rounding (the rest of the network trained, so
    a rounding does not snowball as in a random one)."""
    import gguf

    from clover_cpu.gguf_file import GGUFFile

    src = clover_cpu.shipped_model()
    bs, _ = GGML_QUANT_SIZES[gtype(fmt)]
    files = {}
    with GGUFFile(src) as g:
        weights = {}
        for name, ti in g.tensors.items():
            x = kernels.dequantize(np.ascontiguousarray(g.data(name)), ti.type_name)
            if name.endswith(("ffn_down_exps.weight", "ssm_out.weight", "attn_output.weight")) and ti.ne[0] % bs == 0:
                rms = float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))
                blocks = random_blocks(rng, fmt, x.shape[0], x.shape[1], rms=0.02 * rms)
                weights[name] = (blocks.reshape(*ti.shape[:-1], -1), fmt)
            else:
                weights[name] = (x.reshape(ti.shape), "f32")
        reader = gguf.GGUFReader(str(src))
        for kind in ("lowbit", "f32"):
            w = gguf.GGUFWriter(str(tmp_path / f"{kind}.gguf"), "clover")
            for name, f in reader.fields.items():
                if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
                    continue
                vtype = f.types[0]
                w.add_key_value(name, f.contents(), vtype, sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
            for name, (data, t) in weights.items():
                if t == "f32" or kind == "f32":
                    arr = data if t == "f32" else kernels.dequantize(data.reshape(-1, data.shape[-1]), t).reshape(
                        g.tensors[name].shape)
                    w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
                else:
                    w.add_tensor(name, np.ascontiguousarray(data), raw_dtype=gtype(t))
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            files[kind] = tmp_path / f"{kind}.gguf"
    n_lowbit = sum(t == fmt for _, t in weights.values())
    ids = list(range(5, 45))
    b = clover_cpu.load(files["f32"]).forward(ids)
    # the file's layout, and where the kernels have a product for it, the layout the loader repacks it into
    want = {"off": fmt}
    if fmt in kernels.R16_FORMATS and kernels.has_native_r16(fmt):
        want["auto"] = fmt + "_r16"
    assert n_lowbit >= 8
    for repack, f in want.items():
        m = clover_cpu.load(files["lowbit"], repack=repack)
        assert m.layers[0]["ssm_out"].fmt == f and m.layers[3]["o"].fmt == f
        a = m.forward(ids)
        # per position: the q8_K activations (one scale per 256 values) round coarsely where activations
        # have outliers, and a rounding can tip a later router, so the error grows along the sequence; a
        # misread block puts every position at ~1
        per = np.sqrt(np.mean((a - b) ** 2, axis=1) / np.mean(b**2, axis=1))
        assert np.median(per) < 1e-2 and np.mean(per < 5e-2) >= 0.75, (repack, n_lowbit, np.sort(per))
