// AVX2 + FMA + F16C kernels (the only file compiled with -mavx2 -mfma -mf16c).
// Register tiles of RM weight rows x RN tokens: each weight block is unpacked once per tile and
// reused for RN tokens; int8 products with vpmaddubsw (u8 x s8 -> s16 pairs) and vpmaddwd.
#include <immintrin.h>

#include "kernels.h"

namespace clover {

namespace {

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline int32_t hsum_i32(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(v);
}

inline float half(uint16_t h) { return _cvtsh_ss(h); }

struct Args {
    const uint8_t* W;
    size_t wrb;
    const uint8_t* X;
    size_t xrb;
    int64_t K;
    float* Y;
    int64_t ldy;
};

// Tiles over the output: RM = 4 rows for one token (GEMV), 2 rows x up to 4 tokens otherwise.
template <int RM, template <int, int> class T>
void tokens(const Args& a, int64_t n, int M) {
    int m = 0;
    for (; m + 4 <= M; m += 4) T<RM, 4>::run(a, n, m);
    switch (M - m) {
        case 3: T<RM, 3>::run(a, n, m); break;
        case 2: T<RM, 2>::run(a, n, m); break;
        case 1: T<RM, 1>::run(a, n, m); break;
    }
}

template <template <int, int> class T>
void gemm_tiled(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
                int64_t n0, int64_t n1) {
    const Args a{W, wrb, X, xrb, K, Y, ldy};
    int64_t n = n0;
    if (M == 1) {
        for (; n + 4 <= n1; n += 4) T<4, 1>::run(a, n, 0);
    } else {
        for (; n + 2 <= n1; n += 2) tokens<2, T>(a, n, M);
    }
    for (; n < n1; n++) tokens<1, T>(a, n, M);
}

// ---- float weights (f32, f16, bf16) against fp32 activations ----

struct LoadF32 {
    static __m256 load(const uint8_t* w, int64_t k) { return _mm256_loadu_ps((const float*)w + k); }
    static float load1(const uint8_t* w, int64_t k) { return ((const float*)w)[k]; }
};
struct LoadF16 {
    static __m256 load(const uint8_t* w, int64_t k) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)w + k)));
    }
    static float load1(const uint8_t* w, int64_t k) { return half(((const uint16_t*)w)[k]); }
};
struct LoadBF16 {
    static __m256 load(const uint8_t* w, int64_t k) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)((const uint16_t*)w + k)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    static float load1(const uint8_t* w, int64_t k) { return bf16_to_f32(((const uint16_t*)w)[k]); }
};

template <typename L>
struct TileFloat {
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            __m256 acc[RM][RN];
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) acc[r][t] = _mm256_setzero_ps();
            const int64_t K8 = a.K & ~int64_t(7);
            for (int64_t k = 0; k < K8; k += 8) {
                __m256 w[RM];
                for (int r = 0; r < RM; r++) w[r] = L::load(a.W + (n + r) * a.wrb, k);
                for (int t = 0; t < RN; t++) {
                    const __m256 x = _mm256_loadu_ps((const float*)(a.X + (m + t) * a.xrb) + k);
                    for (int r = 0; r < RM; r++) acc[r][t] = _mm256_fmadd_ps(w[r], x, acc[r][t]);
                }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) {
                    float s = hsum(acc[r][t]);
                    const float* x = (const float*)(a.X + (m + t) * a.xrb);
                    for (int64_t k = K8; k < a.K; k++) s += L::load1(a.W + (n + r) * a.wrb, k) * x[k];
                    a.Y[(m + t) * a.ldy + n + r] = s;
                }
        }
    };
};

template <int RM, int RN>
using TileF32 = TileFloat<LoadF32>::T<RM, RN>;
template <int RM, int RN>
using TileF16 = TileFloat<LoadF16>::T<RM, RN>;
template <int RM, int RN>
using TileBF16 = TileFloat<LoadBF16>::T<RM, RN>;

// ---- Q8_0 and Q4_0 weights against block_q8_a activations ----

struct UnpackQ8_0 {
    static __m256i load(const uint8_t* row, int64_t b, float* d) {
        const block_q8_0* blk = (const block_q8_0*)row + b;
        *d = half(blk->d);
        return _mm256_loadu_si256((const __m256i*)blk->qs);
    }
};
struct UnpackQ4_0 {
    static __m256i load(const uint8_t* row, int64_t b, float* d) {
        const block_q4_0* blk = (const block_q4_0*)row + b;
        *d = half(blk->d);
        const __m128i q = _mm_loadu_si128((const __m128i*)blk->qs);
        const __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
        return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    }
};

template <typename U>
struct TileQ8A {
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            const __m256i ones = _mm256_set1_epi16(1);
            __m256 acc[RM][RN];
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) acc[r][t] = _mm256_setzero_ps();
            const int64_t nb = a.K / QK;
            for (int64_t b = 0; b < nb; b++) {
                __m256i w[RM], wabs[RM];
                float dw[RM];
                for (int r = 0; r < RM; r++) {
                    w[r] = U::load(a.W + (n + r) * a.wrb, b, &dw[r]);
                    wabs[r] = _mm256_sign_epi8(w[r], w[r]);
                }
                for (int t = 0; t < RN; t++) {
                    const block_q8_a* xb = (const block_q8_a*)(a.X + (m + t) * a.xrb) + b;
                    const __m256i x = _mm256_loadu_si256((const __m256i*)xb->qs);
                    for (int r = 0; r < RM; r++) {
                        // |w| * (x * sign(w)) = w * x, in u8 x s8 form for vpmaddubsw
                        const __m256i p16 = _mm256_maddubs_epi16(wabs[r], _mm256_sign_epi8(x, w[r]));
                        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                        acc[r][t] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw[r] * xb->d), acc[r][t]);
                    }
                }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + r] = hsum(acc[r][t]);
        }
    };
};

template <int RM, int RN>
using TileQ8_0 = TileQ8A<UnpackQ8_0>::T<RM, RN>;
template <int RM, int RN>
using TileQ4_0 = TileQ8A<UnpackQ4_0>::T<RM, RN>;

// ---- k-quants against block_q8_K activations ----

// One weight super-block unpacked to 8 vectors of 32 unsigned quants plus its scales.
struct SuperQ {
    __m256i q[8];
    __m256i sc[8];  // int16 multipliers for the vpmaddubsw pairs of vector j
    __m256i mins;   // int16 x 16 multipliers of the 16 activation group sums (zero-point term)
    float d, dmin;  // y = d * x.d * sum(sc * q.x) - dmin * x.d * sum(mins * bsums)
};

// Pair-sums of a q8_K block's 16 group sums: the sum over each 32-value sub-block.
inline __m256i bsums16(const block_q8_K& x) { return _mm256_loadu_si256((const __m256i*)x.bsums); }

inline void unpack_k4_scales(const uint8_t* scales12, SuperQ& s) {
    alignas(32) int16_t mins[16];
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        scale_min_k4(j, scales12, &sc, &m);
        s.sc[j] = _mm256_set1_epi16(sc);
        mins[2 * j] = mins[2 * j + 1] = m;  // both 16-groups of sub-block j
    }
    s.mins = _mm256_load_si256((const __m256i*)mins);
}

struct UnpackQ4_K {
    static void load(const uint8_t* row, int64_t b, SuperQ& s) {
        const block_q4_K* blk = (const block_q4_K*)row + b;
        s.d = half(blk->d);
        s.dmin = half(blk->dmin);
        unpack_k4_scales(blk->scales, s);
        const __m256i mask = _mm256_set1_epi8(0x0f);
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i*)(blk->qs + 32 * c));
            s.q[2 * c] = _mm256_and_si256(q, mask);
            s.q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
        }
    }
};

struct UnpackQ5_K {
    static void load(const uint8_t* row, int64_t b, SuperQ& s) {
        const block_q5_K* blk = (const block_q5_K*)row + b;
        s.d = half(blk->d);
        s.dmin = half(blk->dmin);
        unpack_k4_scales(blk->scales, s);
        const __m256i mask = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
        const __m256i qh = _mm256_loadu_si256((const __m256i*)blk->qh);
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i*)(blk->qs + 32 * c));
            // bit j of qh[l] is the fifth bit of weight l of sub-block j
            const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one);
            const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one);
            s.q[2 * c] = _mm256_or_si256(_mm256_and_si256(q, mask), _mm256_slli_epi16(h0, 4));
            s.q[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask), _mm256_slli_epi16(h1, 4));
        }
    }
};

// q6_K: q in 0..63 (offset 32 folded into the zero-point term), scales per 16 weights.
struct UnpackQ6_K {
    static void load(const uint8_t* row, int64_t b, SuperQ& s) {
        const block_q6_K* blk = (const block_q6_K*)row + b;
        s.d = half(blk->d);
        s.dmin = s.d * 32.f;
        const __m256i mask4 = _mm256_set1_epi8(0x0f), mask2 = _mm256_set1_epi8(3);
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i*)(blk->ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i*)(blk->ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(blk->qh + 32 * h));
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(qh, mask2), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), mask2), 4);
            const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), mask2), 4);
            const __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), mask2), 4);
            s.q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, mask4), h0);
            s.q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, mask4), h1);
            s.q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), mask4), h2);
            s.q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), mask4), h3);
        }
        alignas(32) int16_t mins[16];
        for (int j = 0; j < 8; j++) {
            const int16_t lo = blk->scales[2 * j], hi = blk->scales[2 * j + 1];
            s.sc[j] = _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
            mins[2 * j] = lo;
            mins[2 * j + 1] = hi;
        }
        s.mins = _mm256_load_si256((const __m256i*)mins);
    }
};

template <typename U>
struct TileQK {
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            __m256 acc[RM][RN];
            float zero_point[RM][RN] = {};
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) acc[r][t] = _mm256_setzero_ps();
            const int64_t nb = a.K / QK_K;
            SuperQ s[RM];
            for (int64_t b = 0; b < nb; b++) {
                for (int r = 0; r < RM; r++) U::load(a.W + (n + r) * a.wrb, b, s[r]);
                for (int t = 0; t < RN; t++) {
                    const block_q8_K& x = ((const block_q8_K*)(a.X + (m + t) * a.xrb))[b];
                    const __m256i bs = bsums16(x);
                    for (int r = 0; r < RM; r++) {
                        __m256i sum = _mm256_setzero_si256();
                        for (int j = 0; j < 8; j++) {
                            const __m256i xv = _mm256_loadu_si256((const __m256i*)(x.qs + 32 * j));
                            const __m256i p16 = _mm256_maddubs_epi16(s[r].q[j], xv);
                            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p16, s[r].sc[j]));
                        }
                        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(s[r].d * x.d), acc[r][t]);
                        const __m256i zp = _mm256_madd_epi16(s[r].mins, bs);
                        const int32_t zsum =
                            hsum_i32(_mm_add_epi32(_mm256_castsi256_si128(zp), _mm256_extracti128_si256(zp, 1)));
                        zero_point[r][t] += s[r].dmin * x.d * (float)zsum;
                    }
                }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + r] = hsum(acc[r][t]) - zero_point[r][t];
        }
    };
};

template <int RM, int RN>
using TileQ4_K = TileQK<UnpackQ4_K>::T<RM, RN>;
template <int RM, int RN>
using TileQ5_K = TileQK<UnpackQ5_K>::T<RM, RN>;
template <int RM, int RN>
using TileQ6_K = TileQK<UnpackQ6_K>::T<RM, RN>;

const Kernels AVX2 = {
    "avx2",
    gemm_tiled<TileF32>,
    gemm_tiled<TileF16>,
    gemm_tiled<TileBF16>,
    gemm_tiled<TileQ8_0>,
    gemm_tiled<TileQ4_0>,
    gemm_tiled<TileQ4_K>,
    gemm_tiled<TileQ5_K>,
    gemm_tiled<TileQ6_K>,
};

}  // namespace

const Kernels* kernels_avx2() { return &AVX2; }

}  // namespace clover
