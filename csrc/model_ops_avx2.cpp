// AVX2 + FMA + F16C model operators (the only model-ops file compiled with those flags):
// model_ops_simd.inc over V8 = one AVX register. The NEON file includes the same kernels.
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats.h"
#include "model_ops.h"

namespace clover {

namespace {

using V8 = __m256;
inline V8 zero8() { return _mm256_setzero_ps(); }
inline V8 set8(float x) { return _mm256_set1_ps(x); }
inline V8 load8(const float* p) { return _mm256_loadu_ps(p); }
inline void store8(float* p, V8 v) { _mm256_storeu_ps(p, v); }
inline V8 add8(V8 a, V8 b) { return _mm256_add_ps(a, b); }
inline V8 sub8(V8 a, V8 b) { return _mm256_sub_ps(a, b); }
inline V8 mul8(V8 a, V8 b) { return _mm256_mul_ps(a, b); }
inline V8 div8(V8 a, V8 b) { return _mm256_div_ps(a, b); }
inline V8 max8(V8 a, V8 b) { return _mm256_max_ps(a, b); }
inline V8 min8(V8 a, V8 b) { return _mm256_min_ps(a, b); }
inline V8 fma8(V8 a, V8 b, V8 c) { return _mm256_fmadd_ps(a, b, c); }    // a b + c
inline V8 fnma8(V8 a, V8 b, V8 c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a b
inline V8 lt_select8(V8 a, V8 b, V8 x, V8 y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
// 8 groups of 4 floats (p[4l + j]) -> out[j] lane l = p[4l + j]: the conv's taps of 8 channels
inline void transpose4x8(const float* p, V8 out[4]) {
    const __m256 r0 = _mm256_loadu_ps(p), r1 = _mm256_loadu_ps(p + 8), r2 = _mm256_loadu_ps(p + 16),
                 r3 = _mm256_loadu_ps(p + 24);
    const __m256 a0 = _mm256_permute2f128_ps(r0, r2, 0x20), a1 = _mm256_permute2f128_ps(r0, r2, 0x31);
    const __m256 a2 = _mm256_permute2f128_ps(r1, r3, 0x20), a3 = _mm256_permute2f128_ps(r1, r3, 0x31);
    const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
    const __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
    out[0] = _mm256_shuffle_ps(t0, t2, 0x44);
    out[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
    out[2] = _mm256_shuffle_ps(t1, t3, 0x44);
    out[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
}
inline V8 f16x8_to_8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
inline V8 i8x8_to_8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// e^x (model_ops.h's ExpConsts: the method, its accuracy and range)
inline __m256 exp8(__m256 x) {
    using E = ExpConsts;
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(E::X_MIN)), _mm256_set1_ps(E::X_MAX));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(E::LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    n = _mm256_min_ps(n, _mm256_set1_ps(127.f));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(E::LN2_HI), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(E::LN2_LO), r);
    __m256 p = _mm256_set1_ps(E::P0);
    for (const float c : {E::P1, E::P2, E::P3, E::P4, E::P5}) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(E::INF_ABOVE), _CMP_GT_OQ));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(E::ZERO_BELOW), _CMP_LT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// Clover heads, one thread: recurrent 2x faster at T=1, equal at T=8-32, ~10% faster at T=128-512
#define CLOVER_SIMD_ISA "avx2"
#define CLOVER_SIMD_GDN_CHUNKED_FROM INT64_MAX
#include "model_ops_simd.inc"

}  // namespace

const ModelKernels* model_kernels_avx2() { return &TABLE; }

}  // namespace clover
