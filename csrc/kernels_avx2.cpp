// AVX2 + FMA + F16C kernels (the only file compiled with -mavx2 -mfma -mf16c).
// Register tiles of RM weight rows x RN tokens: each weight block is unpacked once per tile and
// reused for RN tokens; int8 products with vpmaddubsw (u8 x s8 -> s16 pairs) and vpmaddwd. k-quant
// products of two or more tokens run the lane-layout tiles of kernel_lanes256.h instead.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernel_lanes256.h"
#include "kernel_r16_256.h"
#include "kernels.h"


namespace clover {

namespace {

inline float half(uint16_t h) { return _cvtsh_ss(h); }

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
                    float s = hsum8(acc[r][t]);
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
    static constexpr int BYTES = sizeof(block_q8_0);
    static __m256i load(const uint8_t* row, int64_t b, float* d) {
        const block_q8_0* blk = (const block_q8_0*)row + b;
        *d = half(blk->d);
        return _mm256_loadu_si256((const __m256i*)blk->qs);
    }
};
struct UnpackQ4_0 {
    static constexpr int BYTES = sizeof(block_q4_0);
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
                    __builtin_prefetch((const char*)a.W + (n + r) * a.wrb + b * U::BYTES + PREFETCH_BYTES);
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
                for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + r] = hsum8(acc[r][t]);
        }
    };
};

}  // namespace
}  // namespace clover

#include "kernel_lowbit_avx2.h"

namespace clover {
namespace {

template <int RM, int RN>
using TileQ8_0 = TileQ8A<UnpackQ8_0>::T<RM, RN>;
template <int RM, int RN>
using TileQ4_0 = TileQ8A<UnpackQ4_0>::T<RM, RN>;

// ---- k-quants against block_q8_K activations: the products of few tokens (gemm_kquant below uses these
// tiles at one row by up to 4 tokens, for one token, and up to 3 of q4_K / q5_K; more tokens run
// kernel_lanes256.h's) ----
// Per super-block and tile: int32 sums of scale * (q . x) per (row, token), then one float
// multiply-add by d * x.d; the zero-point (mins, or q6_K's offset 32) goes through the q8_K
// group sums: madd(mins per 16-group, bsums) scaled by dmin * x.d.

// Shuffle masks that broadcast int16 lane j of a 128-bit lane to all 8 int16 lanes.
inline __m256i lane_broadcast16(int j) { return _mm256_set1_epi16((short)((2 * j) | ((2 * j + 1) << 8))); }

struct K4Header {
    __m256i scales;  // int16 sc0..sc7 in both 128-bit lanes
    __m256i mins;    // int16 m0,m0,m1,m1,...,m7,m7: the min of each 16-group
    float d, dmin;
};

inline K4Header k4_header(uint16_t d, uint16_t dmin, const uint8_t* s12) {
    uint32_t u[4];
    decode_k4_header(s12, u);
    K4Header h;
    const __m128i b = _mm_loadu_si128((const __m128i*)u);
    const __m128i sc = _mm_cvtepu8_epi16(b);
    const __m128i mn = _mm_cvtepu8_epi16(_mm_srli_si128(b, 8));
    h.scales = _mm256_set_m128i(sc, sc);
    h.mins = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));
    h.d = half(d);
    h.dmin = half(dmin);
    return h;
}

template <bool FIVE_BIT>
struct TileQ45K {
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            using Block = typename std::conditional<FIVE_BIT, block_q5_K, block_q4_K>::type;
            const __m256i m4 = _mm256_set1_epi8(0x0f);
            __m256 acc[RM][RN];
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) acc[r][t] = _mm256_setzero_ps();
            const int64_t nb = a.K / QK_K;
            for (int64_t b = 0; b < nb; b++) {
                const Block* w[RM];
                K4Header h[RM];
                for (int r = 0; r < RM; r++) {
                    w[r] = (const Block*)(a.W + (n + r) * a.wrb) + b;
                    prefetch_block(w[r], sizeof(Block));
                    h[r] = k4_header(w[r]->d, w[r]->dmin, w[r]->scales);
                }
                const block_q8_K* x[RN];
                for (int t = 0; t < RN; t++) x[t] = (const block_q8_K*)(a.X + (m + t) * a.xrb) + b;
                __m256i sum[RM][RN];
                for (int r = 0; r < RM; r++)
                    for (int t = 0; t < RN; t++) sum[r][t] = _mm256_setzero_si256();
                for (int c = 0; c < 4; c++) {
                    __m256i lo[RM], hi[RM], slo[RM], shi[RM];
                    for (int r = 0; r < RM; r++) {
                        const __m256i q = _mm256_loadu_si256((const __m256i*)(w[r]->qs + 32 * c));
                        lo[r] = _mm256_and_si256(q, m4);
                        hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                        if (FIVE_BIT) {
                            const __m256i qh = _mm256_loadu_si256((const __m256i*)((const block_q5_K*)w[r])->qh);
                            const __m256i one = _mm256_set1_epi8(1);
                            // bit j of qh[l] is the fifth bit of weight l of sub-block j
                            lo[r] = _mm256_or_si256(lo[r], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
                            hi[r] = _mm256_or_si256(hi[r], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
                        }
                        slo[r] = _mm256_shuffle_epi8(h[r].scales, lane_broadcast16(2 * c));
                        shi[r] = _mm256_shuffle_epi8(h[r].scales, lane_broadcast16(2 * c + 1));
                    }
                    for (int t = 0; t < RN; t++) {
                        const __m256i x0 = _mm256_loadu_si256((const __m256i*)(x[t]->qs + 64 * c));
                        const __m256i x1 = _mm256_loadu_si256((const __m256i*)(x[t]->qs + 64 * c + 32));
                        for (int r = 0; r < RM; r++) {
                            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[r], x0), slo[r]);
                            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[r], x1), shi[r]);
                            sum[r][t] = _mm256_add_epi32(sum[r][t], _mm256_add_epi32(p0, p1));
                        }
                    }
                }
                for (int t = 0; t < RN; t++) {
                    const __m256i bs = _mm256_loadu_si256((const __m256i*)x[t]->bsums);
                    for (int r = 0; r < RM; r++) {
                        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r][t]), _mm256_set1_ps(h[r].d * x[t]->d), acc[r][t]);
                        const __m256 zp = _mm256_cvtepi32_ps(_mm256_madd_epi16(h[r].mins, bs));
                        acc[r][t] = _mm256_fnmadd_ps(zp, _mm256_set1_ps(h[r].dmin * x[t]->d), acc[r][t]);
                    }
                }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + r] = hsum8(acc[r][t]);
        }
    };
};

// q6_K: q in 0..63 with the offset 32 folded into the zero-point term; 16 int8 scales, one per
// 16 weights: vector j (weights 32j..32j+31) takes sc[2j] in its low lane and sc[2j+1] in its high.
struct TileQ6K {
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
            const __m256i split = _mm256_set_epi8(3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2,  //
                                                  1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
            __m256 acc[RM][RN];
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) acc[r][t] = _mm256_setzero_ps();
            const int64_t nb = a.K / QK_K;
            for (int64_t b = 0; b < nb; b++) {
                const block_q6_K* w[RM];
                __m256i sc[RM];
                for (int r = 0; r < RM; r++) {
                    w[r] = (const block_q6_K*)(a.W + (n + r) * a.wrb) + b;
                    prefetch_block(w[r], sizeof(block_q6_K));
                    sc[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)w[r]->scales));
                }
                const block_q8_K* x[RN];
                for (int t = 0; t < RN; t++) x[t] = (const block_q8_K*)(a.X + (m + t) * a.xrb) + b;
                __m256i sum[RM][RN];
                for (int r = 0; r < RM; r++)
                    for (int t = 0; t < RN; t++) sum[r][t] = _mm256_setzero_si256();
                // step s covers vectors j = 4h + (s & 1) and j + 2: low and high nibbles of one ql run
                for (int s = 0; s < 4; s++) {
                    const int h = s / 2, j0 = 4 * h + (s & 1), j1 = j0 + 2;
                    __m256i q0[RM], q1[RM], s0[RM], s1[RM];
                    for (int r = 0; r < RM; r++) {
                        const __m256i l = _mm256_loadu_si256((const __m256i*)(w[r]->ql + 64 * h + 32 * (s & 1)));
                        const __m256i qh = _mm256_loadu_si256((const __m256i*)(w[r]->qh + 32 * h));
                        const int sh = 2 * (s & 1);  // vector j uses qh bits 2*(j%4) .. +1
                        const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, sh), m2);
                        const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, sh + 4), m2);
                        q0[r] = _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_slli_epi16(h0, 4));
                        q1[r] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l, 4), m4), _mm256_slli_epi16(h1, 4));
                        s0[r] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc[r], _mm256_set1_epi32(j0)), split);
                        s1[r] = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc[r], _mm256_set1_epi32(j1)), split);
                    }
                    for (int t = 0; t < RN; t++) {
                        const __m256i x0 = _mm256_loadu_si256((const __m256i*)(x[t]->qs + 32 * j0));
                        const __m256i x1 = _mm256_loadu_si256((const __m256i*)(x[t]->qs + 32 * j1));
                        for (int r = 0; r < RM; r++) {
                            const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(q0[r], x0), s0[r]);
                            const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(q1[r], x1), s1[r]);
                            sum[r][t] = _mm256_add_epi32(sum[r][t], _mm256_add_epi32(p0, p1));
                        }
                    }
                }
                for (int t = 0; t < RN; t++) {
                    const __m256i bs = _mm256_loadu_si256((const __m256i*)x[t]->bsums);
                    for (int r = 0; r < RM; r++) {
                        const float d = half(w[r]->d) * x[t]->d;
                        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r][t]), _mm256_set1_ps(d), acc[r][t]);
                        const __m256 zp = _mm256_cvtepi32_ps(_mm256_madd_epi16(sc[r], bs));
                        acc[r][t] = _mm256_fnmadd_ps(zp, _mm256_set1_ps(32.f * d), acc[r][t]);
                    }
                }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + r] = hsum8(acc[r][t]);
        }
    };
};

template <int RM, int RN>
using TileQ4_K = TileQ45K<false>::T<RM, RN>;
template <int RM, int RN>
using TileQ5_K = TileQ45K<true>::T<RM, RN>;
template <int RM, int RN>
using TileQ6_K = TileQ6K::T<RM, RN>;

// The lane-layout tiles (kernel_lanes256.h) without VNNI: vpmaddubsw adds each byte pair's products
// into int16, the chain adds those vectors in int16 and vpmaddwd by ones widens it to int32 lanes
// once. A chain stays below 2^15: each vector adds at most 2 x qmax x 127 per int16 lane, so a chain
// takes all eight q4_K vectors of a super-block, four of q5_K, two of q6_K.
struct DotMaddubs {
    using Sum = __m256i;
    static constexpr int R16_TOKENS = 4;  // kernel_r16_256.h's tile (2, 3, 4 and 6: within 5% from 3 tokens on)
    static constexpr int chain(int qmax) { return 32767 / (2 * 127 * qmax); }
    static __m256i start(__m256i) { return _mm256_setzero_si256(); }
    static __m256i dot(__m256i s, __m256i q, __m256i x) { return _mm256_add_epi16(s, _mm256_maddubs_epi16(q, x)); }
    static __m256i end(__m256i v, __m256i s) { return _mm256_add_epi32(v, _mm256_madd_epi16(s, _mm256_set1_epi16(1))); }
};

// k-quants: up to MAX_TILE tokens by the register tiles above, one weight row per tile (bound by memory;
// more rows stream worse here, bench/NOTES.md change 9) and up to 4 tokens per pass over it, each row
// unpacked once per 4 tokens; more tokens by the lane tiles. On Zen 2 (no VNNI), 2 threads, the 248320 x
// 2048 head at 2 tokens: the lane tiles took 2.2x (q4_K) one token's time, these tiles 1.65x. q6_K stays
// on the lane tiles from 2 tokens: with its tiles at 2-7 tokens (2.8x -> 1.37x on the head) a q6_K model's
// 24-token forward left its one-token results by 0.19 in tests/test_convert.py (cause not found).
template <template <int, int> class Tile, class Kind, int MAX_TILE>
void gemm_kquant(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
                 int64_t n0, int64_t n1) {
    if (M > MAX_TILE) return gemm_kquant_tiles<Kind>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
    const Args a{W, wrb, X, xrb, K, Y, ldy};
    for (int64_t n = n0; n < n1; n++) tokens<1, Tile>(a, n, M);
}

// The low-bit super-block types: one token by TileLow256 (RM_GEMV rows per tile), a few by its tiles of up
// to four tokens, more by the lane tiles (KindLowV), which unpack a row once for all token groups.
// LANES_FROM: in cache, one thread, q3_K 512 x 2048 on Zen 2 (bench/native/kbench): 8 tokens 18.9 -> 16.6
// ns per super-block and token, 16 tokens 13.9, 64 tokens 19.4 -> 12.0; the iq types 23 -> 17 at 64 tokens;
// iq4_xs (its signs taken per token) 8 tokens 22.4 -> 25.3, 16 tokens 21.6, 64 tokens 22.6 -> 18.7.
template <class Low>
constexpr int lanes_from() { return lane_signs<Low>() ? 16 : 8; }
template <class Low, int RM_GEMV>
void gemm_low256(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
                 int64_t n0, int64_t n1) {
    if constexpr (Low::LANE_QMAX > 0)
        if (M >= lanes_from<Low>()) return gemm_kquant_tiles<KindLowV<DotMaddubs, Low>>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
    gemm_tiled<TileLow256<Low>::template T, RM_GEMV, 1>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
}

template <int RM, int RN>
using TileQ2_K = TileLow256<LowQ2K>::T<RM, RN>;
template <int RM, int RN>
using TileQ3_K = TileLow256<LowQ3K>::T<RM, RN>;
template <int RM, int RN>
using TileIQ4_XS = TileLow256<LowIQ4XS>::T<RM, RN>;
template <int RM, int RN>
using TileIQ2_XXS = TileLow256<LowIQ2XXS>::T<RM, RN>;
template <int RM, int RN>
using TileIQ2_XS = TileLow256<LowIQ2XS>::T<RM, RN>;
template <int RM, int RN>
using TileIQ2_S = TileLow256<LowIQ2S>::T<RM, RN>;
template <int RM, int RN>
using TileIQ3_XXS = TileLow256<LowIQ3XXS>::T<RM, RN>;
template <int RM, int RN>
using TileIQ3_S = TileLow256<LowIQ3S>::T<RM, RN>;
template <int RM, int RN>
using TileQ5_0 = TileQ8A<UnpackQ5_0>::T<RM, RN>;
template <int RM, int RN>
using TileIQ4_NL = TileQ8A<UnpackIQ4NL>::T<RM, RN>;
template <int RM, int RN>
using TileMXFP4 = TileQ8A<UnpackMXFP4>::T<RM, RN>;
template <int RM, int RN>
using TileQ4_1 = TileQ8A1<false>::T<RM, RN>;
template <int RM, int RN>
using TileQ5_1 = TileQ8A1<true>::T<RM, RN>;

Kernels make_avx2() {
    Kernels k = {
    "avx2",
    "avx2",
    gemm_tiled<TileF32, 4, 2>,
    gemm_tiled<TileF16, 4, 2>,
    gemm_tiled<TileBF16, 4, 2>,
    gemm_tiled<TileQ8_0, 1, 2>,
    gemm_tiled<TileQ4_0, 1, 2>,
    gemm_kquant<TileQ4_K, KindQ45KV<DotMaddubs, false>, 3>,
    gemm_kquant<TileQ5_K, KindQ45KV<DotMaddubs, true>, 3>,
    gemm_kquant<TileQ6_K, KindQ6KV<DotMaddubs>, 1>,
    gemm_r16<TileR16<DotMaddubs>>,
    };
    k.gemm_q4_1 = gemm_tiled<TileQ4_1, 1, 2>;
    k.gemm_q5_0 = gemm_tiled<TileQ5_0, 1, 2>;
    k.gemm_q5_1 = gemm_tiled<TileQ5_1, 1, 2>;
    k.gemm_iq4_nl = gemm_tiled<TileIQ4_NL, 1, 2>;
    k.gemm_mxfp4 = gemm_tiled<TileMXFP4, 1, 2>;
    k.gemm_q2_K = gemm_low256<LowQ2K, 1>;
    k.gemm_q3_K = gemm_low256<LowQ3K, 2>;
    k.gemm_q3_K_r16 = gemm_r16<TileKR16<R16Q3K>>;
    k.gemm_q6_K_r16 = gemm_r16<TileKR16<R16Q6K>>;
    k.gemm_q5_K_r16 = gemm_r16<TileQ5KR16>;
    k.gemm_iq4_xs_r16 = gemm_r16<TileIQ4XSR16>;
    k.gemm_iq3_xxs_r16 = gemm_r16<TileIQ3XXSR16>;
    k.gemm_iq3_s_r16 = gemm_r16<TileIQ3SR16>;
    k.gemm_iq4_nl_r16 = gemm_r16<TileIQ4NLR16>;
    k.gemm_mxfp4_r16 = gemm_r16<TileMXFP4R16>;
    k.gemm_iq4_xs = gemm_low256<LowIQ4XS, 1>;
    k.gemm_iq2_xxs = gemm_low256<LowIQ2XXS, 1>;
    k.gemm_iq2_xs = gemm_low256<LowIQ2XS, 1>;
    k.gemm_iq2_s = gemm_low256<LowIQ2S, 1>;
    k.gemm_iq3_xxs = gemm_low256<LowIQ3XXS, 1>;
    k.gemm_iq3_s = gemm_low256<LowIQ3S, 1>;
    k.gemm_iq1_s = gemm_low256<LowIQ1S, 1>;
    k.gemm_iq1_m = gemm_low256<LowIQ1M, 1>;
    return k;
}

}  // namespace

const Kernels* kernels_avx2() {
    static const Kernels table = make_avx2();  // (built on first use: other tables start from it)
    return &table;
}

}  // namespace clover
