// Quantizers of Q2_K, Q3_K, IQ4_NL and IQ4_XS, and of Q4_0, Q4_1, Q5_0 and Q5_1 with an importance matrix, byte
// for byte as llama.cpp b11434's ggml_quantize_chunk writes them (ggml-quants.c): without an importance matrix
// quantize_row_q2_K_ref / quantize_row_q3_K_ref, with one quantize_row_q2_K_impl / quantize_row_q3_K_impl (as
// quantize_q2_K / quantize_q3_K choose), quantize_row_iq4_nl_impl with 7 tries either way (quantize_iq4_nl /
// quantize_iq4_xs), quantize_row_q4_0_impl and its kin; the fits that quants.cpp's q4_K / q5_K / q6_K use
// with an importance matrix. The same float
// operations in the same order (the file, as the whole extension, is built with -ffp-contract=off); ggml's
// MAX / MIN are the ternaries fmax_g / fmin_g below, which differ from std::max / std::min on signed zeros.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "iq_tables.h"
#include "quants.h"

namespace clover {

namespace {

constexpr float GROUP_MAX_EPS = 1e-15f;  // ggml-quants.c: a group below this is all zero

// ggml's MAX(a, b) and MIN(a, b) on floats (a > b ? a : b, a < b ? a : b).
inline float fmax_g(float a, float b) { return a > b ? a : b; }
inline float fmin_g(float a, float b) { return a < b ? a : b; }
inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// Pack 256 2-bit values as q2_K / q3_K's qs: byte 32 c + l holds values 128 c + 32 s + l at bits 2 s.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] =
                (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// ---- Q2_K ----

}  // namespace

// make_qkx2_quants' fit by weighted least squares with candidates clipped into 0..nmax before rounding
// (make_qkx3_quants with weights, no use_mad).
float fit_qkx3(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, uint8_t* Laux,
               float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max <= min) {
        std::memset(L, 0, n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const float v = iscale * (x[i] - min);
            const int l = v > 0 ? nearest_int(fmin_g(v, (float)nmax)) : 0;
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
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = diff * diff;
                cur_error += weights[i] * diff;
            }
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

// Non-negative x ~= scale * L, L in 0..nmax, weighted (make_qp_quants): the best of 9 scales around
// nmax / max, then up to 5 passes moving single values to the least-squares optimum. L is stored as
// uint8 as ggml does (a negative first guess wraps, and the later passes read it back wrapped).
float fit_qp(int n, int nmax, const float* x, uint8_t* L, const float* quant_weights) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = fmax_g(max, x[i]);
    if (max < GROUP_MAX_EPS) {
        std::memset(L, 0, n);
        return 0.f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; ++i) L[i] = (uint8_t)nearest_int(iscale * x[i]);
    const float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; ++i) {
        const float diff = x[i] - scale * L[i];
        best_mse += quant_weights[i] * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * is + nmax) / max;
        const float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            const int l = std::min(nmax, nearest_int(iscale_is * x[i]));
            const float diff = x[i] - scale_is * l;
            mse += quant_weights[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = std::min(nmax, nearest_int(iscale * x[i]));
        L[i] = (uint8_t)l;
        const float w = quant_weights[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = quant_weights[i];
            float slx = sumlx - w * x[i] * L[i];
            float sl2 = suml2 - w * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                const int new_l = std::min(nmax, nearest_int(x[i] * sl2 / slx));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

namespace {

// Requantize the weights against the stored (fp16 d, dmin; 4-bit scale and min) groups and pack the block;
// a group whose scale is zero keeps the levels of its fit.
void finish_q2_K(const float* x, block_q2_K& y, float dm, float mm, uint8_t* L) {
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = dm * (y.scales[j] & 0xF);
        if (!d) continue;
        const float m = mm * (y.scales[j] >> 4);
        for (int ii = 0; ii < 16; ++ii)
            L[16 * j + ii] = (uint8_t)clamp_int(nearest_int((x[16 * j + ii] + m) / d), 0, 3);
    }
    pack_2bit(L, y.qs);
}

// quantize_row_q2_K_ref: per group of 16 an |x|-weighted min/scale fit, scales and mins to 4 bits against
// their maxima / 15.
void quantize_q2_K_ref(const float* x, block_q2_K* y, int64_t nb) {
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
            scales[j] = make_qkx2_quants_mad(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
            y[i].d = f32_to_fp16(max_scale / q4scale);
        } else {
            std::memset(y[i].scales, 0, sizeof(y[i].scales));
            y[i].d = f32_to_fp16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] |= (uint8_t)((unsigned)nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = f32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = f32_to_fp16(0.f);
        }
        finish_q2_K(x, y[i], fp16_to_f32(y[i].d), fp16_to_f32(y[i].dmin), L);
    }
}

// quantize_row_q2_K_impl: weights qw * sqrt(sigma^2 + x^2), a least-squares min/scale fit per group, the 16
// scales and mins fitted to 4 bits by make_qp_quants against the groups' summed weights.
void quantize_q2_K_imatrix(const float* x, block_q2_K* y, int64_t nb, const float* quant_weights) {
    uint8_t L[QK_K], Laux[16], Ls[QK_K / 16], Lm[QK_K / 16];
    float mins[QK_K / 16], scales[QK_K / 16], sw[QK_K / 16], weight[16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float sumx2 = 0;
        for (int j = 0; j < QK_K; ++j) sumx2 += x[j] * x[j];
        const float sigma2 = sumx2 / QK_K;
        for (int j = 0; j < QK_K / 16; ++j) {
            const float* qw = quant_weights + QK_K * i + 16 * j;
            for (int l = 0; l < 16; ++l) weight[l] = qw[l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
            sw[j] = 0;
            for (int l = 0; l < 16; ++l) sw[j] += weight[l];
            scales[j] = fit_qkx3(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36);
        }
        const float dm = fit_qp(QK_K / 16, 15, scales, Ls, sw);
        const float mm = fit_qp(QK_K / 16, 15, mins, Lm, sw);
        y[i].d = f32_to_fp16(dm);
        y[i].dmin = f32_to_fp16(mm);
        for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
        finish_q2_K(x, y[i], fp16_to_f32(y[i].d), fp16_to_f32(y[i].dmin), L);
    }
}

// ---- Q3_K ----

// x ~= scale * (L - nmax), L - nmax in -nmax..nmax-1, weights x^2: levels from nmax / max, then up to 5
// passes moving single values to the least-squares optimum (make_q3_quants with do_rmse).
float fit_q3(int n, int nmax, const float* x, int8_t* L) {
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
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                const int new_l = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

}  // namespace

// make_qx_quants with rmse_type 1 and weights qw: the best of 19 scales -(nmax + 0.1 is) / max by weighted
// least squares; L = l + nmax.
float fit_qx_weighted(int n, int nmax, const float* x, int8_t* L, const float* qw) {
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
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        sumlx += qw[i] * x[i] * l;
        suml2 += qw[i] * l * l;
    }
    float scale = suml2 != 0.f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            sumlx += qw[i] * x[i] * l;
            suml2 += qw[i] * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i)
                L[i] = (int8_t)(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

namespace {

// Store group j's 6-bit scale code l (0..63) in q3_K's 12 scale bytes (zeroed first).
inline void put_scale_q3_K(uint8_t* s12, int j, int l) {
    if (j < 8)
        s12[j] = (uint8_t)(l & 0xF);
    else
        s12[j - 8] |= (uint8_t)((l & 0xF) << 4);
    s12[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
}

// Requantize against the stored scales (groups with a zero scale keep their fit's levels, 0..7) and pack:
// the high bit of value j in bit j / 32 of hmask[j % 32], the low two bits as q2_K's.
void finish_q3_K(const float* x, block_q3_K& y, int8_t* L) {
    int8_t sc[16];
    decode_scales_q3_K(y.scales, sc);
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = fp16_to_f32(y.d) * sc[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii)
            L[16 * j + ii] = (int8_t)(clamp_int(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
    }
    uint8_t low[QK_K];
    std::memset(y.hmask, 0, sizeof(y.hmask));
    for (int j = 0; j < QK_K; ++j) {
        int l = L[j];
        if (l > 3) {
            y.hmask[j % (QK_K / 8)] |= (uint8_t)(1 << (j / (QK_K / 8)));
            l -= 4;
        }
        low[j] = (uint8_t)l;
    }
    pack_2bit(low, y.qs);
}

// quantize_row_q3_K_ref: per group of 16 make_q3_quants, the scales to 6 bits against max_scale / -32.
void quantize_q3_K_ref(const float* x, block_q3_K* y, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
            const float scale = std::fabs(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        std::memset(y[i].scales, 0, 12);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) {
                const int8_t l = (int8_t)nearest_int(iscale * scales[j]);  // (ggml's int8_t, then clipped)
                put_scale_q3_K(y[i].scales, j, clamp_int(l, -32, 31) + 32);
            }
            y[i].d = f32_to_fp16(1 / iscale);
        } else {
            y[i].d = f32_to_fp16(0.f);
        }
        finish_q3_K(x, y[i], L);
    }
}

// quantize_row_q3_K_impl: weights qw * sqrt(2 sigma^2 + x^2), make_qx_quants per group, the 16 scales
// fitted to 6 bits by make_qx_quants (nmax 32) against the groups' summed weights.
void quantize_q3_K_imatrix(const float* x, block_q3_K* y, int64_t nb, const float* quant_weights) {
    int8_t L[QK_K], Ls[QK_K / 16];
    float scales[QK_K / 16], weight[16], sw[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float sumx2 = 0;
        for (int j = 0; j < QK_K; ++j) sumx2 += x[j] * x[j];
        const float sigma2 = 2 * sumx2 / QK_K;
        for (int j = 0; j < QK_K / 16; ++j) {
            const float* qw = quant_weights + QK_K * i + 16 * j;
            for (int l = 0; l < 16; ++l) weight[l] = qw[l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
            float sumw = 0;
            for (int l = 0; l < 16; ++l) sumw += weight[l];
            sw[j] = sumw;
            scales[j] = fit_qx_weighted(16, 4, x + 16 * j, L + 16 * j, weight);
        }
        std::memset(y[i].scales, 0, 12);
        const float d_block = fit_qx_weighted(QK_K / 16, 32, scales, Ls, sw);
        for (int j = 0; j < QK_K / 16; ++j) put_scale_q3_K(y[i].scales, j, Ls[j]);
        y[i].d = f32_to_fp16(d_block);
        finish_q3_K(x, y[i], L);
    }
}

// ---- IQ4_NL and IQ4_XS ----

constexpr int IQ4_NTRY = 7;  // quantize_iq4_nl and quantize_iq4_xs, with or without an importance matrix

// The index of the kvalues_iq4nl entry nearest x (best_index_int8; ties to the upper one unless strictly
// nearer the lower).
inline int best_index_iq4nl(float x) {
    const int8_t* val = kvalues_iq4nl;
    if (x <= val[0]) return 0;
    if (x >= val[15]) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        const int mav = (ml + mu) / 2;
        if (x < val[mav])
            mu = mav;
        else
            ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

// quantize_row_iq4_nl_impl with ntry 7 and blocks of 32 over a super-block of n (32: IQ4_NL, whose scale
// is the block's own fp16 d; 256: IQ4_XS, 8 scales to 6 bits against max_scale / -32). scales_h /
// scales_l: IQ4_XS's (unused for IQ4_NL); qw: the importance matrix for these n weights, or nullptr.
void quantize_iq4_super(int n, const float* x, uint16_t* dh, uint8_t* q4, uint16_t* scales_h, uint8_t* scales_l,
                        const float* qw) {
    const int8_t* values = kvalues_iq4nl;
    float scales[QK_K / 32], weight[32];
    uint8_t L[QK_K];
    float sigma2 = 0;
    for (int j = 0; j < n; ++j) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / n;
    std::memset(q4, 0, n / 2);
    *dh = f32_to_fp16(0.f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < n / 32; ++ib) {
        const float* xb = x + 32 * ib;
        uint8_t* Lb = L + 32 * ib;
        if (qw) {
            for (int j = 0; j < 32; ++j) weight[j] = qw[32 * ib + j] * std::sqrt(sigma2 + xb[j] * xb[j]);
        } else {
            for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
        }
        float amax = 0, max = 0;
        for (int j = 0; j < 32; ++j) {
            const float ax = std::fabs(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax < GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; ++j) {
            const int l = best_index_iq4nl(id * xb[j]);
            Lb[j] = (uint8_t)l;
            const float q = values[l];
            const float w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -IQ4_NTRY; itry <= IQ4_NTRY; ++itry) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; ++j) {
                const float q = values[best_index_iq4nl(id * xb[j])];
                const float w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        const float abs_d = std::fabs(d);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    if (n > 32) {
        *scales_h = 0;
        const float d = -max_scale / 32;
        *dh = f32_to_fp16(d);
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < n / 32; ++ib) {
            const int l = clamp_int(nearest_int(id * scales[ib]), -32, 31);
            const float dl = d * l;  // (the float d, not its fp16 rounding)
            const float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; ++j) L[32 * ib + j] = (uint8_t)best_index_iq4nl(idl * x[32 * ib + j]);
            const int code = l + 32;
            if (ib % 2 == 0)
                scales_l[ib / 2] = (uint8_t)(code & 0xf);
            else
                scales_l[ib / 2] |= (uint8_t)((code & 0xf) << 4);
            *scales_h |= (uint16_t)((code >> 4) << (2 * (ib % 8)));
        }
    } else {
        *dh = f32_to_fp16(scales[0]);
        const float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < 32; ++j) L[j] = (uint8_t)best_index_iq4nl(id * x[j]);
    }
    for (int i = 0; i < n / 32; ++i)
        for (int j = 0; j < 16; ++j) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

// ---- blocks of 32 with an importance matrix (quantize_row_q4_0_impl, q4_1, q5_0, q5_1) ----

// Weights qw * sqrt(sigma^2 + x^2), sigma^2 the mean of x^2 over the whole row; q4_0 / q5_0 by make_qx_quants
// (nmax 8 / 16), q4_1 / q5_1 by make_qkx3_quants (0..15 / 0..31 and a min).
template <typename Block>
void quantize_legacy_imatrix(const float* x, Block* y, int64_t n_per_row, const float* quant_weights) {
    constexpr bool MIN = std::is_same_v<Block, block_q4_1> || std::is_same_v<Block, block_q5_1>;
    constexpr bool FIVE = std::is_same_v<Block, block_q5_0> || std::is_same_v<Block, block_q5_1>;
    float weight[QK];
    uint8_t L[QK], Laux[QK];  // levels 0 .. 2^bits - 1 (make_qx_quants' l + nmax, or make_qkx3_quants')
    float sum_x2 = 0;
    for (int64_t j = 0; j < n_per_row; ++j) sum_x2 += x[j] * x[j];
    const float sigma2 = sum_x2 / n_per_row;
    for (int64_t ib = 0; ib < n_per_row / QK; ++ib) {
        const float* xb = x + QK * ib;
        const float* qw = quant_weights + QK * ib;
        for (int j = 0; j < QK; ++j) weight[j] = qw[j] * std::sqrt(sigma2 + xb[j] * xb[j]);
        if constexpr (MIN) {
            float min;
            const float d = fit_qkx3(QK, FIVE ? 31 : 15, xb, weight, L, &min, Laux, -0.9f, 0.05f, 36);
            y[ib].d = f32_to_fp16(d);
            y[ib].m = f32_to_fp16(-min);
        } else {
            y[ib].d = f32_to_fp16(fit_qx_weighted(QK, FIVE ? 16 : 8, xb, (int8_t*)L, weight));
        }
        for (int j = 0; j < QK / 2; ++j) y[ib].qs[j] = (uint8_t)((L[j] & 0x0F) | ((L[j + QK / 2] & 0x0F) << 4));
        if constexpr (FIVE) {
            uint32_t qh = 0;
            for (int j = 0; j < QK; ++j) qh |= (uint32_t)((L[j] & 0x10u) >> 4) << j;
            std::memcpy(y[ib].qh, &qh, sizeof(qh));
        }
    }
}

}  // namespace

bool takes_imatrix(Type t) {
    return t == Type::Q2_K || t == Type::Q3_K || t == Type::IQ4_NL || t == Type::IQ4_XS || t == Type::Q4_K ||
           t == Type::Q5_K || t == Type::Q6_K || t == Type::Q4_0 || t == Type::Q4_1 || t == Type::Q5_0 ||
           t == Type::Q5_1;
}

bool quantize_rows_lowbit(Type t, const float* src, uint8_t* dst, int64_t nrow, int64_t n_per_row,
                          const float* quant_weights) {
    if (!takes_imatrix(t)) return false;
    if (t == Type::Q4_K || t == Type::Q5_K || t == Type::Q6_K) {  // (quants.cpp, with their reference quantizers)
        quantize_k_rows(t, src, dst, nrow, n_per_row, quant_weights);
        return true;
    }
    const TypeInfo& ti = *type_info((int32_t)t);
    if (t == Type::Q4_0 || t == Type::Q4_1 || t == Type::Q5_0 || t == Type::Q5_1) {
        if (!quant_weights) {  // (their reference quantizers: gguf.quants')
            quantize_rows(t, src, dst, nrow, n_per_row);
            return true;
        }
        for (int64_t r = 0; r < nrow; r++) {
            const float* x = src + r * n_per_row;
            uint8_t* y = dst + r * row_bytes(ti, n_per_row);
            if (t == Type::Q4_0) quantize_legacy_imatrix(x, (block_q4_0*)y, n_per_row, quant_weights);
            if (t == Type::Q4_1) quantize_legacy_imatrix(x, (block_q4_1*)y, n_per_row, quant_weights);
            if (t == Type::Q5_0) quantize_legacy_imatrix(x, (block_q5_0*)y, n_per_row, quant_weights);
            if (t == Type::Q5_1) quantize_legacy_imatrix(x, (block_q5_1*)y, n_per_row, quant_weights);
        }
        return true;
    }
    const int64_t nb = n_per_row / ti.block_size;
    const size_t rb = row_bytes(ti, n_per_row);
    for (int64_t r = 0; r < nrow; r++) {
        const float* x = src + r * n_per_row;
        uint8_t* y = dst + r * rb;
        switch (t) {
            case Type::Q2_K:
                if (quant_weights)
                    quantize_q2_K_imatrix(x, (block_q2_K*)y, nb, quant_weights);
                else
                    quantize_q2_K_ref(x, (block_q2_K*)y, nb);
                break;
            case Type::Q3_K:
                if (quant_weights)
                    quantize_q3_K_imatrix(x, (block_q3_K*)y, nb, quant_weights);
                else
                    quantize_q3_K_ref(x, (block_q3_K*)y, nb);
                break;
            case Type::IQ4_NL:
                for (int64_t i = 0; i < nb; i++) {
                    block_iq4_nl& b = ((block_iq4_nl*)y)[i];
                    quantize_iq4_super(QK, x + QK * i, &b.d, b.qs, nullptr, nullptr,
                                       quant_weights ? quant_weights + QK * i : nullptr);
                }
                break;
            case Type::IQ4_XS:
                for (int64_t i = 0; i < nb; i++) {
                    block_iq4_xs& b = ((block_iq4_xs*)y)[i];
                    quantize_iq4_super(QK_K, x + QK_K * i, &b.d, b.qs, &b.scales_h, b.scales_l,
                                       quant_weights ? quant_weights + QK_K * i : nullptr);
                }
                break;
            default:
                break;
        }
    }
    return true;
}

}  // namespace clover
