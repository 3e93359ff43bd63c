// The per-ISA kernel table. Each ISA file (kernels_ref.cpp, kernels_avx2.cpp, kernels_avx512.cpp, kernels_neon.cpp)
// fills one; dispatch.cpp picks one at import.
#pragma once

#include "formats.h"

namespace clover {

// Y[m * ldy + n] = dot(W row n, X row m) for n in [n0, n1), m in [0, M).
// W: weight rows of `w_row_bytes` bytes in GGUF layout; X: activation rows of `x_row_bytes` bytes in
// act_format(type) (fp32, block_q8_a or block_q8_K); K: weights per row.
using gemm_fn = void (*)(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K,
                         int M, float* Y, int64_t ldy, int64_t n0, int64_t n1);

// AMX prompt products (kernels_amx.cpp): weights dequantized to bf16 panels, activations rounded to bf16.
struct AmxOps {
    // From how many tokens a product with weights of layout t runs on the tiles (0: never, the int8 products).
    int (*min_tokens)(Type t);
    // X (M x K fp32) -> rows m0 .. m0 + M - 1 of Xb, bf16 (rounded to nearest even) in the tiles' layout: tiles
    // of 16 rows, 16 K bf16 each, chunk c of a tile (weights 32 c .. 32 c + 31 of its 16 rows) 1 KB at 512 c.
    // K a multiple of 32.
    void (*to_bf16)(const float* X, int64_t M, int64_t K, uint16_t* Xb, int64_t m0);
    // Y[m * ldy + n] = dot(W row n, Xb row m) for n in [n0, n1), m < M (Xb as to_bf16 writes it); W holds
    // `rows` rows of type t in the layout the loader left (min_tokens(t) > 0; a repacked type: n0 a multiple
    // of 16), K a multiple of 32. Xb is read in whole tiles of 16 rows (rows M .. M rounded up to 16 must be
    // readable; they affect nothing stored).
    void (*gemm)(Type t, const uint8_t* W, size_t row_bytes, int64_t rows, int64_t K, const uint16_t* Xb, int64_t M,
                 float* Y, int64_t ldy, int64_t n0, int64_t n1);
};

struct Kernels {
    const char* isa;
    // The SIMD family of the ISA's other code (model operators, quantizer searches): "ref", "avx2" (the
    // avx512 and avxvnni tables too: the AVX2 table with other k-quant products) or "neon".
    const char* family;
    gemm_fn gemm_f32;
    gemm_fn gemm_f16;
    gemm_fn gemm_bf16;
    gemm_fn gemm_q8_0;
    gemm_fn gemm_q4_0;
    gemm_fn gemm_q4_K;
    gemm_fn gemm_q5_K;
    gemm_fn gemm_q6_K;
    // q4_K repacked at load (block_q4_K_r16): rows [n0, n1) in whole groups of 16 on SIMD tables. Tables
    // without a kernel of their own carry the reference one; the loader repacks only for those that have one
    // (has_native_q4_K_r16).
    gemm_fn gemm_q4_K_r16;
    // The low-bit and legacy formats (lowbit.h), in GGUF type order. The reference table has them all; a
    // SIMD table leaves null what it has no kernel of its own for, and gemm() gives the reference one.
    gemm_fn gemm_q4_1 = nullptr, gemm_q5_0 = nullptr, gemm_q5_1 = nullptr, gemm_q2_K = nullptr, gemm_q3_K = nullptr,
            gemm_iq2_xxs = nullptr, gemm_iq2_xs = nullptr, gemm_iq3_xxs = nullptr, gemm_iq4_nl = nullptr,
            gemm_iq3_s = nullptr, gemm_iq2_s = nullptr, gemm_iq4_xs = nullptr, gemm_mxfp4 = nullptr,
            gemm_iq1_s = nullptr, gemm_iq1_m = nullptr;
    // q2_K, q3_K, q5_K, q6_K, iq4_xs, iq3_xxs and iq3_s repacked at load (block_q2_K_r16, ...), as gemm_q4_K_r16; null where the table
    // has no kernel of its own (the loader then keeps the file's layout: has_native_r16).
    gemm_fn gemm_q2_K_r16 = nullptr, gemm_q3_K_r16 = nullptr, gemm_q5_K_r16 = nullptr, gemm_q6_K_r16 = nullptr, gemm_iq4_xs_r16 = nullptr,
            gemm_iq3_xxs_r16 = nullptr, gemm_iq3_s_r16 = nullptr;
    // iq4_nl and mxfp4 repacked at load (block_iq4_nl_r16, block_mxfp4_r16); their activations stay q8_0-like
    // blocks of 32 (block_q8_a), as for the file's layout.
    gemm_fn gemm_iq4_nl_r16 = nullptr, gemm_mxfp4_r16 = nullptr;

    // The AMX table's prompt products (null elsewhere): ops.cpp uses them from amx->min_tokens tokens.
    const AmxOps* amx = nullptr;

    // The product for weights of type t (null for a type no kernel multiplies).
    gemm_fn gemm(Type t) const;
};

const Kernels& kernels_ref();
void gemm_q4_K_r16_ref(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K, int M,
                       float* Y, int64_t ldy, int64_t n0, int64_t n1);
// Whether the table multiplies q4_K_r16 weights with a kernel of its own (not the reference loops).
inline bool has_native_q4_K_r16(const Kernels& k) { return k.gemm_q4_K_r16 != &gemm_q4_K_r16_ref; }
void gemm_q2_K_r16_ref(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K, int M,
                       float* Y, int64_t ldy, int64_t n0, int64_t n1);
void gemm_q3_K_r16_ref(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K, int M,
                       float* Y, int64_t ldy, int64_t n0, int64_t n1);
void gemm_q5_K_r16_ref(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K, int M,
                       float* Y, int64_t ldy, int64_t n0, int64_t n1);
void gemm_q6_K_r16_ref(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K, int M,
                       float* Y, int64_t ldy, int64_t n0, int64_t n1);
void gemm_iq4_xs_r16_ref(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K, int M,
                         float* Y, int64_t ldy, int64_t n0, int64_t n1);
void gemm_iq3_xxs_r16_ref(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K, int M,
                          float* Y, int64_t ldy, int64_t n0, int64_t n1);
void gemm_iq3_s_r16_ref(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K, int M,
                        float* Y, int64_t ldy, int64_t n0, int64_t n1);
void gemm_iq4_nl_r16_ref(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K, int M,
                         float* Y, int64_t ldy, int64_t n0, int64_t n1);
void gemm_mxfp4_r16_ref(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K, int M,
                        float* Y, int64_t ldy, int64_t n0, int64_t n1);
// Whether the table multiplies weights of the repacked type t with a kernel of its own: its product for t
// (Kernels::gemm, which falls back to the reference loops where the table has none) is not the reference
// table's.
inline bool has_native_r16(const Kernels& k, Type t) { return k.gemm(t) != kernels_ref().gemm(t); }
// Defined only in builds that compile the ISA file; null when the host compiler cannot target it.
const Kernels* kernels_avx2();
const Kernels* kernels_avx512();  // the AVX2 table with AVX-512 VNNI k-quant kernels
// The AVX-512 VBMI + BITALG products (kernels_avx512_vbmi.cpp) put into the AVX-512 table, on CPUs that report both.
void add_avx512_vbmi(Kernels& k);
bool cpu_has_avx512vbmi_bitalg();
const Kernels* kernels_avxvnni();  // the AVX2 table with AVX-VNNI (256-bit) q4_K/q6_K tiles
const Kernels* kernels_neon();
// The AVX-512 table with AMX prompt products; null in builds without kernels_amx.cpp.
const Kernels* kernels_amx();
// Whether the CPU has AMX-TILE, AMX-BF16 and AVX-512 BF16 and the OS saves the tile state (Linux).
bool cpu_has_amx();
// Whether the OS grants this process the tile state (asked for on the first call; before any tile instruction).
bool amx_tiles_granted();

}  // namespace clover
