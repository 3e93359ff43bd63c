// Scalar quantizers and dequantizers. This file is compiled without ISA flags and with
// -ffp-contract=off so that float results are the same as numpy's and ggml's reference code.
#include "quants.h"

#include "dispatch.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace clover {

namespace {

constexpr float GROUP_MAX_EPS = 1e-15f;  // ggml-quants.c: a group below this is all zero

// numpy's np_roundf in gguf.quants: round half away from zero.
inline float round_away(float x) { return std::round(x); }

// ---- Q8_0 and Q4_0, exactly as gguf.quants computes them ----

void quantize_row_q8_0(const float* x, block_q8_0* y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++) {
        const float* xb = x + i * QK;
        float amax = 0.f;
        for (int j = 0; j < QK; j++) amax = std::max(amax, std::fabs(xb[j]));
        const float d = amax / 127.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        y[i].d = f32_to_fp16(d);
        for (int j = 0; j < QK; j++) y[i].qs[j] = (int8_t)round_away(xb[j] * id);
    }
}

void quantize_row_q4_0(const float* x, block_q4_0* y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++) {
        const float* xb = x + i * QK;
        float amax = 0.f, max = 0.f;  // max: the value with the largest magnitude, first one wins
        for (int j = 0; j < QK; j++) {
            if (amax < std::fabs(xb[j])) {
                amax = std::fabs(xb[j]);
                max = xb[j];
            }
        }
        const float d = max / -8.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        y[i].d = f32_to_fp16(d);
        for (int j = 0; j < QK / 2; j++) {
            const int q0 = std::min(15, (int)(int8_t)(xb[j] * id + 8.5f));
            const int q1 = std::min(15, (int)(int8_t)(xb[j + QK / 2] * id + 8.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

// ---- k-quants: ggml's reference quantizers (ggml-quants.c) ----

// Weighted fit of x ~= scale * L - min with L in 0..nmax, searching nstep candidate scales around
// nmax / (max - min) (ggml's make_qkx2_quants): each candidate refit by least squares, the one with the
// smallest error kept, the error summed as w * d^2 or (MAD, ggml's use_mad, for Q2_K) as w * |d|.
template <bool MAD>
float qkx2_fit(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, uint8_t* Laux,
               float rmin, float rdelta, int nstep) {
    const auto err = [](float diff) { return MAD ? std::fabs(diff) : diff * diff; };  // (ggml b11434 squares first)
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        min = std::min(min, x[i]);
        max = std::max(max, x[i]);
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        std::memset(L, 0, n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)std::max(0, std::min(nmax, l));
        best_error += weights[i] * err(scale * L[i] + min - x[i]);
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = std::max(0, std::min(nmax, l));
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) cur_error += weights[i] * err(this_scale * Laux[i] + this_min - x[i]);
            if (cur_error < best_error) {
                std::memcpy(L, Laux, n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep) {
    return qkx2_fit<false>(n, nmax, x, weights, L, the_min, Laux, rmin, rdelta, nstep);
}

// Symmetric fit x ~= scale * (L - nmax), refined over 18 candidate scales with weights x^2
// (make_qx_quants with rmse_type 1, no importance matrix).
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        std::memset(L, 0, n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = std::max(-nmax, std::min(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0.f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * x[i]);
            l = std::max(-nmax, std::min(nmax - 1, l));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                const int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + std::max(-nmax, std::min(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

const QuantSearch REF_SEARCH = {make_qkx2_quants, make_qx_quants};
const QuantSearch* g_search = nullptr;  // chosen on first use

const QuantSearch& search() {
    if (!g_search) set_fast_quant_search(true);
    return *g_search;
}

// Requantize a q4_K / q5_K super-block's weights against its stored fp16 d / dmin and 6-bit scales and mins
// (L: levels 0..nmax); a sub-block whose scale is zero keeps the levels of its fit.
void requant_k_superblock(const float* x, int nmax, uint16_t d16, uint16_t dmin16, const uint8_t* scales12, uint8_t* L) {
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        scale_min_k4(j, scales12, &sc, &m);
        const float d = fp16_to_f32(d16) * sc;
        if (d == 0.f) continue;
        const float dm = fp16_to_f32(dmin16) * m;
        for (int ii = 0; ii < 32; ++ii) {
            const int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)std::max(0, std::min(nmax, l));
        }
    }
}

// Fit 8 sub-block (scale, min) pairs, quantize them to 6 bits against fp16 d / dmin, and
// requantize the weights against the rounded scales (shared by q4_K and q5_K): quantize_row_q4_K_ref's fit.
void fit_k_superblock(const float* x, int nmax, uint16_t* d_out, uint16_t* dmin_out, uint8_t* scales12,
                      uint8_t* L) {
    uint8_t Laux[32];
    float weights[32], mins[8], scales[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = std::sqrt(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
        const float rmin = nmax == 15 ? -1.f : -0.5f;
        const int nstep = nmax == 15 ? 20 : 15;
        scales[j] = search().qkx2(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
        max_scale = std::max(max_scale, scales[j]);
        max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    std::memset(scales12, 0, 12);
    for (int j = 0; j < 8; ++j) {
        const uint8_t ls = (uint8_t)std::min(63, nearest_int(inv_scale * scales[j]));
        const uint8_t lm = (uint8_t)std::min(63, nearest_int(inv_min * mins[j]));
        if (j < 4) {
            scales12[j] = ls;
            scales12[j + 4] = lm;
        } else {
            scales12[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            scales12[j - 4] |= (ls >> 4) << 6;
            scales12[j] |= (lm >> 4) << 6;
        }
    }
    *d_out = f32_to_fp16(max_scale / 63.f);
    *dmin_out = f32_to_fp16(max_min / 63.f);
    requant_k_superblock(x, nmax, *d_out, *dmin_out, scales12, L);
}

// The same with an importance matrix (quantize_row_q4_K_impl / q5_K_impl): weights qw * sqrt(sigma^2 + x^2),
// sigma^2 = 2 mean(x^2) over the super-block; make_qkx3_quants per sub-block; the 8 scales and 8 mins fitted to
// 6 bits by make_qp_quants against the sub-blocks' summed weights (q5_K clamps the codes to 63, q4_K does not).
void fit_k_superblock_imatrix(const float* x, int nmax, const float* qw, uint16_t* d_out, uint16_t* dmin_out,
                              uint8_t* scales12, uint8_t* L) {
    uint8_t Laux[32], Ls[8], Lm[8];
    float weights[32], sw[8], mins[8], scales[8];
    float sum_x2 = 0;
    for (int l = 0; l < QK_K; ++l) sum_x2 += x[l] * x[l];
    const float sigma2 = 2 * sum_x2 / QK_K;
    for (int j = 0; j < 8; ++j) {
        for (int l = 0; l < 32; ++l) weights[l] = qw[32 * j + l] * std::sqrt(sigma2 + x[32 * j + l] * x[32 * j + l]);
        float sumw = 0;
        for (int l = 0; l < 32; ++l) sumw += weights[l];
        sw[j] = sumw;
        scales[j] = fit_qkx3(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36);
    }
    const float d_block = fit_qp(8, 63, scales, Ls, sw);
    const float m_block = fit_qp(8, 63, mins, Lm, sw);
    for (int j = 0; j < 8; ++j) {
        uint8_t ls = Ls[j], lm = Lm[j];
        if (nmax == 31) {
            ls = std::min<uint8_t>(63, ls);
            lm = std::min<uint8_t>(63, lm);
        }
        if (j < 4) {
            scales12[j] = ls;
            scales12[j + 4] = lm;
        } else {
            scales12[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
            scales12[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales12[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = f32_to_fp16(d_block);
    *dmin_out = f32_to_fp16(m_block);
    requant_k_superblock(x, nmax, *d_out, *dmin_out, scales12, L);
}

// One super-block's fit: with importance weights (the super-block's share of the row's) or without.
void fit_k(const float* x, int nmax, const float* qw, uint16_t* d, uint16_t* dmin, uint8_t* scales12, uint8_t* L) {
    if (qw)
        fit_k_superblock_imatrix(x, nmax, qw, d, dmin, scales12, L);
    else
        fit_k_superblock(x, nmax, d, dmin, scales12, L);
}

// qw: the row's importance matrix (k floats) or nullptr
void quantize_row_q4_K(const float* x, block_q4_K* y, int64_t k, const float* qw = nullptr) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        fit_k(x, 15, qw ? qw + QK_K * i : nullptr, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t* q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

void quantize_row_q5_K(const float* x, block_q5_K* y, int64_t k, const float* qw = nullptr) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        fit_k(x, 31, qw ? qw + QK_K * i : nullptr, &y[i].d, &y[i].dmin, y[i].scales, L);
        std::memset(y[i].qh, 0, sizeof(y[i].qh));
        uint8_t* ql = y[i].qs;
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK_K; n += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    y[i].qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    y[i].qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

// q6_K: each group of 16 fitted by make_qx_quants (weights x^2, or with an importance matrix its values:
// quantize_row_q6_K_impl), the 16 scales to int8 against the largest.
void quantize_row_q6_K(const float* x, block_q6_K* y, int64_t k, const float* qw = nullptr) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            const float scale = qw ? fit_qx_weighted(16, 32, x + 16 * ib, L + 16 * ib, qw + QK_K * i + 16 * ib)
                                   : search().qx(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (std::fabs(scale) > max_abs_scale) {
                max_abs_scale = std::fabs(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            std::memset(&y[i], 0, sizeof(block_q6_K));
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = f32_to_fp16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ++ib)
            y[i].scales[ib] = (int8_t)std::min(127, nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = fp16_to_f32(y[i].d) * y[i].scales[j];
            if (d == 0.f) continue;
            for (int ii = 0; ii < 16; ++ii) {
                const int l = nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(std::max(-32, std::min(31, l)) + 32);
            }
        }
        uint8_t* ql = y[i].ql;
        uint8_t* qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t q1 = L[j + l] & 0xf, q2 = L[j + l + 32] & 0xf;
                const uint8_t q3 = L[j + l + 64] & 0xf, q4 = L[j + l + 96] & 0xf;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

// ---- dequantizers ----

void dequantize_row_q4_0(const block_q4_0* x, float* y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++) {
        const float d = fp16_to_f32(x[i].d);
        for (int j = 0; j < QK / 2; j++) {
            y[i * QK + j] = d * (float)((x[i].qs[j] & 0xf) - 8);
            y[i * QK + j + QK / 2] = d * (float)((x[i].qs[j] >> 4) - 8);
        }
    }
}

void dequantize_row_q8_0(const block_q8_0* x, float* y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++) {
        const float d = fp16_to_f32(x[i].d);
        for (int j = 0; j < QK; j++) y[i * QK + j] = d * (float)x[i].qs[j];
    }
}

// One q4_K super-block with its scales and mins decoded -> 256 floats.
void dequantize_super_q4_K(uint16_t dh, uint16_t dminh, const uint8_t* sc, const uint8_t* mn, const uint8_t* qs,
                           float* y) {
    const float d = fp16_to_f32(dh), dmin = fp16_to_f32(dminh);
    for (int j = 0; j < 8; j += 2, qs += 32) {
        const float d1 = d * sc[j], m1 = dmin * mn[j], d2 = d * sc[j + 1], m2 = dmin * mn[j + 1];
        for (int l = 0; l < 32; ++l) *y++ = d1 * (float)(qs[l] & 0xf) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * (float)(qs[l] >> 4) - m2;
    }
}

void dequantize_row_q4_K(const block_q4_K* x, float* y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
        uint8_t sc[8], mn[8];
        decode_scales_q4_K(x[i].scales, sc, mn);
        dequantize_super_q4_K(x[i].d, x[i].dmin, sc, mn, x[i].qs, y);
    }
}

void dequantize_row_q5_K(const block_q5_K* x, float* y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = fp16_to_f32(x[i].d), dmin = fp16_to_f32(x[i].dmin);
        const uint8_t* ql = x[i].qs;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 8; j += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            scale_min_k4(j, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            scale_min_k4(j + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * (float)((ql[l] & 0xf) + (x[i].qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * (float)((ql[l] >> 4) + (x[i].qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

void dequantize_row_q6_K(const block_q6_K* x, float* y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = fp16_to_f32(x[i].d);
        const uint8_t* ql = x[i].ql;
        const uint8_t* qh = x[i].qh;
        const int8_t* sc = x[i].scales;
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = (int)((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32;
                const int q2 = (int)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

const TypeInfo TYPES[] = {
    {Type::F32, "f32", 1, 4},
    {Type::F16, "f16", 1, 2},
    {Type::BF16, "bf16", 1, 2},
    {Type::Q8_0, "q8_0", QK, (int)sizeof(block_q8_0)},
    {Type::Q4_0, "q4_0", QK, (int)sizeof(block_q4_0)},
    {Type::Q4_K, "q4_k", QK_K, (int)sizeof(block_q4_K)},
    {Type::Q5_K, "q5_k", QK_K, (int)sizeof(block_q5_K)},
    {Type::Q6_K, "q6_k", QK_K, (int)sizeof(block_q6_K)},
    {Type::Q4_1, "q4_1", QK, (int)sizeof(block_q4_1)},
    {Type::Q5_0, "q5_0", QK, (int)sizeof(block_q5_0)},
    {Type::Q5_1, "q5_1", QK, (int)sizeof(block_q5_1)},
    {Type::IQ4_NL, "iq4_nl", QK, (int)sizeof(block_iq4_nl)},
    {Type::MXFP4, "mxfp4", QK, (int)sizeof(block_mxfp4)},
    {Type::Q2_K, "q2_k", QK_K, (int)sizeof(block_q2_K)},
    {Type::Q3_K, "q3_k", QK_K, (int)sizeof(block_q3_K)},
    {Type::IQ4_XS, "iq4_xs", QK_K, (int)sizeof(block_iq4_xs)},
    {Type::IQ3_S, "iq3_s", QK_K, (int)sizeof(block_iq3_s)},
    {Type::IQ3_XXS, "iq3_xxs", QK_K, (int)sizeof(block_iq3_xxs)},
    {Type::IQ2_S, "iq2_s", QK_K, (int)sizeof(block_iq2_s)},
    {Type::IQ2_XS, "iq2_xs", QK_K, (int)sizeof(block_iq2_xs)},
    {Type::IQ2_XXS, "iq2_xxs", QK_K, (int)sizeof(block_iq2_xxs)},
    {Type::IQ1_S, "iq1_s", QK_K, (int)sizeof(block_iq1_s)},
    {Type::IQ1_M, "iq1_m", QK_K, (int)sizeof(block_iq1_m)},
    // a row's share of its group: 16 rows of a super-block are one block_q4_K_r16
    {Type::Q4_K_R16, "q4_k_r16", QK_K, (int)sizeof(block_q4_K_r16) / R16},
    {Type::Q2_K_R16, "q2_k_r16", QK_K, (int)sizeof(block_q2_K_r16) / R16},
    {Type::Q3_K_R16, "q3_k_r16", QK_K, (int)sizeof(block_q3_K_r16) / R16},
    {Type::IQ4_XS_R16, "iq4_xs_r16", QK_K, (int)sizeof(block_iq4_xs_r16) / R16},
    {Type::Q6_K_R16, "q6_k_r16", QK_K, (int)sizeof(block_q6_K_r16) / R16},
    {Type::Q5_K_R16, "q5_k_r16", QK_K, (int)sizeof(block_q5_K_r16) / R16},
    {Type::IQ3_XXS_R16, "iq3_xxs_r16", QK_K, (int)sizeof(block_iq3_xxs_r16) / R16},
    {Type::IQ3_S_R16, "iq3_s_r16", QK_K, (int)sizeof(block_iq3_s_r16) / R16},
    {Type::IQ4_NL_R16, "iq4_nl_r16", QK_K, (int)sizeof(block_iq4_nl_r16) / R16},
    {Type::MXFP4_R16, "mxfp4_r16", QK_K, (int)sizeof(block_mxfp4_r16) / R16},
};

}  // namespace

const QuantSearch& quant_search_ref() { return REF_SEARCH; }

void set_fast_quant_search(bool fast) {
    const QuantSearch* avx2 = quant_search_avx2();
    g_search = fast && avx2 && std::strcmp(active_kernels().family, "avx2") == 0 ? avx2 : &REF_SEARCH;
}

namespace {
// The repacked layouts: each row's file block put into its lane of the group's block (r16_put) on the way
// in; for q3_K, q5_K, q6_K and iq4_xs gathered back (r16_row) and dequantized as the file type on the way
// out (q4_K's dequantize_q4_K_r16 reads the decoded scales as they are).
template <typename Packed, typename Block>
void repack_r16_rows(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst) {
    const int64_t nsb = k / QK_K;
    for (int64_t g = g0; g < g1; g++)
        for (int r = 0; r < R16; r++) {
            const Block* row = (const Block*)(src + (size_t)(g * R16 + r) * src_row_bytes);
            for (int64_t s = 0; s < nsb; s++) r16_put(row[s], r, ((Packed*)dst)[g * nsb + s]);
        }
}

template <typename Packed, typename Block>
void dequantize_r16_rows(Type file_type, const uint8_t* src, float* dst, int64_t n_groups, int64_t k) {
    const int64_t nsb = k / QK_K;
    for (int64_t g = 0; g < n_groups; g++)
        for (int64_t s = 0; s < nsb; s++)
            for (int r = 0; r < R16; r++) {
                Block b;
                r16_row(((const Packed*)src)[g * nsb + s], r, b);
                float* y = dst + (g * R16 + r) * k + s * QK_K;
                dequantize_rows(file_type, &b, y, 1, QK_K);
            }
}
}  // namespace

void repack_q4_K_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst) {
    repack_r16_rows<block_q4_K_r16, block_q4_K>(src, src_row_bytes, g0, g1, k, dst);
}
void repack_q2_K_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst) {
    repack_r16_rows<block_q2_K_r16, block_q2_K>(src, src_row_bytes, g0, g1, k, dst);
}
void dequantize_q2_K_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k) {
    dequantize_r16_rows<block_q2_K_r16, block_q2_K>(Type::Q2_K, src, dst, n_groups, k);
}
void repack_q3_K_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst) {
    repack_r16_rows<block_q3_K_r16, block_q3_K>(src, src_row_bytes, g0, g1, k, dst);
}
void dequantize_q3_K_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k) {
    dequantize_r16_rows<block_q3_K_r16, block_q3_K>(Type::Q3_K, src, dst, n_groups, k);
}
void repack_q5_K_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst) {
    repack_r16_rows<block_q5_K_r16, block_q5_K>(src, src_row_bytes, g0, g1, k, dst);
}
void dequantize_q5_K_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k) {
    dequantize_r16_rows<block_q5_K_r16, block_q5_K>(Type::Q5_K, src, dst, n_groups, k);
}
void repack_q6_K_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst) {
    repack_r16_rows<block_q6_K_r16, block_q6_K>(src, src_row_bytes, g0, g1, k, dst);
}
void dequantize_q6_K_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k) {
    dequantize_r16_rows<block_q6_K_r16, block_q6_K>(Type::Q6_K, src, dst, n_groups, k);
}
void repack_iq4_xs_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst) {
    repack_r16_rows<block_iq4_xs_r16, block_iq4_xs>(src, src_row_bytes, g0, g1, k, dst);
}
void dequantize_iq4_xs_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k) {
    dequantize_r16_rows<block_iq4_xs_r16, block_iq4_xs>(Type::IQ4_XS, src, dst, n_groups, k);
}

void repack_iq3_xxs_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst) {
    repack_r16_rows<block_iq3_xxs_r16, block_iq3_xxs>(src, src_row_bytes, g0, g1, k, dst);
}
void dequantize_iq3_xxs_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k) {
    dequantize_r16_rows<block_iq3_xxs_r16, block_iq3_xxs>(Type::IQ3_XXS, src, dst, n_groups, k);
}
void repack_iq3_s_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst) {
    repack_r16_rows<block_iq3_s_r16, block_iq3_s>(src, src_row_bytes, g0, g1, k, dst);
}
void dequantize_iq3_s_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k) {
    dequantize_r16_rows<block_iq3_s_r16, block_iq3_s>(Type::IQ3_S, src, dst, n_groups, k);
}

void repack_iq4_nl_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst) {
    repack_r16_rows<block_iq4_nl_r16, block_iq4_nl_x8>(src, src_row_bytes, g0, g1, k, dst);
}
void dequantize_iq4_nl_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k) {
    dequantize_r16_rows<block_iq4_nl_r16, block_iq4_nl_x8>(Type::IQ4_NL, src, dst, n_groups, k);
}
void repack_mxfp4_r16(const uint8_t* src, size_t src_row_bytes, int64_t g0, int64_t g1, int64_t k, uint8_t* dst) {
    repack_r16_rows<block_mxfp4_r16, block_mxfp4_x8>(src, src_row_bytes, g0, g1, k, dst);
}
void dequantize_mxfp4_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k) {
    dequantize_r16_rows<block_mxfp4_r16, block_mxfp4_x8>(Type::MXFP4, src, dst, n_groups, k);
}

void dequantize_q4_K_r16(const uint8_t* src, float* dst, int64_t n_groups, int64_t k) {
    const int64_t nsb = k / QK_K;
    for (int64_t g = 0; g < n_groups; g++)
        for (int64_t s = 0; s < nsb; s++) {
            const block_q4_K_r16& p = ((const block_q4_K_r16*)src)[g * nsb + s];
            for (int r = 0; r < R16; r++) {
                uint8_t qs[QK_K / 2], sc[8], mn[8];
                r16_row(p, r, qs, sc, mn);
                dequantize_super_q4_K(p.d[r], p.dmin[r], sc, mn, qs, dst + (g * R16 + r) * k + s * QK_K);
            }
        }
}

namespace {
constexpr R16Format R16_FORMATS[] = {
    {Type::Q4_K, Type::Q4_K_R16, &repack_q4_K_r16, &dequantize_q4_K_r16},
    {Type::Q3_K, Type::Q3_K_R16, &repack_q3_K_r16, &dequantize_q3_K_r16},
    {Type::Q2_K, Type::Q2_K_R16, &repack_q2_K_r16, &dequantize_q2_K_r16},
    {Type::Q5_K, Type::Q5_K_R16, &repack_q5_K_r16, &dequantize_q5_K_r16},
    {Type::Q6_K, Type::Q6_K_R16, &repack_q6_K_r16, &dequantize_q6_K_r16},
    {Type::IQ4_XS, Type::IQ4_XS_R16, &repack_iq4_xs_r16, &dequantize_iq4_xs_r16},
    {Type::IQ3_XXS, Type::IQ3_XXS_R16, &repack_iq3_xxs_r16, &dequantize_iq3_xxs_r16},
    {Type::IQ3_S, Type::IQ3_S_R16, &repack_iq3_s_r16, &dequantize_iq3_s_r16},
    {Type::IQ4_NL, Type::IQ4_NL_R16, &repack_iq4_nl_r16, &dequantize_iq4_nl_r16},
    {Type::MXFP4, Type::MXFP4_R16, &repack_mxfp4_r16, &dequantize_mxfp4_r16},
};
}  // namespace

const R16Format* r16_format_of(Type t) {
    for (const R16Format& f : R16_FORMATS)
        if (f.from == t || f.to == t) return &f;
    return nullptr;
}

const TypeInfo* type_info(int32_t type_id) {
    for (const auto& t : TYPES)
        if ((int32_t)t.type == type_id) return &t;
    return nullptr;
}

bool has_quantizer(Type t) {
    switch (t) {
        case Type::F32: case Type::F16: case Type::BF16: case Type::Q8_0: case Type::Q4_0: case Type::Q4_K:
        case Type::Q5_K: case Type::Q6_K: case Type::Q4_1: case Type::Q5_0: case Type::Q5_1: case Type::Q2_K:
        case Type::Q3_K: case Type::IQ4_NL: case Type::IQ4_XS:
            return true;
        default:
            return false;
    }
}

const TypeInfo* type_info_by_name(const char* name) {
    for (const auto& t : TYPES)
        if (std::strcmp(t.name, name) == 0) return &t;
    return nullptr;
}

ActFormat act_format(Type t) {
    switch (t) {
        case Type::Q4_0:
        case Type::Q8_0:
        case Type::Q4_1:
        case Type::Q5_0:
        case Type::Q5_1:
        case Type::IQ4_NL:
        case Type::MXFP4:
        case Type::IQ4_NL_R16:  // (as their file layouts: llama.cpp's activations for them, blocks of 32)
        case Type::MXFP4_R16:
            return ActFormat::Q8_A;
        case Type::Q4_K:
        case Type::Q5_K:
        case Type::Q6_K:
        case Type::Q4_K_R16:
        case Type::Q3_K_R16:
        case Type::Q2_K_R16:
        case Type::IQ4_XS_R16:
        case Type::Q6_K_R16:
        case Type::Q5_K_R16:
        case Type::IQ3_XXS_R16:
        case Type::IQ3_S_R16:
        case Type::Q2_K:
        case Type::Q3_K:
        case Type::IQ4_XS:
        case Type::IQ3_S:
        case Type::IQ3_XXS:
        case Type::IQ2_S:
        case Type::IQ2_XS:
        case Type::IQ2_XXS:
        case Type::IQ1_S:
        case Type::IQ1_M:
            return ActFormat::Q8_K;
        default:
            return ActFormat::F32;
    }
}

size_t act_row_bytes(Type t, int64_t k) {
    switch (act_format(t)) {
        case ActFormat::Q8_A:
            return (size_t)(k / QK) * sizeof(block_q8_a);
        case ActFormat::Q8_K:
            return (size_t)(k / QK_K) * sizeof(block_q8_K);
        default:
            return (size_t)k * sizeof(float);
    }
}

void quantize_act_rows(Type t, const float* X, int64_t m0, int64_t m1, int64_t K, uint8_t* out) {
    const size_t rb = act_row_bytes(t, K);
    for (int64_t m = m0; m < m1; m++) {
        switch (act_format(t)) {
            case ActFormat::Q8_A:
                quantize_act_q8_a(X + m * K, (block_q8_a*)(out + m * rb), K);
                break;
            case ActFormat::Q8_K:
                quantize_act_q8_K(X + m * K, (block_q8_K*)(out + m * rb), K);
                break;
            case ActFormat::F32:
                std::memcpy(out + m * rb, X + m * K, K * sizeof(float));
                break;
        }
    }
}

void quantize_k_rows(Type t, const float* src, uint8_t* dst, int64_t nrow, int64_t n_per_row, const float* quant_weights) {
    const size_t rb = row_bytes(*type_info((int32_t)t), n_per_row);
    for (int64_t r = 0; r < nrow; r++) {
        const float* x = src + r * n_per_row;
        uint8_t* y = dst + r * rb;
        if (t == Type::Q4_K)
            quantize_row_q4_K(x, (block_q4_K*)y, n_per_row, quant_weights);
        else if (t == Type::Q5_K)
            quantize_row_q5_K(x, (block_q5_K*)y, n_per_row, quant_weights);
        else if (t == Type::Q6_K)
            quantize_row_q6_K(x, (block_q6_K*)y, n_per_row, quant_weights);
    }
}

void quantize_rows(Type t, const float* src, void* dst, int64_t n_rows, int64_t k) {
    const TypeInfo* ti = type_info((int32_t)t);
    const size_t rb = row_bytes(*ti, k);
    for (int64_t r = 0; r < n_rows; r++) {
        const float* x = src + r * k;
        uint8_t* y = (uint8_t*)dst + r * rb;
        switch (t) {
            case Type::F32:
                std::memcpy(y, x, k * 4);
                break;
            case Type::F16:
                for (int64_t j = 0; j < k; j++) ((uint16_t*)y)[j] = f32_to_fp16(x[j]);
                break;
            case Type::BF16:
                for (int64_t j = 0; j < k; j++) ((uint16_t*)y)[j] = f32_to_bf16(x[j]);
                break;
            case Type::Q8_0:
                quantize_row_q8_0(x, (block_q8_0*)y, k);
                break;
            case Type::Q4_0:
                quantize_row_q4_0(x, (block_q4_0*)y, k);
                break;
            case Type::Q4_K:
                quantize_row_q4_K(x, (block_q4_K*)y, k);
                break;
            case Type::Q5_K:
                quantize_row_q5_K(x, (block_q5_K*)y, k);
                break;
            case Type::Q6_K:
                quantize_row_q6_K(x, (block_q6_K*)y, k);
                break;
            case Type::Q4_K_R16:  // layouts made at load (repack_*_r16), not quantized to (callers refuse them)
            case Type::Q3_K_R16:
            case Type::Q2_K_R16:
            case Type::IQ4_XS_R16:
            case Type::Q6_K_R16:
            case Type::Q5_K_R16:
            case Type::IQ3_XXS_R16:
            case Type::IQ3_S_R16:
            case Type::IQ4_NL_R16:
            case Type::MXFP4_R16:
                break;
            default:  // the low-bit formats with a quantizer (has_quantizer); callers refuse the others
                quantize_row_lowbit(t, x, y, k);
                break;
        }
    }
}

void dequantize_rows(Type t, const void* src, float* dst, int64_t n_rows, int64_t k) {
    if (const R16Format* f = r16_format_of(t); f && f->to == t) {  // by groups of 16 rows
        f->dequantize((const uint8_t*)src, dst, n_rows / R16, k);
        return;
    }
    const TypeInfo* ti = type_info((int32_t)t);
    const size_t rb = row_bytes(*ti, k);
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t* x = (const uint8_t*)src + r * rb;
        float* y = dst + r * k;
        switch (t) {
            case Type::F32:
                std::memcpy(y, x, k * 4);
                break;
            case Type::F16:
                for (int64_t j = 0; j < k; j++) y[j] = fp16_to_f32(((const uint16_t*)x)[j]);
                break;
            case Type::BF16:
                for (int64_t j = 0; j < k; j++) y[j] = bf16_to_f32(((const uint16_t*)x)[j]);
                break;
            case Type::Q8_0:
                dequantize_row_q8_0((const block_q8_0*)x, y, k);
                break;
            case Type::Q4_0:
                dequantize_row_q4_0((const block_q4_0*)x, y, k);
                break;
            case Type::Q4_K:
                dequantize_row_q4_K((const block_q4_K*)x, y, k);
                break;
            case Type::Q5_K:
                dequantize_row_q5_K((const block_q5_K*)x, y, k);
                break;
            case Type::Q6_K:
                dequantize_row_q6_K((const block_q6_K*)x, y, k);
                break;
            case Type::Q4_K_R16:  // handled above, by groups of rows
            case Type::Q3_K_R16:
            case Type::Q2_K_R16:
            case Type::IQ4_XS_R16:
            case Type::Q6_K_R16:
            case Type::Q5_K_R16:
            case Type::IQ3_XXS_R16:
            case Type::IQ3_S_R16:
            case Type::IQ4_NL_R16:
            case Type::MXFP4_R16:
                break;
            default:
                dequantize_row_lowbit(t, x, y, k);
                break;
        }
    }
}

// Activations: symmetric int8 with q = round_half_even(x / d), d = amax / 127. The same
// arithmetic on every ISA, so integer kernels can be compared exactly.
namespace {

// d = amax / 127 of n values and their quants (quants_avx2.cpp's block_scale and round_32); false, with
// nothing written, where a value is NaN or Inf.
bool act_round_ref(const float* x, int n, float* d, int8_t* qs) {
    float amax = 0.f;
    bool bad = false;
    for (int j = 0; j < n; j++) {
        const float a = std::fabs(x[j]);
        bad |= !(a <= FLT_MAX);  // NaN (unordered) or Inf
        amax = std::max(amax, a);
    }
    if (bad) return false;
    *d = amax / 127.f;
    const float id = act_inverse_scale(*d);
    for (int j = 0; j < n; j++) qs[j] = (int8_t)std::nearbyint(x[j] * id);
    return true;
}

void act_q8_a_ref(const float* x, block_q8_a* y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++)
        if (!act_round_ref(x + i * QK, QK, &y[i].d, y[i].qs)) act_block_nonfinite(&y[i].d, y[i].qs, QK);
}

void act_q8_K_ref(const float* x, block_q8_K* y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++) {
        if (!act_round_ref(x + i * QK_K, QK_K, &y[i].d, y[i].qs)) {
            act_block_nonfinite(&y[i].d, y[i].qs, QK_K, y[i].bsums, QK_K / 16);
            continue;
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += y[i].qs[16 * g + j];
            y[i].bsums[g] = (int16_t)s;
        }
    }
}

const ActQuant ACT_REF = {act_q8_a_ref, act_q8_K_ref};

const ActQuant& act_quant() {
    static const ActQuant* const chosen = act_quant_avx2() && cpu_features().avx2 ? act_quant_avx2() : &ACT_REF;
    return *chosen;
}

}  // namespace

const ActQuant& act_quant_ref() { return ACT_REF; }

void quantize_act_q8_a(const float* x, block_q8_a* y, int64_t k) { act_quant().q8_a(x, y, k); }
void quantize_act_q8_K(const float* x, block_q8_K* y, int64_t k) { act_quant().q8_K(x, y, k); }

float make_qkx2_quants_mad(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                           uint8_t* Laux, float rmin, float rdelta, int nstep) {
    return qkx2_fit<true>(n, nmax, x, weights, L, the_min, Laux, rmin, rdelta, nstep);
}

}  // namespace clover
