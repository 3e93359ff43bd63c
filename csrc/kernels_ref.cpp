// Scalar reference kernels: plain loops, exact integer block dots, the twin every SIMD path is
// checked against.
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "lowbit.h"

namespace clover {

namespace {

template <typename Load>
void gemm_float(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t K, int M,
                float* Y, int64_t ldy, int64_t n0, int64_t n1, Load load) {
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t* w = W + n * w_row_bytes;
        for (int m = 0; m < M; m++) {
            const float* x = (const float*)(X + m * x_row_bytes);
            float sum = 0.f;
            for (int64_t k = 0; k < K; k++) sum += load(w, k) * x[k];
            Y[m * ldy + n] = sum;
        }
    }
}

void gemm_f32(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y, int64_t ldy,
              int64_t n0, int64_t n1) {
    gemm_float(W, wb, X, xb, K, M, Y, ldy, n0, n1, [](const uint8_t* w, int64_t k) { return ((const float*)w)[k]; });
}

void gemm_f16(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y, int64_t ldy,
              int64_t n0, int64_t n1) {
    gemm_float(W, wb, X, xb, K, M, Y, ldy, n0, n1,
               [](const uint8_t* w, int64_t k) { return fp16_to_f32(((const uint16_t*)w)[k]); });
}

void gemm_bf16(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y, int64_t ldy,
               int64_t n0, int64_t n1) {
    gemm_float(W, wb, X, xb, K, M, Y, ldy, n0, n1,
               [](const uint8_t* w, int64_t k) { return bf16_to_f32(((const uint16_t*)w)[k]); });
}

// Blocked integer dot: sum over blocks of (weight scale * act scale * integer dot).
template <typename WBlock, typename BlockDot>
void gemm_blocks(const uint8_t* W, size_t w_row_bytes, const uint8_t* X, size_t x_row_bytes, int64_t nb, int M,
                 float* Y, int64_t ldy, int64_t n0, int64_t n1, BlockDot dot) {
    for (int64_t n = n0; n < n1; n++) {
        const WBlock* w = (const WBlock*)(W + n * w_row_bytes);
        for (int m = 0; m < M; m++) {
            const uint8_t* x = X + m * x_row_bytes;
            float sum = 0.f;
            for (int64_t b = 0; b < nb; b++) sum += dot(w[b], x, b);
            Y[m * ldy + n] = sum;
        }
    }
}

void gemm_q8_0(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y, int64_t ldy,
               int64_t n0, int64_t n1) {
    gemm_blocks<block_q8_0>(W, wb, X, xb, K / QK, M, Y, ldy, n0, n1,
                            [](const block_q8_0& w, const uint8_t* xr, int64_t b) {
                                const block_q8_a& x = ((const block_q8_a*)xr)[b];
                                int32_t s = 0;
                                for (int j = 0; j < QK; j++) s += (int32_t)w.qs[j] * x.qs[j];
                                return fp16_to_f32(w.d) * x.d * (float)s;
                            });
}

void gemm_q4_0(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y, int64_t ldy,
               int64_t n0, int64_t n1) {
    gemm_blocks<block_q4_0>(W, wb, X, xb, K / QK, M, Y, ldy, n0, n1,
                            [](const block_q4_0& w, const uint8_t* xr, int64_t b) {
                                const block_q8_a& x = ((const block_q8_a*)xr)[b];
                                int32_t s = 0;
                                for (int j = 0; j < QK / 2; j++) {
                                    s += ((w.qs[j] & 0xf) - 8) * x.qs[j];
                                    s += ((w.qs[j] >> 4) - 8) * x.qs[j + QK / 2];
                                }
                                return fp16_to_f32(w.d) * x.d * (float)s;
                            });
}

// q4_K / q5_K: sum_j d*sc_j*dot(q_j, x_j) - dmin*m_j*sum(x_j), the sums from q8_K bsums; the scales and
// mins decoded (decode_scales_q4_K, or as q4_k_r16 holds them).
template <bool FIVE_BIT>
float dot_qk_super(const uint8_t* sc, const uint8_t* mn, uint16_t dh, uint16_t dminh, const uint8_t* qs,
                   const uint8_t* qh, const block_q8_K& x) {
    int32_t sum_q = 0, sum_m = 0;
    for (int j = 0; j < 8; j++) {
        const uint8_t* q = qs + 32 * (j / 2);
        const int shift = (j & 1) * 4;
        int32_t s = 0;
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> shift) & 0xf;
            if (FIVE_BIT) v += ((qh[l] >> j) & 1) << 4;
            s += v * x.qs[32 * j + l];
        }
        sum_q += sc[j] * s;
        sum_m += mn[j] * (x.bsums[2 * j] + x.bsums[2 * j + 1]);
    }
    return x.d * (fp16_to_f32(dh) * (float)sum_q - fp16_to_f32(dminh) * (float)sum_m);
}

void gemm_q4_K(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y, int64_t ldy,
               int64_t n0, int64_t n1) {
    gemm_blocks<block_q4_K>(W, wb, X, xb, K / QK_K, M, Y, ldy, n0, n1,
                            [](const block_q4_K& w, const uint8_t* xr, int64_t b) {
                                uint8_t sc[8], mn[8];
                                decode_scales_q4_K(w.scales, sc, mn);
                                return dot_qk_super<false>(sc, mn, w.d, w.dmin, w.qs, nullptr,
                                                           ((const block_q8_K*)xr)[b]);
                            });
}

void gemm_q5_K(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y, int64_t ldy,
               int64_t n0, int64_t n1) {
    gemm_blocks<block_q5_K>(W, wb, X, xb, K / QK_K, M, Y, ldy, n0, n1,
                            [](const block_q5_K& w, const uint8_t* xr, int64_t b) {
                                uint8_t sc[8], mn[8];
                                decode_scales_q4_K(w.scales, sc, mn);
                                return dot_qk_super<true>(sc, mn, w.d, w.dmin, w.qs, w.qh,
                                                          ((const block_q8_K*)xr)[b]);
                            });
}

// q6_K: d * sum_i sc_i * dot(q_i - 32, x_i) over 16 groups of 16.
void gemm_q6_K(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y, int64_t ldy,
               int64_t n0, int64_t n1) {
    gemm_blocks<block_q6_K>(W, wb, X, xb, K / QK_K, M, Y, ldy, n0, n1,
                            [](const block_q6_K& w, const uint8_t* xr, int64_t b) {
                                const block_q8_K& x = ((const block_q8_K*)xr)[b];
                                int32_t total = 0;
                                for (int half = 0; half < 2; half++) {
                                    const uint8_t* ql = w.ql + 64 * half;
                                    const uint8_t* qh = w.qh + 32 * half;
                                    const int8_t* sc = w.scales + 8 * half;
                                    const int8_t* xq = x.qs + 128 * half;
                                    for (int l = 0; l < 32; l++) {
                                        const int is = l / 16;
                                        const int q1 = (int)((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32;
                                        const int q2 = (int)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                                        const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                                        const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                                        total += sc[is] * q1 * xq[l] + sc[is + 2] * q2 * xq[l + 32] +
                                                 sc[is + 4] * q3 * xq[l + 64] + sc[is + 6] * q4 * xq[l + 96];
                                    }
                                }
                                return fp16_to_f32(w.d) * x.d * (float)total;
                            });
}

}  // namespace

// q4_K repacked by 16 rows: each row's super-blocks gathered back into the file's order and summed by
// dot_qk_super, so the results are gemm_q4_K's bit for bit. Rows [n0, n1) may start and end anywhere.
void gemm_q4_K_r16_ref(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y,
                       int64_t ldy, int64_t n0, int64_t n1) {
    const int64_t nsb = K / QK_K;
    for (int64_t n = n0; n < n1; n++) {
        const block_q4_K_r16* g = (const block_q4_K_r16*)(W + (size_t)(n / R16) * R16 * wb);
        for (int m = 0; m < M; m++) Y[m * ldy + n] = 0.f;
        for (int64_t b = 0; b < nsb; b++) {  // (each output's sum in the order gemm_blocks adds it)
            uint8_t qs[QK_K / 2], sc[8], mn[8];
            r16_row(g[b], (int)(n % R16), qs, sc, mn);
            for (int m = 0; m < M; m++)
                Y[m * ldy + n] += dot_qk_super<false>(sc, mn, g[b].d[n % R16], g[b].dmin[n % R16], qs, nullptr,
                                                      ((const block_q8_K*)(X + m * xb))[b]);
        }
    }
}

// q3_K, q5_K, q6_K, iq4_xs, iq3_xxs, iq3_s, iq4_nl and mxfp4 repacked by 16 rows: each row gathered back into the file's blocks (r16_row) and
// multiplied by the reference product of the file's type, so the results are its bit for bit. Rows [n0, n1)
// may start and end anywhere.
namespace {
template <typename Packed, typename Block>
void gemm_r16_rows_ref(gemm_fn file_ref, const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M,
                       float* Y, int64_t ldy, int64_t n0, int64_t n1) {
    const int64_t nsb = K / QK_K;
    std::vector<Block> row((size_t)nsb);
    for (int64_t n = n0; n < n1; n++) {
        const Packed* g = (const Packed*)(W + (size_t)(n / R16) * R16 * wb);
        for (int64_t b = 0; b < nsb; b++) r16_row(g[b], (int)(n % R16), row[(size_t)b]);
        file_ref((const uint8_t*)row.data(), sizeof(Block) * nsb, X, xb, K, M, Y + n, ldy, 0, 1);
    }
}
}  // namespace

void gemm_q2_K_r16_ref(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y,
                       int64_t ldy, int64_t n0, int64_t n1) {
    gemm_r16_rows_ref<block_q2_K_r16, block_q2_K>(kernels_ref().gemm_q2_K, W, wb, X, xb, K, M, Y, ldy, n0, n1);
}

void gemm_q3_K_r16_ref(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y,
                       int64_t ldy, int64_t n0, int64_t n1) {
    gemm_r16_rows_ref<block_q3_K_r16, block_q3_K>(kernels_ref().gemm_q3_K, W, wb, X, xb, K, M, Y, ldy, n0, n1);
}

void gemm_q5_K_r16_ref(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y,
                       int64_t ldy, int64_t n0, int64_t n1) {
    gemm_r16_rows_ref<block_q5_K_r16, block_q5_K>(kernels_ref().gemm_q5_K, W, wb, X, xb, K, M, Y, ldy, n0, n1);
}

void gemm_q6_K_r16_ref(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y,
                       int64_t ldy, int64_t n0, int64_t n1) {
    gemm_r16_rows_ref<block_q6_K_r16, block_q6_K>(kernels_ref().gemm_q6_K, W, wb, X, xb, K, M, Y, ldy, n0, n1);
}

void gemm_iq4_xs_r16_ref(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y,
                         int64_t ldy, int64_t n0, int64_t n1) {
    gemm_r16_rows_ref<block_iq4_xs_r16, block_iq4_xs>(kernels_ref().gemm_iq4_xs, W, wb, X, xb, K, M, Y, ldy, n0, n1);
}

void gemm_iq4_nl_r16_ref(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y,
                         int64_t ldy, int64_t n0, int64_t n1) {
    gemm_r16_rows_ref<block_iq4_nl_r16, block_iq4_nl_x8>(kernels_ref().gemm_iq4_nl, W, wb, X, xb, K, M, Y, ldy, n0, n1);
}

void gemm_mxfp4_r16_ref(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y,
                        int64_t ldy, int64_t n0, int64_t n1) {
    gemm_r16_rows_ref<block_mxfp4_r16, block_mxfp4_x8>(kernels_ref().gemm_mxfp4, W, wb, X, xb, K, M, Y, ldy, n0, n1);
}

void gemm_iq3_xxs_r16_ref(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y,
                          int64_t ldy, int64_t n0, int64_t n1) {
    gemm_r16_rows_ref<block_iq3_xxs_r16, block_iq3_xxs>(kernels_ref().gemm_iq3_xxs, W, wb, X, xb, K, M, Y, ldy, n0, n1);
}

void gemm_iq3_s_r16_ref(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y,
                        int64_t ldy, int64_t n0, int64_t n1) {
    gemm_r16_rows_ref<block_iq3_s_r16, block_iq3_s>(kernels_ref().gemm_iq3_s, W, wb, X, xb, K, M, Y, ldy, n0, n1);
}

namespace {

// ---- the low-bit and legacy formats (lowbit.h): integer dots per group, one float expression per block ----

// 32-weight blocks against block_q8_a: d_w * d_x * sum(q x), plus m * d_x * sum(x) for q4_1 / q5_1.
template <typename Block>
void gemm_lowbit32(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y, int64_t ldy,
                   int64_t n0, int64_t n1) {
    constexpr bool MIN = std::is_same_v<Block, block_q4_1> || std::is_same_v<Block, block_q5_1>;
    gemm_blocks<Block>(W, wb, X, xb, K / QK, M, Y, ldy, n0, n1, [](const Block& w, const uint8_t* xr, int64_t b) {
        const block_q8_a& x = ((const block_q8_a*)xr)[b];
        int q[32];
        unpack32(w, q);
        int32_t s = 0, sx = 0;
        for (int j = 0; j < QK; j++) {
            s += q[j] * x.qs[j];
            sx += x.qs[j];
        }
        float d;
        if constexpr (std::is_same_v<Block, block_mxfp4>)
            d = e8m0_to_fp32_half(w.e);
        else
            d = fp16_to_f32(w.d);
        float v = d * x.d * (float)s;
        if constexpr (MIN) v += fp16_to_f32(w.m) * x.d * (float)sx;
        return v;
    });
}

// The constant factor of a super-block format's scales (weight = d * factor * scale * q).
template <typename Block>
constexpr float lowbit_factor() {
    if constexpr (std::is_same_v<Block, block_iq2_xxs> || std::is_same_v<Block, block_iq2_xs> ||
                  std::is_same_v<Block, block_iq2_s>)
        return 0.125f;
    else if constexpr (std::is_same_v<Block, block_iq3_xxs>)
        return 0.25f;
    else if constexpr (std::is_same_v<Block, block_iq1_s> || std::is_same_v<Block, block_iq1_m>)
        return 0.125f;
    else
        return 1.f;
}

// 256-weight super-blocks against block_q8_K: d_x * (d * factor * sum_g scale_g (q_g . x_g) - dmin *
// sum_g min_g bsum_g), the sums over the 16 groups of 16 in int32.
template <typename Block, void (*Unpack)(const Block&, SuperInts&)>
void gemm_lowbit256(const uint8_t* W, size_t wb, const uint8_t* X, size_t xb, int64_t K, int M, float* Y,
                    int64_t ldy, int64_t n0, int64_t n1) {
    const int64_t nsb = K / QK_K;
    SuperInts s;
    for (int64_t n = n0; n < n1; n++) {
        const Block* w = (const Block*)(W + n * wb);
        for (int m = 0; m < M; m++) Y[m * ldy + n] = 0.f;
        for (int64_t b = 0; b < nsb; b++) {
            Unpack(w[b], s);
            const float d = fp16_to_f32(block_d(w[b])) * lowbit_factor<Block>();
            for (int m = 0; m < M; m++) {
                const block_q8_K& x = ((const block_q8_K*)(X + m * xb))[b];
                int32_t sum_q = 0, sum_m = 0;
                for (int g = 0; g < 16; g++) {
                    int32_t dot = 0;
                    for (int l = 0; l < 16; l++) dot += s.q[16 * g + l] * x.qs[16 * g + l];
                    sum_q += s.scale[g] * dot;
                    if constexpr (std::is_same_v<Block, block_q2_K>) sum_m += s.min[g] * x.bsums[g];
                }
                float v = x.d * d * (float)sum_q;
                if constexpr (std::is_same_v<Block, block_q2_K>) v -= x.d * fp16_to_f32(w[b].dmin) * (float)sum_m;
                Y[m * ldy + n] += v;
            }
        }
    }
}

Kernels make_ref() {
    Kernels k = {"ref",     "ref",     gemm_f32,  gemm_f16,  gemm_bf16,         gemm_q8_0,
                 gemm_q4_0, gemm_q4_K, gemm_q5_K, gemm_q6_K, gemm_q4_K_r16_ref};
    k.gemm_q4_1 = gemm_lowbit32<block_q4_1>;
    k.gemm_q5_0 = gemm_lowbit32<block_q5_0>;
    k.gemm_q5_1 = gemm_lowbit32<block_q5_1>;
    k.gemm_iq4_nl = gemm_lowbit32<block_iq4_nl>;
    k.gemm_mxfp4 = gemm_lowbit32<block_mxfp4>;
    k.gemm_q2_K = gemm_lowbit256<block_q2_K, unpack_q2_K>;
    k.gemm_q3_K = gemm_lowbit256<block_q3_K, unpack_q3_K>;
    k.gemm_iq4_xs = gemm_lowbit256<block_iq4_xs, unpack_iq4_xs>;
    k.gemm_iq2_xxs = gemm_lowbit256<block_iq2_xxs, unpack_iq2_xxs>;
    k.gemm_iq2_xs = gemm_lowbit256<block_iq2_xs, unpack_iq2_xs>;
    k.gemm_iq2_s = gemm_lowbit256<block_iq2_s, unpack_iq2_s>;
    k.gemm_iq3_xxs = gemm_lowbit256<block_iq3_xxs, unpack_iq3_xxs>;
    k.gemm_iq3_s = gemm_lowbit256<block_iq3_s, unpack_iq3_s>;
    k.gemm_iq1_s = gemm_lowbit256<block_iq1_s, unpack_iq1_s>;
    k.gemm_iq1_m = gemm_lowbit256<block_iq1_m, unpack_iq1_m>;
    return k;
}

}  // namespace

const Kernels& kernels_ref() {
    static const Kernels table = make_ref();
    return table;
}

gemm_fn Kernels::gemm(Type t) const {
    const Kernels& r = kernels_ref();
    switch (t) {
        case Type::F32: return gemm_f32;
        case Type::F16: return gemm_f16;
        case Type::BF16: return gemm_bf16;
        case Type::Q8_0: return gemm_q8_0;
        case Type::Q4_0: return gemm_q4_0;
        case Type::Q4_K: return gemm_q4_K;
        case Type::Q5_K: return gemm_q5_K;
        case Type::Q6_K: return gemm_q6_K;
        case Type::Q4_K_R16: return gemm_q4_K_r16;
        case Type::Q2_K_R16: return gemm_q2_K_r16 ? gemm_q2_K_r16 : &gemm_q2_K_r16_ref;
        case Type::Q3_K_R16: return gemm_q3_K_r16 ? gemm_q3_K_r16 : &gemm_q3_K_r16_ref;
        case Type::IQ4_XS_R16: return gemm_iq4_xs_r16 ? gemm_iq4_xs_r16 : &gemm_iq4_xs_r16_ref;
        case Type::Q6_K_R16: return gemm_q6_K_r16 ? gemm_q6_K_r16 : &gemm_q6_K_r16_ref;
        case Type::Q5_K_R16: return gemm_q5_K_r16 ? gemm_q5_K_r16 : &gemm_q5_K_r16_ref;
        case Type::IQ3_XXS_R16: return gemm_iq3_xxs_r16 ? gemm_iq3_xxs_r16 : &gemm_iq3_xxs_r16_ref;
        case Type::IQ3_S_R16: return gemm_iq3_s_r16 ? gemm_iq3_s_r16 : &gemm_iq3_s_r16_ref;
        case Type::IQ4_NL_R16: return gemm_iq4_nl_r16 ? gemm_iq4_nl_r16 : &gemm_iq4_nl_r16_ref;
        case Type::MXFP4_R16: return gemm_mxfp4_r16 ? gemm_mxfp4_r16 : &gemm_mxfp4_r16_ref;
        case Type::Q4_1: return gemm_q4_1 ? gemm_q4_1 : r.gemm_q4_1;
        case Type::Q5_0: return gemm_q5_0 ? gemm_q5_0 : r.gemm_q5_0;
        case Type::Q5_1: return gemm_q5_1 ? gemm_q5_1 : r.gemm_q5_1;
        case Type::IQ4_NL: return gemm_iq4_nl ? gemm_iq4_nl : r.gemm_iq4_nl;
        case Type::MXFP4: return gemm_mxfp4 ? gemm_mxfp4 : r.gemm_mxfp4;
        case Type::Q2_K: return gemm_q2_K ? gemm_q2_K : r.gemm_q2_K;
        case Type::Q3_K: return gemm_q3_K ? gemm_q3_K : r.gemm_q3_K;
        case Type::IQ4_XS: return gemm_iq4_xs ? gemm_iq4_xs : r.gemm_iq4_xs;
        case Type::IQ2_XXS: return gemm_iq2_xxs ? gemm_iq2_xxs : r.gemm_iq2_xxs;
        case Type::IQ2_XS: return gemm_iq2_xs ? gemm_iq2_xs : r.gemm_iq2_xs;
        case Type::IQ2_S: return gemm_iq2_s ? gemm_iq2_s : r.gemm_iq2_s;
        case Type::IQ3_XXS: return gemm_iq3_xxs ? gemm_iq3_xxs : r.gemm_iq3_xxs;
        case Type::IQ3_S: return gemm_iq3_s ? gemm_iq3_s : r.gemm_iq3_s;
        case Type::IQ1_S: return gemm_iq1_s ? gemm_iq1_s : r.gemm_iq1_s;
        case Type::IQ1_M: return gemm_iq1_m ? gemm_iq1_m : r.gemm_iq1_m;
    }
    return nullptr;
}

}  // namespace clover
