// Quantizers and dequantizers for the GGUF block formats (scalar; the file-format reference).
#pragma once

#include <cmath>
#include <cstring>

#include "formats.h"

namespace clover {

// Quantize n_rows rows of k floats (k a multiple of the block size) into dst. Matches
// gguf.quants byte for byte for Q8_0, Q4_0, F16 and BF16, and ggml's reference quantizers
// (quantize_row_*_ref) for Q4_K, Q5_K and Q6_K; Q2_K, Q3_K, IQ4_NL and IQ4_XS as ggml_quantize_chunk
// without an importance matrix (quantize_rows_lowbit).
void quantize_rows(Type t, const float* src, void* dst, int64_t n_rows, int64_t k);

// Whether quantize_rows can write type t (every format dequantizes; IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS,
// IQ1_S, IQ1_M and MXFP4 have no quantizer here yet).
bool has_quantizer(Type t);
// The low-bit and legacy formats (quants_lowbit.cpp): false for a type they do not handle.
bool dequantize_row_lowbit(Type t, const uint8_t* x, float* y, int64_t k);
bool quantize_row_lowbit(Type t, const float* x, uint8_t* y, int64_t k);

// Q2_K, Q3_K, IQ4_NL and IQ4_XS (quants_kquant_low.cpp), and Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K with or
// without quant_weights: nrow rows of n_per_row floats (a multiple of the block size) into dst, byte for byte
// as llama.cpp b11434's ggml_quantize_chunk writes them (quantize_q2_K, quantize_q3_K, quantize_iq4_nl,
// quantize_iq4_xs, quantize_q4_0, ...). quant_weights: the importance matrix row for this tensor (n_per_row
// floats, the same for every row) or nullptr. False for a type it does not handle.
bool quantize_rows_lowbit(Type t, const float* src, uint8_t* dst, int64_t nrow, int64_t n_per_row,
                          const float* quant_weights);
// Whether quantize_rows_lowbit handles t (the types whose quantizers use an importance matrix: those above,
// Q4_0, Q4_1, Q5_0, Q5_1, and Q4_K, Q5_K, Q6_K through quantize_k_rows).
bool takes_imatrix(Type t);

// Q4_K, Q5_K and Q6_K rows (quants.cpp): without quant_weights ggml's reference quantizers (quantize_rows'),
// with them byte for byte as ggml_quantize_chunk (quantize_row_q4_K_impl, q5_K, q6_K).
void quantize_k_rows(Type t, const float* src, uint8_t* dst, int64_t nrow, int64_t n_per_row, const float* quant_weights);

// ggml's weighted fits (quants_kquant_low.cpp), float for float: make_qkx3_quants with weights and without
// use_mad (fit_qkx3), make_qp_quants (fit_qp), make_qx_quants with rmse_type 1 and weights (fit_qx_weighted).
float fit_qkx3(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, uint8_t* Laux,
               float rmin, float rdelta, int nstep);
float fit_qp(int n, int nmax, const float* x, uint8_t* L, const float* quant_weights);
float fit_qx_weighted(int n, int nmax, const float* x, int8_t* L, const float* qw);

// Round to nearest, ties to even, via the float mantissa (ggml's nearest_int; |f| <= 2^22).
inline int nearest_int(float f) {
    const float v = f + 12582912.f;
    int32_t i;
    std::memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

// Dequantize n_rows rows of k weights into fp32 (the _r16 layouts: n_rows a multiple of 16).
void dequantize_rows(Type t, const void* src, float* dst, int64_t n_rows, int64_t k);

// q4_K rows in groups of 16 -> block_q4_K_r16: groups [g0, g1) of the matrix at src (rows of src_row_bytes),
// group g written at dst + g * 16 * row_bytes(q4_k_r16, k). Lossless: the same weights.
void repack_q4_K_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst);
void dequantize_q4_K_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k);
// q2_K rows in groups of 16 -> block_q2_K_r16, as repack_q4_K_r16 (row share 84 bytes, as the file). Lossless.
void repack_q2_K_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst);
void dequantize_q2_K_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k);
// q3_K rows in groups of 16 -> block_q3_K_r16, as repack_q4_K_r16 (row share 114 bytes). Lossless.
void repack_q3_K_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst);
void dequantize_q3_K_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k);
// iq4_xs rows in groups of 16 -> block_iq4_xs_r16 (row share 138 bytes against 136). Lossless.
void repack_iq4_xs_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst);
void dequantize_iq4_xs_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k);
// iq4_nl and mxfp4 rows in groups of 16, 8 blocks (256 weights) per group block -> block_iq4_nl_r16,
// block_mxfp4_r16 (the file's bytes per row). Lossless; k a multiple of 256.
void repack_iq4_nl_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst);
void dequantize_iq4_nl_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k);
void repack_mxfp4_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst);
void dequantize_mxfp4_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k);
// iq3_xxs rows in groups of 16 -> block_iq3_xxs_r16 (4-bit codes; row share 138 bytes against 98). Lossless.
void repack_iq3_xxs_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst);
void dequantize_iq3_xxs_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k);
// iq3_s rows in groups of 16 -> block_iq3_s_r16 (4-bit codes; row share 138 bytes against 110). Lossless.
void repack_iq3_s_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst);
void dequantize_iq3_s_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k);
// q5_K rows in groups of 16 -> block_q5_K_r16 (row share 180 bytes). Lossless.
void repack_q5_K_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst);
void dequantize_q5_K_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k);
// q6_K rows in groups of 16 -> block_q6_K_r16 (the file's 210 bytes per row and super-block). Lossless.
void repack_q6_K_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst);
void dequantize_q6_K_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k);

// The layouts repacked at load: the file's type, the repacked one, and the functions above between them.
struct R16Format {
    Type from, to;
    void (*repack)(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst);
    void (*dequantize)(const uint8_t* src, float* dst, int64_t n_groups, int64_t k);
};
// The entry whose file type or repacked type is t; nullptr for a type that is neither.
const R16Format* r16_format_of(Type t);

// The inner searches of the k-quant reference quantizers (ggml's make_qkx2_quants and
// make_qx_quants with rmse_type 1); an ISA file may provide a faster twin.
struct QuantSearch {
    float (*qkx2)(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, uint8_t* Laux,
                  float rmin, float rdelta, int nstep);
    float (*qx)(int n, int nmax, const float* x, int8_t* L);
};
const QuantSearch& quant_search_ref();
// make_qkx2_quants with ggml's use_mad: errors summed as w * |d| (the Q2_K quantizer's fit)
float make_qkx2_quants_mad(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                           uint8_t* Laux, float rmin, float rdelta, int nstep);
const QuantSearch* quant_search_avx2();  // null where the build has no AVX2 file
// fast = true: use the active ISA's search (AVX2 results may differ from the scalar ones in rare
// near-ties); false: the scalar reference everywhere.
void set_fast_quant_search(bool fast);

// Activation quantizers shared by every ISA so that all paths see identical integer inputs. Where
// the CPU has AVX2 they run an AVX2 twin that gives the same bytes (the same float operations per
// value, round half to even, integer group sums).
void quantize_act_q8_a(const float* x, block_q8_a* y, int64_t k);
void quantize_act_q8_K(const float* x, block_q8_K* y, int64_t k);
struct ActQuant {
    void (*q8_a)(const float* x, block_q8_a* y, int64_t k);
    void (*q8_K)(const float* x, block_q8_K* y, int64_t k);
};
const ActQuant& act_quant_ref();
// An activation block's multiplier 1 / d (d = amax / 127): 0 where it is not finite (an all-zero block, or
// amax under ~1e-36), so such a block quantizes to zeros on every path.
static inline float act_inverse_scale(float d) {
    const float id = 1.f / d;
    return __builtin_isfinite(id) ? id : 0.f;  // (the builtin: no weak std:: copy at -O0)
}
// An activation block holding a NaN or an Inf, on every path: scale NaN, quants and sums 0, so each
// product with it is NaN and the forward's check of its logits reports the corrupt weights that made it
// (int8 quants would carry finite garbage on: a NaN cast to an integer is undefined, and max() skips it).
// (static: both ISA files include this; an unoptimised build must not share one copy between them.)
static inline void act_block_nonfinite(float* d, int8_t* qs, int n, int16_t* bsums = nullptr, int n_sums = 0) {
    *d = NAN;
    std::memset(qs, 0, (size_t)n);
    if (bsums) std::memset(bsums, 0, sizeof(int16_t) * (size_t)n_sums);
}
// Activation rows [m0, m1) of X[., K] in the format weights of type t multiply against (act_format:
// q8_a, q8_K or fp32), row m at out + m * act_row_bytes(t, K); on the calling thread.
void quantize_act_rows(Type t, const float* X, int64_t m0, int64_t m1, int64_t K, uint8_t* out);
const ActQuant* act_quant_avx2();  // null where the build has no AVX2 file

}  // namespace clover
