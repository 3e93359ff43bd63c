// AVX2 products of the low-bit and legacy formats (lowbit.h), included by kernels_avx2.cpp only (it is
// the file compiled with -mavx2). The integers are lowbit.h's, unpacked with vector code:
// - super-blocks of 256 (q2_K, q3_K, iq4_xs, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s) against block_q8_K: one
//   32-weight vector at a time as magnitudes (u8) and signs, vpmaddubsw with the signed activations, vpmaddwd
//   with the groups' int16 scales (two groups of 16 per vector), int32 sums per super-block, then one float
//   multiply-add by d * factor * x.d per super-block (q2_K's mins through the q8_K group sums);
// - blocks of 32 (q4_1, q5_0, q5_1, iq4_nl, mxfp4) against block_q8_a, through kernels_avx2.cpp's TileQ8A
//   (signed weights) or TileQ8A1 below (unsigned weights plus a min: d q + m).
// Register tiles of RM rows x RN tokens reuse each unpacked vector for RN tokens.
#pragma once

#include <immintrin.h>

#include <array>
#include <utility>

#include "lowbit.h"

namespace clover {
namespace {

// For each of ksigns_iq2xs' 128 sign bytes, its 8 signs as bytes: +1, or -1 where the bit is set (the form
// vpsignb takes).
inline const std::array<uint64_t, 128>& signs64() {
    static const std::array<uint64_t, 128> t = [] {
        std::array<uint64_t, 128> out{};
        for (int i = 0; i < 128; i++)
            for (int j = 0; j < 8; j++)
                out[i] |= (uint64_t)(((ksigns_iq2xs[i] >> j) & 1) ? 0xff : 0x01) << (8 * j);
        return out;
    }();
    return t;
}

// 32 bits (bit j for byte j) spread to bytes: each byte ANDed with its own bit (nonzero where the bit is set).
inline __m256i spread_bits(uint32_t bits) {
    const __m256i rep = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                            _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                             2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    return _mm256_and_si256(rep, _mm256_set1_epi64x((long long)0x8040201008040201ull));
}

// 32 sign bits (bit j: weight j negative) as 32 bytes of +1 / -1.
inline __m256i bits_to_signs(uint32_t bits) {
    const __m256i set = _mm256_cmpeq_epi8(spread_bits(bits), _mm256_setzero_si256());  // 0xff where clear
    return _mm256_or_si256(_mm256_andnot_si256(set, _mm256_set1_epi8(-1)), _mm256_set1_epi8(1));
}

// 32 bits (bit j for byte j) as bytes 0 / 1.
inline __m256i bits_to_bytes01(uint32_t bits) { return _mm256_min_epu8(spread_bits(bits), _mm256_set1_epi8(1)); }

inline __m256i nibbles_32(const uint8_t* qs) {
    const __m128i q = _mm_loadu_si128((const __m128i*)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
}

inline __m256i lookup16(__m256i nib, const int8_t* table) {
    const __m128i t = _mm_loadu_si128((const __m128i*)table);
    return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nib);
}


// ---- super-blocks of 256: one unpacker per format ----
// prepare(block, pre): per super-block and row, what every vector needs (decoded scales, d).
// vec(block, pre, v, mag, sgn, sc): weights 32 v .. 32 v + 31 as magnitudes and signs (SIGNED), and the int16
// scales of its two groups of 16.

struct PreScales {
    __m256i sc;  // the 16 groups' int16 scales
    float d;     // d * factor
};

inline void set_scales(PreScales& p, const int16_t sc[16]) { p.sc = _mm256_loadu_si256((const __m256i*)sc); }

// The scales of vector v's two groups (2 v, 2 v + 1), each in 8 int16 lanes of its 128-bit half: the dword
// holding the pair to every lane, then each half its own word.
template <int v>
inline __m256i scale_pair(const PreScales& p) {
    const __m256i pair = _mm256_permutevar8x32_epi32(p.sc, _mm256_set1_epi32(v));
    return _mm256_shuffle_epi8(pair, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3,
                                                      2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
}

struct LowQ2K {
    using Block = block_q2_K;
    static constexpr bool SIGNED = false, MINS = true, OFFSET = false;
    static void prepare(const Block& b, PreScales& p) {
        p.sc = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_loadu_si128((const __m128i*)b.scales), _mm_set1_epi8(0x0f)));
        p.d = _cvtsh_ss(b.d);
    }
    template <int v>
    static void vec(const Block& b, const PreScales& p, __m256i& mag, __m256i&, __m256i& sc) {
        const __m256i q = _mm256_loadu_si256((const __m256i*)(b.qs + 32 * (v / 4)));
        mag = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (v % 4)), _mm256_set1_epi8(3));
        sc = scale_pair<v>(p);
    }
    // sum_g min_g * bsum_g
    static int32_t mins(const Block& b, const block_q8_K& x) {
        const __m256i m = _mm256_cvtepu8_epi16(_mm_srli_epi16(_mm_loadu_si128((const __m128i*)b.scales), 4));
        const __m256i mm = _mm256_and_si256(m, _mm256_set1_epi16(0x0f));
        const __m256i s = _mm256_madd_epi16(mm, _mm256_loadu_si256((const __m256i*)x.bsums));
        const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        return hsum_i32(h);
    }
};

struct LowQ3K {
    // q = u - 4 with u = low 2 bits | high bit << 2 in 0..7: vpmaddubsw takes u as it is (no sign juggling), and
    // the -4 comes back once per super-block through the q8_K group sums (OFFSET: 4 sum_g scale_g bsum_g)
    using Block = block_q3_K;
    static constexpr bool SIGNED = false, MINS = false, OFFSET = true;
    static void prepare(const Block& b, PreScales& p) {
        // decode_scales_q3_K by 32-bit words: scales 4k..4k+3 in word k
        uint32_t a[3];
        std::memcpy(a, b.scales, 12);
        constexpr uint32_t m2 = 0x0f0f0f0f, m1 = 0x03030303;
        const __m128i s8 = _mm_setr_epi32((int)((a[0] & m2) | ((a[2] & m1) << 4)),
                                          (int)((a[1] & m2) | (((a[2] >> 2) & m1) << 4)),
                                          (int)(((a[0] >> 4) & m2) | (((a[2] >> 4) & m1) << 4)),
                                          (int)(((a[1] >> 4) & m2) | (((a[2] >> 6) & m1) << 4)));
        p.sc = _mm256_cvtepi8_epi16(_mm_sub_epi8(s8, _mm_set1_epi8(32)));
        p.d = _cvtsh_ss(b.d);
    }
    template <int v>
    static void vec(const Block& b, const PreScales& p, __m256i& mag, __m256i&, __m256i& sc) {
        const __m256i q = _mm256_loadu_si256((const __m256i*)(b.qs + 32 * (v / 4)));
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (v % 4)), _mm256_set1_epi8(3));
        const __m256i hm = _mm256_loadu_si256((const __m256i*)b.hmask);
        const __m256i h = _mm256_and_si256(_mm256_srli_epi16(hm, v), _mm256_set1_epi8(1));
        mag = _mm256_or_si256(lo, _mm256_slli_epi16(h, 2));
        sc = scale_pair<v>(p);
    }
};

struct LowIQ4XS {
    using Block = block_iq4_xs;
    static constexpr bool SIGNED = true, MINS = false, OFFSET = false;
    static void prepare(const Block& b, PreScales& p) {
        int8_t ls[8];
        decode_scales_iq4_xs(b, ls);
        int16_t sc[16];
        for (int j = 0; j < 8; j++) sc[2 * j] = sc[2 * j + 1] = ls[j];
        set_scales(p, sc);
        p.d = _cvtsh_ss(b.d);
    }
    template <int v>
    static void vec(const Block& b, const PreScales& p, __m256i& mag, __m256i& sgn, __m256i& sc) {
        sgn = lookup16(nibbles_32(b.qs + 16 * v), kvalues_iq4nl);
        mag = _mm256_abs_epi8(sgn);
        sc = scale_pair<v>(p);
    }
};

struct LowIQ2XXS {
    using Block = block_iq2_xxs;
    static constexpr bool SIGNED = true, MINS = false, OFFSET = false;
    static void prepare(const Block& b, PreScales& p) {
        int16_t sc[16];
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux1;
            std::memcpy(&aux1, b.qs + 4 * ib + 2, 4);
            sc[2 * ib] = sc[2 * ib + 1] = (int16_t)(2 * (aux1 >> 28) + 1);
        }
        set_scales(p, sc);
        p.d = _cvtsh_ss(b.d) * 0.125f;
    }
    template <int v>
    static void vec(const Block& b, const PreScales& p, __m256i& mag, __m256i& sgn, __m256i& sc) {
        uint32_t aux0, aux1;
        std::memcpy(&aux0, b.qs + 4 * v, 4);
        std::memcpy(&aux1, b.qs + 4 * v + 2, 4);
        const uint8_t* i = (const uint8_t*)&aux0;
        mag = _mm256_set_epi64x((long long)iq2xxs_grid[i[3]], (long long)iq2xxs_grid[i[2]],
                                (long long)iq2xxs_grid[i[1]], (long long)iq2xxs_grid[i[0]]);
        const auto& s = signs64();
        sgn = _mm256_set_epi64x((long long)s[(aux1 >> 21) & 127], (long long)s[(aux1 >> 14) & 127],
                                (long long)s[(aux1 >> 7) & 127], (long long)s[aux1 & 127]);
        sc = scale_pair<v>(p);
    }
};

struct LowIQ2XS {
    using Block = block_iq2_xs;
    static constexpr bool SIGNED = true, MINS = false, OFFSET = false;
    static void prepare(const Block& b, PreScales& p) {
        // 2 s + 1 for the 16 nibbles of scales[8]: nibbles to bytes, then widened
        const __m128i raw = _mm_loadl_epi64((const __m128i*)b.scales);
        const __m128i nib = _mm_and_si128(_mm_unpacklo_epi8(raw, _mm_srli_epi16(raw, 4)), _mm_set1_epi8(0x0f));
        p.sc = _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(nib), 1), _mm256_set1_epi16(1));
        p.d = _cvtsh_ss(b.d) * 0.125f;
    }
    template <int v>
    static void vec(const Block& b, const PreScales& p, __m256i& mag, __m256i& sgn, __m256i& sc) {
        const uint16_t* q = b.qs + 4 * v;
        mag = _mm256_set_epi64x((long long)iq2xs_grid[q[3] & 511], (long long)iq2xs_grid[q[2] & 511],
                                (long long)iq2xs_grid[q[1] & 511], (long long)iq2xs_grid[q[0] & 511]);
        const auto& s = signs64();
        sgn = _mm256_set_epi64x((long long)s[q[3] >> 9], (long long)s[q[2] >> 9], (long long)s[q[1] >> 9],
                                (long long)s[q[0] >> 9]);
        sc = scale_pair<v>(p);
    }
};

struct LowIQ2S {
    using Block = block_iq2_s;
    static constexpr bool SIGNED = true, MINS = false, OFFSET = false;
    static void prepare(const Block& b, PreScales& p) {
        // 2 s + 1 for the 16 nibbles of scales[8]: nibbles to bytes, then widened
        const __m128i raw = _mm_loadl_epi64((const __m128i*)b.scales);
        const __m128i nib = _mm_and_si128(_mm_unpacklo_epi8(raw, _mm_srli_epi16(raw, 4)), _mm_set1_epi8(0x0f));
        p.sc = _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(nib), 1), _mm256_set1_epi16(1));
        p.d = _cvtsh_ss(b.d) * 0.125f;
    }
    template <int v>
    static void vec(const Block& b, const PreScales& p, __m256i& mag, __m256i& sgn, __m256i& sc) {
        const uint8_t* q = b.qs + 4 * v;
        const int h = b.qh[v];
        mag = _mm256_set_epi64x((long long)iq2s_grid[q[3] | ((h << 2) & 0x300)],
                                (long long)iq2s_grid[q[2] | ((h << 4) & 0x300)],
                                (long long)iq2s_grid[q[1] | ((h << 6) & 0x300)],
                                (long long)iq2s_grid[q[0] | ((h << 8) & 0x300)]);
        uint32_t bits;
        std::memcpy(&bits, b.qs + 32 + 4 * v, 4);
        sgn = bits_to_signs(bits);
        sc = scale_pair<v>(p);
    }
};

struct LowIQ3XXS {
    using Block = block_iq3_xxs;
    static constexpr bool SIGNED = true, MINS = false, OFFSET = false;
    static void prepare(const Block& b, PreScales& p) {
        int16_t sc[16];
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux;
            std::memcpy(&aux, b.qs + 64 + 4 * ib, 4);
            sc[2 * ib] = sc[2 * ib + 1] = (int16_t)(2 * (aux >> 28) + 1);
        }
        set_scales(p, sc);
        p.d = _cvtsh_ss(b.d) * 0.25f;
    }
    template <int v>
    static void vec(const Block& b, const PreScales& p, __m256i& mag, __m256i& sgn, __m256i& sc) {
        const uint8_t* q = b.qs + 8 * v;
        mag = _mm256_set_epi32((int)iq3xxs_grid[q[7]], (int)iq3xxs_grid[q[6]], (int)iq3xxs_grid[q[5]],
                               (int)iq3xxs_grid[q[4]], (int)iq3xxs_grid[q[3]], (int)iq3xxs_grid[q[2]],
                               (int)iq3xxs_grid[q[1]], (int)iq3xxs_grid[q[0]]);
        uint32_t aux;
        std::memcpy(&aux, b.qs + 64 + 4 * v, 4);
        const auto& s = signs64();
        sgn = _mm256_set_epi64x((long long)s[(aux >> 21) & 127], (long long)s[(aux >> 14) & 127],
                                (long long)s[(aux >> 7) & 127], (long long)s[aux & 127]);
        sc = scale_pair<v>(p);
    }
};

struct LowIQ3S {
    using Block = block_iq3_s;
    static constexpr bool SIGNED = true, MINS = false, OFFSET = false;
    static void prepare(const Block& b, PreScales& p) {
        int16_t sc[16];
        for (int j = 0; j < 8; j++) sc[2 * j] = sc[2 * j + 1] = (int16_t)(2 * ((b.scales[j / 2] >> (4 * (j % 2))) & 0xf) + 1);
        set_scales(p, sc);
        p.d = _cvtsh_ss(b.d);
    }
    template <int v>
    static void vec(const Block& b, const PreScales& p, __m256i& mag, __m256i& sgn, __m256i& sc) {
        const uint8_t* q = b.qs + 8 * v;
        const int h = b.qh[v];
        mag = _mm256_set_epi32((int)iq3s_grid[q[7] | ((h << 1) & 0x100)], (int)iq3s_grid[q[6] | ((h << 2) & 0x100)],
                               (int)iq3s_grid[q[5] | ((h << 3) & 0x100)], (int)iq3s_grid[q[4] | ((h << 4) & 0x100)],
                               (int)iq3s_grid[q[3] | ((h << 5) & 0x100)], (int)iq3s_grid[q[2] | ((h << 6) & 0x100)],
                               (int)iq3s_grid[q[1] | ((h << 7) & 0x100)], (int)iq3s_grid[q[0] | ((h << 8) & 0x100)]);
        uint32_t bits;
        std::memcpy(&bits, b.signs + 4 * v, 4);
        sgn = bits_to_signs(bits);
        sc = scale_pair<v>(p);
    }
};

template <typename U>
struct TileLow256 {
    template <int RM, int RN>
    struct T {
        using Block = typename U::Block;

        // vector V of every row, against every token (V a constant: shifts and shuffles take immediates)
        template <int V>
        static void one(const Block* const* w, const PreScales* pre, const block_q8_K* const* x, __m256i (*isum)[RN]) {
            __m256i mag[RM], sgn[RM], sc[RM];
            for (int r = 0; r < RM; r++) U::template vec<V>(*w[r], pre[r], mag[r], sgn[r], sc[r]);
            for (int t = 0; t < RN; t++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i*)(x[t]->qs + 32 * V));
                for (int r = 0; r < RM; r++) {
                    const __m256i xs = U::SIGNED ? _mm256_sign_epi8(xv, sgn[r]) : xv;
                    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(mag[r], xs), sc[r]);
                    isum[r][t] = _mm256_add_epi32(isum[r][t], p);
                }
            }
        }
        template <int... V>
        static void step(std::integer_sequence<int, V...>, const Block* const* w, const PreScales* pre,
                         const block_q8_K* const* x, __m256i (*isum)[RN]) {
            (one<V>(w, pre, x, isum), ...);
        }

        static void run(const Args& a, int64_t n, int m) {
            __m256 acc[RM][RN];
            float acc_min[RM][RN];
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) {
                    acc[r][t] = _mm256_setzero_ps();
                    acc_min[r][t] = 0.f;
                }
            const int64_t nsb = a.K / QK_K;
            for (int64_t b = 0; b < nsb; b++) {
                const Block* w[RM];
                PreScales pre[RM];
                for (int r = 0; r < RM; r++) {
                    w[r] = (const Block*)(a.W + (n + r) * a.wrb) + b;
                    prefetch_block(w[r], sizeof(Block));
                    U::prepare(*w[r], pre[r]);
                }
                const block_q8_K* x[RN];
                for (int t = 0; t < RN; t++) x[t] = (const block_q8_K*)(a.X + (m + t) * a.xrb) + b;
                __m256i isum[RM][RN];
                for (int r = 0; r < RM; r++)
                    for (int t = 0; t < RN; t++) isum[r][t] = _mm256_setzero_si256();
                step(std::make_integer_sequence<int, 8>{}, w, pre, x, isum);
                if constexpr (U::OFFSET)
                    for (int r = 0; r < RM; r++)
                        for (int t = 0; t < RN; t++) {
                            const __m256i bs = _mm256_loadu_si256((const __m256i*)x[t]->bsums);
                            isum[r][t] = _mm256_sub_epi32(isum[r][t], _mm256_slli_epi32(_mm256_madd_epi16(pre[r].sc, bs), 2));
                        }
                for (int r = 0; r < RM; r++)
                    for (int t = 0; t < RN; t++) {
                        const float dx = x[t]->d;
                        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][t]), _mm256_set1_ps(pre[r].d * dx),
                                                    acc[r][t]);
                        if constexpr (U::MINS)
                            acc_min[r][t] += dx * _cvtsh_ss(w[r]->dmin) * (float)U::mins(*w[r], *x[t]);
                    }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + r] = hsum8(acc[r][t]) - acc_min[r][t];
        }
    };
};

// ---- blocks of 32 ----

struct UnpackQ5_0 {
    static constexpr int BYTES = sizeof(block_q5_0);
    static __m256i load(const uint8_t* row, int64_t b, float* d) {
        const block_q5_0* blk = (const block_q5_0*)row + b;
        *d = half(blk->d);
        uint32_t h;
        std::memcpy(&h, blk->qh, 4);
        const __m256i hb = _mm256_slli_epi16(bits_to_bytes01(h), 4);
        return _mm256_sub_epi8(_mm256_or_si256(nibbles_32(blk->qs), hb), _mm256_set1_epi8(16));
    }
};
struct UnpackIQ4NL {
    static constexpr int BYTES = sizeof(block_iq4_nl);
    static __m256i load(const uint8_t* row, int64_t b, float* d) {
        const block_iq4_nl* blk = (const block_iq4_nl*)row + b;
        *d = half(blk->d);
        return lookup16(nibbles_32(blk->qs), kvalues_iq4nl);
    }
};
struct UnpackMXFP4 {
    static constexpr int BYTES = sizeof(block_mxfp4);
    static __m256i load(const uint8_t* row, int64_t b, float* d) {
        const block_mxfp4* blk = (const block_mxfp4*)row + b;
        *d = e8m0_to_fp32_half(blk->e);
        return lookup16(nibbles_32(blk->qs), kvalues_mxfp4);
    }
};

// q4_1 / q5_1: unsigned q and a min: d_w d_x sum(q x) + m d_x sum(x).
template <bool FIVE>
struct TileQ8A1 {
    using Block = std::conditional_t<FIVE, block_q5_1, block_q4_1>;
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            const __m256i ones16 = _mm256_set1_epi16(1), ones8 = _mm256_set1_epi8(1);
            __m256 acc[RM][RN];
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) acc[r][t] = _mm256_setzero_ps();
            const int64_t nb = a.K / QK;
            for (int64_t b = 0; b < nb; b++) {
                __m256i q[RM];
                float dw[RM], mw[RM];
                for (int r = 0; r < RM; r++) {
                    const Block* blk = (const Block*)(a.W + (n + r) * a.wrb) + b;
                    __builtin_prefetch((const char*)blk + PREFETCH_BYTES);
                    dw[r] = half(blk->d);
                    mw[r] = half(blk->m);
                    q[r] = nibbles_32(blk->qs);
                    if constexpr (FIVE) {
                        uint32_t h;
                        std::memcpy(&h, blk->qh, 4);
                        q[r] = _mm256_or_si256(q[r], _mm256_slli_epi16(bits_to_bytes01(h), 4));
                    }
                }
                for (int t = 0; t < RN; t++) {
                    const block_q8_a* xb = (const block_q8_a*)(a.X + (m + t) * a.xrb) + b;
                    const __m256i x = _mm256_loadu_si256((const __m256i*)xb->qs);
                    const __m256 sx = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(ones8, x), ones16));
                    for (int r = 0; r < RM; r++) {
                        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(q[r], x), ones16));
                        acc[r][t] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw[r] * xb->d), acc[r][t]);
                        acc[r][t] = _mm256_fmadd_ps(sx, _mm256_set1_ps(mw[r] * xb->d), acc[r][t]);
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
