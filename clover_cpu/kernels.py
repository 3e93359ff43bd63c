"""The quantized kernels: GGUF block formats, matrix products and the mixture-of-experts product.

Weights are uint8 arrays of whole GGUF rows ([rows, row_bytes], or [experts, rows, row_bytes]);
activations are float32. Every function raises ValueError on bad input.
"""

from __future__ import annotations

import numpy as np

from . import _core

FORMATS = {t["name"]: t for t in _core.type_table()}
"""name -> {ggml_type, block_size, block_bytes} for every block format the kernels know."""


def row_bytes(fmt: str, k: int) -> int:
    """Bytes of one row of k weights in format fmt."""
    t = FORMATS[fmt.lower()]
    if k % t["block_size"]:
        raise ValueError(f"row length {k} is not a multiple of the {fmt} block size {t['block_size']}")
    return k // t["block_size"] * t["block_bytes"]


def quantize(x: np.ndarray, fmt: str, *, bf16: bool = False, imatrix: np.ndarray | None = None) -> np.ndarray:
    """[rows, k] -> uint8 [rows, row_bytes] in GGUF block layout (all threads).

    x is float32, float16, or (bf16=True) uint16 holding bf16 bits, widened on the worker threads.
    """
    return _core.quantize(x, fmt, bf16=bf16, imatrix=imatrix)


def dequantize(data: np.ndarray, fmt: str) -> np.ndarray:
    """uint8 [rows, row_bytes] -> float32 [rows, k]."""
    return _core.dequantize(data, fmt)


R16_FORMATS = ("q4_k", "q3_k", "q2_k", "q5_k", "q6_k", "iq4_xs", "iq3_xxs", "iq3_s", "iq4_nl", "mxfp4")
"""The formats repack_r16 takes (each becomes NAME_r16)."""

R16_RUN_BYTES = {f: FORMATS[f]["block_bytes"] * 256 // FORMATS[f]["block_size"] for f in R16_FORMATS}
"""Bytes of 256 weights of each of R16_FORMATS: repack_r16 takes rows only as whole runs of them (iq4_nl's and
mxfp4's blocks hold 32 weights, 8 to a run; the others' blocks are 256 weights already)."""


def repack_r16(ws, formats, *, release: bool = False) -> list[np.ndarray]:
    """Weights, each [rows, row_bytes] or stacked experts [E, rows, row_bytes] with rows a multiple of 16,
    in formats (one name for all, or one per array, of R16_FORMATS) -> the same shapes in NAME_r16: 16
    rows per group, one row per vector lane, scales decoded (148 bytes per row and super-block against
    q4_k's 144; 114 against q3_k's 110; q2_k's 84 as they are; 180 against q5_k's 176; q6_k's 210 as they
    are; 138 against iq4_xs's 136; iq3_xxs and iq3_s transcoded to 4-bit codes, 138 against 98 and 110;
    iq4_nl's 144 and mxfp4's 136 as they are, their rows whole runs of 256 weights: R16_RUN_BYTES).
    The same weights. The results are views of one buffer of their own. release: where a
    source lies in a read-only shared mapping of a file (Linux; as mmap.ACCESS_READ and np.memmap(mode="r")
    make), its whole pages are dropped from this process once it is copied (they stay in the page cache and
    fault back in if read); other memory is left alone."""
    ws = list(ws)
    if isinstance(formats, str):
        formats = [formats] * len(ws)
    return _core.repack_r16(ws, list(formats), release=release)


def has_native_r16(fmt: str, isa: str | None = None) -> bool:
    """Whether the kernels (the active ones, or isa's) multiply fmt (one of R16_FORMATS) repacked by
    repack_r16 with a product of their own: q4_k, iq4_xs, iq4_nl, mxfp4, iq3_xxs and iq3_s on AVX2, AVX-VNNI,
    AVX-512 (the tables built on AVX2's) and NEON with the dot-product extension; q3_k on AVX2, AVX-VNNI and
    AVX-512; q2_k on AVX-512 alone; q5_k and q6_k on AVX2 alone (the AVX-VNNI and AVX-512 tables have
    products of their own for them on the file's layout). The others multiply it with the scalar reference
    loops, so the loader keeps the file's layout there."""
    return _core.has_native_r16(fmt, isa)


def amx_min_tokens(fmt: str, isa: str | None = None) -> int:
    """From how many tokens the kernels (the active ones, or isa's) multiply weights of format fmt (a file
    format, or NAME_r16) on AMX tiles in bf16: 0 where they do not (every table but "amx", and the formats
    without an AMX decoder there), so the int8 products stay in use."""
    return _core.amx_min_tokens(fmt, isa)


def matmul(x: np.ndarray, w: np.ndarray, fmt: str, *, isa: str | None = None) -> np.ndarray:
    """y[M, N] = x[M, K] @ W[N, K]^T with W in format fmt; activations quantized on the fly."""
    return _core.matmul(x, w, fmt, isa=isa)


def matmul_many(x: np.ndarray, weights, *, isa: str | None = None) -> list[np.ndarray]:
    """[x @ W^T for (W, fmt) in weights]: the products of one activation matrix with several weights
    (the same K), x quantized once per activation format and one pass of the thread pool over every
    row; each result equals matmul(x, W, fmt) bit for bit."""
    weights = list(weights)
    return _core.matmul_many(x, [w for w, _ in weights], [f for _, f in weights], isa=isa)


def moe_block(x, router, top_k, gate, up, down, gate_fmt, down_fmt, gate_sh, up_sh, down_sh, shexp_gate, *,
              isa=None, prefetch: bool = False) -> tuple[np.ndarray, int]:
    """A whole MoE feed-forward with its shared expert, in one call:
    moe(x; top-k of softmax(x @ router^T)) + sigmoid(x @ shexp_gate^T) * down_sh(silu(gate_sh(x)) * up_sh(x)).
    router, gate_sh, up_sh, down_sh, shexp_gate: (uint8 rows, format) pairs; gate/up/down: stacked
    experts (gate and up share gate_fmt). prefetch: routed experts not wholly in memory (the first or last
    page of a slice is not) are requested from the disk together (MADV_WILLNEED) and computed last; same
    result.
    Returns (out [M, H], number of distinct experts used)."""
    return _core.moe_block(x, router, int(top_k), gate, up, down, gate_fmt, down_fmt, gate_sh, up_sh, down_sh,
                           shexp_gate, isa=isa, prefetch=bool(prefetch))


# A model's per-layer weights, checked once, for the fused sub-layers: LayerStack(n_layer, H, eps);
# .set_gdn(i, ...) / .set_attn(i, ...) / .set_moe(i, ...) at load, then per forward
# .gdn(i, x, conv_state, ssm_state, commit) (x += the GDN mixer of rms_norm(x)),
# .attn(i, x, k_cache, v_cache, n0, block) (x += the attention mixer; the span's keys and values written
# to cache rows [n0, n0 + T)) and .moe(i, x, prefetch) (x += moe_block(rms_norm(x)); returns the
# distinct experts used), x updated in place (csrc/layers.h).
LayerStack = _core.LayerStack


def experts_prefetched() -> int:
    """How many experts moe_block(prefetch=True) has requested from the disk in this process."""
    return _core.experts_prefetched()


def moe(
    x: np.ndarray,
    ids: np.ndarray,
    weights: np.ndarray,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    gate_fmt: str,
    up_fmt: str | None = None,
    down_fmt: str | None = None,
    *,
    isa: str | None = None,
) -> tuple[np.ndarray, int]:
    """sum_j weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)) with e = ids[t, j].

    gate, up: [E, I, row_bytes(H)]; down: [E, H, row_bytes(I)]. Tokens are grouped per expert and
    each used expert runs one GEMM. Returns (out [M, H], number of distinct experts used).
    """
    return _core.moe(
        x, ids, weights, gate, up, down, gate_fmt, up_fmt or gate_fmt, down_fmt or gate_fmt, isa=isa
    )
