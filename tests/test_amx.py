"""AMX prompt products (the "amx" kernel table, Intel CPUs with AMX-BF16): from kernels.amx_min_tokens(fmt)
tokens, weights of the layouts with an AMX decoder are dequantized to bf16 panels and multiplied on tile
registers with bf16 activations. Against float64 on the dequantized weights: bf16 rounds weights and
activations to 8 bits of mantissa, so the results must be closer to float64 than the int8 paths' (TOL, and
closer than the AVX-512 table on the same inputs). Every other layout, and fewer tokens, must be the AVX-512
table's products bit for bit."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

import clover_cpu
from clover_cpu import kernels

from conftest import check_close
from test_lowbit import random_blocks
from test_moe import make_experts, reference, route

ISAS = clover_cpu.system_info()["available_isas"]
pytestmark = pytest.mark.skipif("amx" not in ISAS, reason="needs a CPU with AMX-BF16 (and an OS granting its tiles)")

# The int8 paths sit at 5-8e-3 of the largest output on these shapes (q8 activations); bf16 at 2-3e-3.
TOL = 5e-3
FILE_FORMATS = ["q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "iq4_nl", "iq4_xs"]
# The layouts with an AMX decoder (csrc/kernels_amx.cpp), and from how many tokens they take it
TAKEN = {"q5_k": 64, "q6_k": 64, "q8_0": 64, "q4_k_r16": 32, "iq4_xs_r16": 32, "q6_k_r16": 32}


def quant(rng, fmt, rows, k):
    """Weights of format fmt and their values by gguf's own dequantizer (llama.cpp's gguf-py)."""
    if fmt in ("iq3_xxs", "iq3_s", "mxfp4"):  # (read, not written, by clover-cpu: random blocks)
        q = random_blocks(rng, fmt, rows, k, rms=1.0)
    else:
        q = kernels.quantize(rng.standard_normal((rows, k)).astype(np.float32), fmt)
    return q, gq.dequantize(q, GGMLQuantizationType[fmt.upper()]).astype(np.float64)


def test_which_layouts():
    for fmt in FILE_FORMATS + [f + "_r16" for f in kernels.R16_FORMATS] + ["f32", "f16", "bf16"]:
        assert kernels.amx_min_tokens(fmt, "amx") == TAKEN.get(fmt, 0), fmt
        assert kernels.amx_min_tokens(fmt, "avx512") == 0


def check(rng, fmt, q, wd, r, fmt_r, k):
    """q (or r, its layout fmt_r) on the tiles from their threshold, the AVX-512 table's below and elsewhere."""
    mt = kernels.amx_min_tokens(fmt_r, "amx")
    for m in ([mt - 1, mt, mt + 1, 100] if mt else [100]):
        x = rng.standard_normal((m, k)).astype(np.float32)
        got, int8 = kernels.matmul(x, r, fmt_r, isa="amx"), kernels.matmul(x, r, fmt_r, isa="avx512")
        if not mt or m < mt:
            assert np.array_equal(got, int8), f"{fmt_r} M={m}: not the AVX-512 table's products"
            continue
        want = x.astype(np.float64) @ wd.T
        check_close(got, want, TOL, f"{fmt_r} amx M={m}")
        # (the bound is not loose enough to pass the int8 paths)
        assert np.abs(got - want).max() < np.abs(int8 - want).max(), f"{fmt_r} M={m}: no closer than int8"


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_file_layouts(fmt, rng):
    # 40 rows: a 32-row pair and a 16-row panel half empty; token counts with whole and partial tiles
    q, wd = quant(rng, fmt, 40, 1024)
    check(rng, fmt, q, wd, q, fmt, 1024)


@pytest.mark.parametrize("fmt", kernels.R16_FORMATS)
def test_repacked_layouts(fmt, rng):
    # 48 rows: a whole row pair and a lone 16-row group
    q, wd = quant(rng, fmt, 48, 512)
    (r,) = kernels.repack_r16([q], fmt)
    check(rng, fmt, q, wd, r, fmt + "_r16", 512)


def test_many_rows_threads_and_matmul_many(rng):
    # several row blocks per task and tasks per thread (2056 rows: not a multiple of 32), 300 tokens (more
    # than one token block); matmul_many mixes a tile product with a float one
    q, wd = quant(rng, "q8_0", 2056, 512)
    f, fd = quant(rng, "f32", 48, 512)
    x = rng.standard_normal((300, 512)).astype(np.float32)
    check_close(kernels.matmul(x, q, "q8_0", isa="amx"), x.astype(np.float64) @ wd.T, TOL, "q8_0 2056 rows")
    a, b = kernels.matmul_many(x, [(q, "q8_0"), (f, "f32")], isa="amx")
    assert np.array_equal(a, kernels.matmul(x, q, "q8_0", isa="amx"))
    check_close(b, x.astype(np.float64) @ fd.T, 1e-5, "f32 beside it")


def moe_both(rng, fmt, down_fmt, E, K, M, route_fn=None):
    """An MoE of E experts (H = I = 256), K per token, M tokens (route_fn may set the routing): the amx and
    avx512 tables' outputs, the float64 reference, the experts used, the token count of each expert."""
    g, gd = make_experts(rng, fmt, E, 256, 256)
    u, ud = make_experts(rng, fmt, E, 256, 256)
    d, dd = make_experts(rng, down_fmt, E, 256, 256)
    x = rng.standard_normal((M, 256)).astype(np.float32)
    ids, w = route(rng, M, E, K)
    if route_fn:
        route_fn(ids)
    want = reference(x.astype(np.float64), ids, w, gd, ud, dd)
    out, used = kernels.moe(x, ids, w, g, u, d, fmt, fmt, down_fmt, isa="amx")
    out8, _ = kernels.moe(x, ids, w, g, u, d, fmt, fmt, down_fmt, isa="avx512")
    return out, out8, want, used, np.bincount(ids.ravel(), minlength=E)


def rms_error(out, want):
    return float(np.sqrt(np.mean((out - want) ** 2)))


@pytest.mark.parametrize("fmt,down_fmt", [("q5_k", "q6_k"), ("q8_0", "q8_0")])
def test_moe_experts_on_tiles(fmt, down_fmt, rng):
    # 4 experts, 2 per token, 150 tokens: three experts have 64 tokens or more (tiles), expert 2 fewer (int8)
    def experts_0_to_3(ids):
        t = np.arange(len(ids))
        ids[:, 0] = np.where(t < 20, 2, t % 2)  # experts 0 and 1: 65 tokens each, expert 2: 20
        ids[:, 1] = 3  # expert 3: all 150

    out, out8, want, used, counts = moe_both(rng, fmt, down_fmt, 4, 2, 150, experts_0_to_3)
    assert used == 4 and counts[2] < 64 and (np.delete(counts, 2) >= 64).all(), counts
    # (two products in a row: the hidden rows' rounding carries into the down projection, 1-1.5e-2 for the
    # int8 paths and 0.6-1e-2 here, against test_moe's bound of 5e-2)
    check_close(out, want, 5e-2, f"moe {fmt}/{down_fmt} amx")
    # tokens 20 on met only tile experts: their RMS error well under the int8 paths'
    assert rms_error(out[20:], want[20:]) < 0.8 * rms_error(out8[20:], want[20:])


@pytest.mark.parametrize("E,K", [(2, 2), (8, 8), (8, 7)])
def test_moe_every_expert_on_tiles(E, K, rng):
    # E experts, K per token, 70 tokens. K = E: every expert has all 70 (>= 64: no int8 activations are made);
    # 8 experts: a task per expert, both phases in it (4 or more experts per thread); 7 of 8: about 61 tokens
    # each, some experts on the tiles and some not
    out, out8, want, used, counts = moe_both(rng, "q8_0", "q6_k", E, K, 70)
    assert used == E
    assert (counts >= 64).all() if K == E else ((counts >= 64).any() and (counts < 64).any()), counts
    check_close(out, want, 5e-2, f"moe amx, {E} experts, {K} per token")
    # (7 of 8: part of the work stays int8)
    assert rms_error(out, want) < (0.8 if K == E else 1.0) * rms_error(out8, want)


def test_the_shipped_model_on_tiles():
    # the shipped model (Q8_0) over 100 tokens: its dense projections take the tiles (its experts, ~25 tokens
    # each, do not); the logits stay close to the AVX-512 table's and mostly pick the same token
    from clover_cpu import _core
    from clover_cpu.commands.run import shipped_model

    ids = np.random.default_rng(7).integers(5, 1000, 100)
    active = clover_cpu.system_info()["isa"]
    try:
        m = clover_cpu.load(shipped_model())
        out = {}
        for isa in ("avx512", "amx"):
            _core.set_isa(isa)
            out[isa] = m.forward(ids)
    finally:
        _core.set_isa(active)
    # (its 8 layers amplify rounding: 4.2e-2 of the largest logit here, where the AVX-512 and the scalar
    # tables differ by 0.14; a wrong tile product gives other logits)
    check_close(out["amx"], out["avx512"], 0.1, "shipped model, amx against avx512")
    assert (out["amx"].argmax(-1) == out["avx512"].argmax(-1)).mean() >= 0.9
    assert not np.array_equal(out["amx"], out["avx512"])  # (the tiles did run)
