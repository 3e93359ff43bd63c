// AVX2 twins of the inner searches of ggml's k-quant reference quantizers (make_qkx2_quants for
// 32-weight sub-blocks, make_qx_quants for 16-weight ones): the same candidates and the same
// choices, with sums taken 8 lanes at a time (so a rare near-tie may pick the other candidate).
#include <immintrin.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "quants.h"

namespace clover {

namespace {

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline float hmin(__m256 v) {
    __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_min_ps(s, _mm_movehl_ps(s, s));
    s = _mm_min_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
// round half to even (ggml's nearest_int), then clamp
inline __m256 round_clamp(__m256 v, __m256 lo, __m256 hi) {
    return _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lo), hi);
}
inline void store_levels(const __m256* l, int nv, int offset, uint8_t* out) {
    alignas(32) int32_t tmp[8];
    for (int v = 0; v < nv; v++) {
        _mm256_store_si256((__m256i*)tmp, _mm256_cvtps_epi32(l[v]));
        for (int j = 0; j < 8; j++) out[8 * v + j] = (uint8_t)(tmp[j] + offset);
    }
}

float qkx2_avx2(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, uint8_t* Laux,
                float rmin, float rdelta, int nstep) {
    if (n != 32) return quant_search_ref().qkx2(n, nmax, x, weights, L, the_min, Laux, rmin, rdelta, nstep);
    __m256 xv[4], wv[4];
    __m256 vmin = _mm256_set1_ps(INFINITY), vmax = _mm256_set1_ps(-INFINITY);
    __m256 sw = _mm256_setzero_ps(), sx = _mm256_setzero_ps();
    for (int v = 0; v < 4; v++) {
        xv[v] = _mm256_loadu_ps(x + 8 * v);
        wv[v] = _mm256_loadu_ps(weights + 8 * v);
        vmin = _mm256_min_ps(vmin, xv[v]);
        vmax = _mm256_max_ps(vmax, xv[v]);
        sw = _mm256_add_ps(sw, wv[v]);
        sx = _mm256_fmadd_ps(wv[v], xv[v], sx);
    }
    float min = hmin(vmin), max = hmax(vmax);
    const float sum_w = hsum(sw), sum_x = hsum(sx);
    if (min > 0) min = 0;
    if (max == min) {
        std::memset(L, 0, n);
        *the_min = -min;
        return 0.f;
    }
    const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps((float)nmax);
    __m256 xm[4], best[4];
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    __m256 err = _mm256_setzero_ps();
    for (int v = 0; v < 4; v++) {
        xm[v] = _mm256_sub_ps(xv[v], _mm256_set1_ps(min));
        best[v] = round_clamp(_mm256_mul_ps(_mm256_set1_ps(iscale), xm[v]), zero, top);
        const __m256 d = _mm256_sub_ps(_mm256_fmadd_ps(_mm256_set1_ps(scale), best[v], _mm256_set1_ps(min)), xv[v]);
        err = _mm256_fmadd_ps(wv[v], _mm256_mul_ps(d, d), err);
    }
    float best_error = hsum(err);
    for (int is = 0; is <= nstep; ++is) {
        // as in the reference, a better candidate's min moves the grid of the following ones
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        for (int v = 0; v < 4; v++) xm[v] = _mm256_sub_ps(xv[v], _mm256_set1_ps(min));
        __m256 l[4];
        __m256 sl = _mm256_setzero_ps(), sl2 = _mm256_setzero_ps(), sxl = _mm256_setzero_ps();
        for (int v = 0; v < 4; v++) {
            l[v] = round_clamp(_mm256_mul_ps(_mm256_set1_ps(iscale), xm[v]), zero, top);
            const __m256 wl = _mm256_mul_ps(wv[v], l[v]);
            sl = _mm256_add_ps(sl, wl);
            sl2 = _mm256_fmadd_ps(wl, l[v], sl2);
            sxl = _mm256_fmadd_ps(wl, xv[v], sxl);
        }
        const float sum_l = hsum(sl), sum_l2 = hsum(sl2), sum_xl = hsum(sxl);
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            __m256 e = _mm256_setzero_ps();
            for (int v = 0; v < 4; v++) {
                const __m256 d = _mm256_sub_ps(
                    _mm256_fmadd_ps(_mm256_set1_ps(this_scale), l[v], _mm256_set1_ps(this_min)), xv[v]);
                e = _mm256_fmadd_ps(wv[v], _mm256_mul_ps(d, d), e);
            }
            const float cur_error = hsum(e);
            if (cur_error < best_error) {
                for (int v = 0; v < 4; v++) best[v] = l[v];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    store_levels(best, 4, 0, L);
    *the_min = -min;
    return scale;
}

float qx_avx2(int n, int nmax, const float* x, int8_t* L) {
    if (n != 16) return quant_search_ref().qx(n, nmax, x, L);
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {  // the first value of largest magnitude, as the reference picks it
        const float ax = __builtin_fabsf(x[i]);  // (the builtin: no weak std:: copy of AVX2 code at -O0)
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < 1e-15f) {
        std::memset(L, 0, n);
        return 0.f;
    }
    const __m256 lo = _mm256_set1_ps((float)-nmax), hi = _mm256_set1_ps((float)(nmax - 1));
    __m256 xv[2], wv[2], best[2];
    for (int v = 0; v < 2; v++) {
        xv[v] = _mm256_loadu_ps(x + 8 * v);
        wv[v] = _mm256_mul_ps(xv[v], xv[v]);
    }
    auto sums = [&](float iscale, __m256* l, float* sumlx, float* suml2) {
        __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
        for (int v = 0; v < 2; v++) {
            l[v] = round_clamp(_mm256_mul_ps(_mm256_set1_ps(iscale), xv[v]), lo, hi);
            const __m256 wl = _mm256_mul_ps(wv[v], l[v]);
            a = _mm256_fmadd_ps(wl, xv[v], a);
            b = _mm256_fmadd_ps(wl, l[v], b);
        }
        *sumlx = hsum(a);
        *suml2 = hsum(b);
    };
    float sumlx, suml2;
    sums(-nmax / max, best, &sumlx, &suml2);
    float scale = suml2 != 0.f ? sumlx / suml2 : 0.0f;
    float best_v = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        __m256 l[2];
        sums(-(nmax + 0.1f * is) / max, l, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best_v * suml2) {
            best[0] = l[0];
            best[1] = l[1];
            scale = sumlx / suml2;
            best_v = scale * sumlx;
        }
    }
    store_levels(best, 2, nmax, (uint8_t*)L);
    return scale;
}

const QuantSearch AVX2_SEARCH = {qkx2_avx2, qx_avx2};

// ---- activation quantizers: the scalar ones' bytes, 8 values per instruction ----

// 32 floats -> 32 int8 round(x * id), in order; also the four int32 vectors of the rounded values.
inline void round_32(const float* x, __m256 id, int8_t* out, __m256i v[4]) {
    for (int u = 0; u < 4; u++)
        v[u] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * u), id),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256((__m256i*)out, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// d = amax / 127 of n values (stored in *d) and the multiplier act_inverse_scale(d); false (nothing stored)
// where a value is NaN or Inf.
inline bool block_scale(const float* x, int n, float* d, __m256* id) {
    const __m256 sign = _mm256_set1_ps(-0.f), big = _mm256_set1_ps(FLT_MAX);
    __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
        m = _mm256_max_ps(a, m);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));  // NaN (unordered) or Inf
    }
    if (_mm256_movemask_ps(bad)) return false;
    *d = hmax(m) / 127.f;
    *id = _mm256_set1_ps(act_inverse_scale(*d));
    return true;
}

inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

void act_q8_a_avx2(const float* x, block_q8_a* y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++) {
        __m256i v[4];
        __m256 id;
        if (block_scale(x + i * QK, QK, &y[i].d, &id))
            round_32(x + i * QK, id, y[i].qs, v);
        else
            act_block_nonfinite(&y[i].d, y[i].qs, QK);
    }
}

void act_q8_K_avx2(const float* x, block_q8_K* y, int64_t k) {
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float* xb = x + i * QK_K;
        __m256 vid;
        if (!block_scale(xb, QK_K, &y[i].d, &vid)) {
            act_block_nonfinite(&y[i].d, y[i].qs, QK_K, y[i].bsums, QK_K / 16);
            continue;
        }
        for (int j = 0; j < QK_K / 32; j++) {
            __m256i v[4];
            round_32(xb + 32 * j, vid, y[i].qs + 32 * j, v);
            y[i].bsums[2 * j] = (int16_t)hsum_i32(_mm256_add_epi32(v[0], v[1]));
            y[i].bsums[2 * j + 1] = (int16_t)hsum_i32(_mm256_add_epi32(v[2], v[3]));
        }
    }
}

const ActQuant AVX2_ACT = {act_q8_a_avx2, act_q8_K_avx2};

}  // namespace

const QuantSearch* quant_search_avx2() { return &AVX2_SEARCH; }
const ActQuant* act_quant_avx2() { return &AVX2_ACT; }

}  // namespace clover
