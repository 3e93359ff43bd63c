// AVX2 products of the low-bit and legacy formats (lowbit.h), included by kernels_avx2.cpp only (it is
// the file compiled with -mavx2). The integers are lowbit.h's, unpacked with vector code:
// - super-blocks of 256 (q2_K, q3_K, iq4_xs, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m) against block_q8_K: one
//   32-weight vector at a time as magnitudes (u8) and signs, vpmaddubsw with the signed activations, vpmaddwd
//   with the groups' int16 scales (two groups of 16 per vector), int32 sums per super-block, then one float
//   multiply-add by d * factor * x.d per super-block (q2_K's mins through the q8_K group sums);
// - blocks of 32 (q4_1, q5_0, q5_1, iq4_nl, mxfp4) against block_q8_a, through kernels_avx2.cpp's TileQ8A
//   (signed weights) or TileQ8A1 below (unsigned weights plus a min: d q + m).
// Register tiles of RM rows x RN tokens reuse each unpacked vector for RN tokens.
#pragma once

#include <immintrin.h>

#include <array>
#include <type_traits>
#include <utility>

#include "kernel_r16.h"
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
    static constexpr int LANE_SHIFT = -1, LANE_QMAX = 3;  // (KindLowV: stored as q, no offset)
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
    // the 16 groups' mins as int16
    static __m256i mins16(const Block& b) {
        return _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i*)b.scales), 4),
                                                  _mm_set1_epi8(0x0f)));
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
    static constexpr int LANE_SHIFT = 2, LANE_QMAX = 7;  // (KindLowV: stored as u = q + 4)
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
    static constexpr int LANE_SHIFT = -1, LANE_QMAX = 127;  // (KindLowV: -127..113 as magnitude and sign)
    static constexpr bool LANE_SIGNS = true;
    static void prepare(const Block& b, PreScales& p) {
        // decode_scales_iq4_xs in lanes: group j's 6-bit scale from nibble j of scales_l (bits 4j..4j+3 of
        // its 32 bits) and bits 2j, 2j+1 of scales_h, minus 32; each dword then holds it twice (the int16
        // scales of groups 2j and 2j+1 of 16). In registers: no 16 scalar stores read back as one vector.
        uint32_t lo;
        std::memcpy(&lo, b.scales_l, 4);
        const __m256i j = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i l = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)lo), _mm256_slli_epi32(j, 2)),
                                           _mm256_set1_epi32(0xf));
        const __m256i h = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b.scales_h), _mm256_add_epi32(j, j)),
                                           _mm256_set1_epi32(3));
        const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(l, _mm256_slli_epi32(h, 4)), _mm256_set1_epi32(32));
        p.sc = _mm256_or_si256(_mm256_and_si256(ls, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(ls, 16));
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
    static constexpr int LANE_SHIFT = 6, LANE_QMAX = 107;  // (KindLowV: q in +-43, stored as q + 64)
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

// IQ2_XS and IQ2_S: scales 2 s + 1 from the 16 nibbles of scales[8] (nibbles to bytes, then widened), d / 8
inline void prepare_nibble_scales(const uint8_t* scales8, uint16_t d, PreScales& p) {
    const __m128i raw = _mm_loadl_epi64((const __m128i*)scales8);
    const __m128i nib = _mm_and_si128(_mm_unpacklo_epi8(raw, _mm_srli_epi16(raw, 4)), _mm_set1_epi8(0x0f));
    p.sc = _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(nib), 1), _mm256_set1_epi16(1));
    p.d = _cvtsh_ss(d) * 0.125f;
}

struct LowIQ2XS {
    using Block = block_iq2_xs;
    static constexpr bool SIGNED = true, MINS = false, OFFSET = false;
    static constexpr int LANE_SHIFT = 6, LANE_QMAX = 107;  // (KindLowV: q in +-43, stored as q + 64)
    static void prepare(const Block& b, PreScales& p) { prepare_nibble_scales(b.scales, b.d, p); }
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
    static constexpr int LANE_SHIFT = 6, LANE_QMAX = 107;  // (KindLowV: q in +-43, stored as q + 64)
    static void prepare(const Block& b, PreScales& p) { prepare_nibble_scales(b.scales, b.d, p); }
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
    static constexpr int LANE_SHIFT = 6, LANE_QMAX = 126;  // (KindLowV: q in +-62, stored as q + 64)
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
    static constexpr int LANE_SHIFT = 4, LANE_QMAX = 31;  // (KindLowV: q in +-15, stored as q + 16)
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

// iq1_s / iq1_m: q = 8 g + delta (lowbit.h) as bytes: vpsignb puts 8 g (g = -1, 0, 1 from iq1s_grid), a byte add
// the delta (+1 or -1, never cancelling, so every q is odd and vpsignb's zero case never arises); the signs are
// q itself, the magnitudes |q| <= 9.
inline __m256i iq1_values(__m256i grid, __m256i delta) {
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), grid), delta);
}

struct LowIQ1S {
    using Block = block_iq1_s;
    static constexpr bool SIGNED = true, MINS = false, OFFSET = false;
    static constexpr int LANE_SHIFT = 4, LANE_QMAX = 25;  // (KindLowV: q in +-9, stored as q + 16)
    static void prepare(const Block& b, PreScales& p) {
        // 2 s + 1 from bits 12-14 of qh[j], in both int16 lanes of dword j (groups 2 j, 2 j + 1 of 16)
        const __m128i qh = _mm_loadu_si128((const __m128i*)b.qh);
        const __m128i s = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7)), 1),
                                       _mm_set1_epi16(1));
        const __m256i s32 = _mm256_cvtepu16_epi32(s);
        p.sc = _mm256_or_si256(s32, _mm256_slli_epi32(s32, 16));
        p.d = _cvtsh_ss(b.d) * 0.125f;
    }
    template <int v>
    static void vec(const Block& b, const PreScales& p, __m256i& mag, __m256i& sgn, __m256i& sc) {
        const int h = b.qh[v];
        const uint8_t* q = b.qs + 4 * v;
        const __m256i grid = _mm256_set_epi64x(
            (long long)iq1s_grid[q[3] | ((h >> 1) & 0x700)], (long long)iq1s_grid[q[2] | ((h << 2) & 0x700)],
            (long long)iq1s_grid[q[1] | ((h << 5) & 0x700)], (long long)iq1s_grid[q[0] | ((h << 8) & 0x700)]);
        sgn = iq1_values(grid, _mm256_set1_epi8((h & 0x8000) ? -1 : 1));
        mag = _mm256_abs_epi8(sgn);
        sc = scale_pair<v>(p);
    }
};

struct LowIQ1M {
    using Block = block_iq1_m;
    static constexpr bool SIGNED = true, MINS = false, OFFSET = false;
    static constexpr int LANE_SHIFT = 4, LANE_QMAX = 25;  // (KindLowV: q in +-9, stored as q + 16)
    static void prepare(const Block& b, PreScales& p) {
        // group g's 2 s + 1 from bits 3 (g % 4) of scale word g / 4: the word to each of its 4 lanes (byte
        // shuffle), shifted left by 9 - 3 (g % 4) (a multiply), so that the 3 bits land at bits 9-11
        const __m256i w = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)iq1m_words64(b)),
                                              _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4,
                                                               5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7));
        const __m256i s = _mm256_and_si256(_mm256_srli_epi16(_mm256_mullo_epi16(w, _mm256_set1_epi64x(0x0001000800400200LL)), 9),
                                           _mm256_set1_epi16(7));
        p.sc = _mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1));
        p.d = _cvtsh_ss(iq1m_d(b)) * 0.125f;
    }
    template <int v>
    static void vec(const Block& b, const PreScales& p, __m256i& mag, __m256i& sgn, __m256i& sc) {
        uint16_t h;
        std::memcpy(&h, b.qh + 2 * v, 2);  // the nibbles of entries 4 v .. 4 v + 3, low first
        const uint8_t* q = b.qs + 4 * v;
        const __m256i grid = _mm256_set_epi64x(
            (long long)iq1s_grid[q[3] | ((h >> 4) & 0x700)], (long long)iq1s_grid[q[2] | (h & 0x700)],
            (long long)iq1s_grid[q[1] | ((h << 4) & 0x700)], (long long)iq1s_grid[q[0] | ((h << 8) & 0x700)]);
        // each entry's delta bit (bit 3 of its nibble: bits 3, 7, 11, 15 of h) tested in the 4 words of its qword:
        // -1 (0xffff) where set, then OR 1: -1 or +1 per byte
        const __m256i bit = _mm256_setr_epi64x(0x0008000800080008LL, 0x0080008000800080LL, 0x0800080008000800LL,
                                               (long long)0x8000800080008000ULL);
        const __m256i neg = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)h), bit), bit);
        sgn = iq1_values(grid, _mm256_or_si256(neg, _mm256_set1_epi8(1)));
        mag = _mm256_abs_epi8(sgn);
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

// ---- low-bit types repacked by 16 rows: one row per int32 lane, 8 rows per register ----
// What the q3_K, q6_K and iq4_xs tiles share: kernel_r16.h's driver, with one group of tokens (rows) unpacking
// each weight word as it goes, and several groups (step) the first unpacking the super-block once into a
// thread's scratch (Unpacked) that every group reads, as the file layout's lane tiles (KindLowV) do per row
// (T::GROUP_SCRATCH; without it every group unpacks as one group does).
template <class T, class Unpacked>
struct R16LowScratch : R16SumsInMemory<T> {
    static constexpr bool PAIRS = false;  // (the tiles read block_q8_K's bsums themselves)
    static constexpr int GMAX = 4;        // tokens per weight load, as TileR16<DotMaddubs>
    __attribute__((always_inline)) static Unpacked& scratch() {
        static thread_local Unpacked un;
        return un;
    }
    template <Prefetch PF>
    __attribute__((always_inline)) static void prefetch(const void* p) {
        prefetch_r16<PF, 2048, 8192>(p);
    }
    // the super-block ahead in the first half's pass, an eighth of its lines at each of 8 steps k (a burst
    // of all at the start left q3_K's one token from memory at 45.6 ns per super-block row, 19.6 in cache;
    // spread, 21.0 from memory)
    template <Prefetch PF>
    __attribute__((always_inline)) static void prefetch_part(const void* p, int h, int k) {
        constexpr int LINES = (int)(sizeof(typename T::Block) + 63) / 64, PER = (LINES + 7) / 8;
        if (PF != Prefetch::NONE && h == 0)
            for (int l = PER * k; l < PER * k + PER && l < LINES; l++) prefetch<PF>((const char*)p + 64 * l);
    }
    // One super-block for one of several groups (R16SumsInMemory's, with the unpacking shared).
    template <int G, class B>
    static void step(const B& p, int64_t s, const block_q8_K* const* xs, const int32_t* const* bsp, float* acc,
                     bool first) {
        if constexpr (!T::GROUP_SCRATCH)  // each group unpacks the words again, as one group does
            return R16SumsInMemory<T>::template step<G>(p, s, xs, bsp, acc, first);
        if (first) {
            for (size_t k = 0; k < sizeof(B); k += 64) prefetch<Prefetch::L2>((const char*)&p + k);
            T::unpack_all(p);
        }
        T::template superblock<G, Prefetch::NONE, true>(p, s, xs, bsp, acc);
    }
};

// q3_K and q6_K (block_q3_K_r16, block_q6_K_r16): per half (rows 8h .. 8h + 7), vector v (weights 32 v ..
// 32 v + 31) and word t, u = the weights' unsigned codes (q3_K: low 2 bits | high bit << 2, q + 4 in 0..7;
// q6_K: low nibble | high 2 bits << 4, q + 32 in 0..63) for 4 weights of 8 rows by shifts and masks of two
// 32-byte loads, vpmaddubsw against the token's 4 activations broadcast, U::CHAIN words summed in int16
// (q3_K 4 x 2 x 7 x 127, q6_K 2 x 2 x 63 x 127), then vpmaddwd by each row's scale of that group of 16
// (pairs (sc, sc)) into int32; the offset comes back through the group sums, sum_g sc_g bsum_g by
// vpmaddwd of the (sc_2v, sc_2v + 1) pairs against the token's bsums (an int16 pair per dword, as
// block_q8_K holds them), times 2^OFFSET_SHIFT. One float multiply-add per half and token: d x d_x.
struct R16Q3K {
    using Block = block_q3_K_r16;
    static constexpr gemm_fn ref = &gemm_q3_K_r16_ref;
    static constexpr int CHAIN = 4, OFFSET_SHIFT = 2;
    static constexpr bool GROUP_SCRATCH = true;
    // u of vector v, word t of half h (8 rows x 4 weights)
    template <int v>
    __attribute__((always_inline)) static __m256i unpack(const Block& p, int h, int t) {
        constexpr int n = v / 4, j = v % 4;
        const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
        const __m256i ql = _mm256_loadu_si256((const __m256i*)p.ql[n][t][8 * h]);
        const __m256i qh = _mm256_loadu_si256((const __m256i*)p.qh[t][8 * h]);
        __m256i hb;  // the high bit to bit 2 of each byte
        if constexpr (v < 2) hb = _mm256_and_si256(_mm256_slli_epi16(qh, 2 - v), m4);
        else if constexpr (v == 2) hb = _mm256_and_si256(qh, m4);
        else hb = _mm256_and_si256(_mm256_srli_epi16(qh, v - 2), m4);
        return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql, 2 * j), m3), hb);
    }
};
struct R16Q6K {
    using Block = block_q6_K_r16;
    static constexpr gemm_fn ref = &gemm_q6_K_r16_ref;
    static constexpr int CHAIN = 2, OFFSET_SHIFT = 5;
    // several groups unpack each word again rather than read it from the scratch: 512 x 2048, one thread,
    // Zen 1, ns per super-block row and token: 8 tokens 19.2 -> 15.1, 64 tokens 17.6 -> 16.2 (the unpacking
    // is 3 simple operations a word, fewer than the scratch's stores and reloads cost here)
    static constexpr bool GROUP_SCRATCH = false;
    template <int v>
    __attribute__((always_inline)) static __m256i unpack(const Block& p, int h, int t) {
        constexpr int n = v / 4, k = v % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i*)p.ql[2 * n + k % 2][t][8 * h]);
        const __m256i qh = _mm256_loadu_si256((const __m256i*)p.qh[n][t][8 * h]);
        const __m256i lo = _mm256_and_si256(k / 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0f));
        __m256i hi;  // bits 2k, 2k + 1 to bits 4, 5
        if constexpr (2 * k < 4) hi = _mm256_slli_epi16(qh, 4 - 2 * k);
        else if constexpr (2 * k == 4) hi = qh;
        else hi = _mm256_srli_epi16(qh, 2 * k - 4);
        return _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
    }
};
struct alignas(32) UnpackedKR16 {
    __m256i u[2][8][8];  // [half][vector v][word t]
};
template <class U>
struct TileKR16 : R16LowScratch<TileKR16<U>, UnpackedKR16> {
    using Block = typename U::Block;
    using Base = R16LowScratch<TileKR16<U>, UnpackedKR16>;
    static constexpr gemm_fn ref = U::ref;
    static constexpr bool GROUP_SCRATCH = U::GROUP_SCRATCH;

    template <int G, Prefetch PF, bool SCRATCH, int v>
    __attribute__((always_inline)) static void vec(const Block& p, int h, const block_q8_K* const* xs, int64_t s,
                                                   __m256i* isum, __m256i* off) {
        Base::template prefetch_part<PF>(&p, h, v);
        // dword lane r: (sc_2v, sc_2v + 1) of row 8h + r as int16; then each one doubled
        const __m256i scp = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p.sc[v][8 * h]));
        const __m256i s0 = _mm256_shuffle_epi8(scp, _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                                                                      0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13));
        const __m256i s1 = _mm256_shuffle_epi8(scp, _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
                                                                      2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15));
        const UnpackedKR16& un = Base::scratch();
        for (int c = 0; c < 4; c += U::CHAIN) {  // words c .. c + CHAIN - 1 of each group (gg: words 4 gg ..)
            for (int gg = 0; gg < 2; gg++) {
                __m256i sum[G];
                for (int g = 0; g < G; g++) sum[g] = _mm256_setzero_si256();
                const auto word = [&](int t) __attribute__((always_inline)) {
                    const __m256i u = SCRATCH ? _mm256_load_si256(&un.u[h][v][t]) : U::template unpack<v>(p, h, t);
                    for (int g = 0; g < G; g++) {
                        int32_t a;
                        std::memcpy(&a, xs[g][s].qs + 32 * v + 4 * t, 4);
                        sum[g] = _mm256_add_epi16(sum[g], _mm256_maddubs_epi16(u, _mm256_set1_epi32(a)));
                    }
                };
                // unpacking as they go: every word unrolled (q3_K one token 26 -> 19.5 ns per super-block row
                // on Zen 1, 4 tokens 14.5 -> 12.5); from the scratch a loop
                if constexpr (!SCRATCH) {
                    for (int i = 0; i < U::CHAIN; i++) word(4 * gg + c + i);
                } else {
#pragma GCC unroll 1
                    for (int i = 0; i < U::CHAIN; i++) word(4 * gg + c + i);
                }
                for (int g = 0; g < G; g++)
                    isum[g] = _mm256_add_epi32(isum[g], _mm256_madd_epi16(sum[g], gg ? s1 : s0));
            }
        }
        for (int g = 0; g < G; g++) {
            int32_t bp;
            std::memcpy(&bp, xs[g][s].bsums + 2 * v, 4);
            off[g] = _mm256_add_epi32(off[g], _mm256_madd_epi16(scp, _mm256_set1_epi32(bp)));
        }
    }
    template <int G, Prefetch PF, bool SCRATCH, int... v>
    __attribute__((always_inline)) static void vecs(std::integer_sequence<int, v...>, const Block& p, int h,
                                                    const block_q8_K* const* xs, int64_t s, __m256i* isum, __m256i* off) {
        (vec<G, PF, SCRATCH, v>(p, h, xs, s, isum, off), ...);
    }
    template <int... v>
    static void unpack_vs(std::integer_sequence<int, v...>, const Block& p) {
        UnpackedKR16& un = Base::scratch();
        for (int h = 0; h < 2; h++)
            for (int t = 0; t < 8; t++) ((un.u[h][v][t] = U::template unpack<v>(p, h, t)), ...);
    }
    static void unpack_all(const Block& p) { unpack_vs(std::make_integer_sequence<int, 8>{}, p); }

    // Super-block s of the 16 rows at p for G tokens: acc[16 g + r] += its share of row r's dot with token g
    // (SCRATCH: the words from scratch(), which unpack_all filled from p).
    template <int G, Prefetch PF, bool SCRATCH = false>
    static void superblock(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const*, float* acc) {
        for (int h = 0; h < 2; h++) {
            __m256i isum[G], off[G];
            for (int g = 0; g < G; g++) isum[g] = off[g] = _mm256_setzero_si256();
            vecs<G, PF, SCRATCH>(std::make_integer_sequence<int, 8>{}, p, h, xs, s, isum, off);
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p.d + 8 * h)));
            for (int g = 0; g < G; g++) {
                const __m256i q = _mm256_sub_epi32(isum[g], _mm256_slli_epi32(off[g], U::OFFSET_SHIFT));
                float* a = acc + 16 * g + 8 * h;
                _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_mul_ps(d, _mm256_set1_ps(xs[g][s].d)),
                                                    _mm256_loadu_ps(a)));
            }
        }
    }
};

// q5_K (block_q5_K_r16): per half (rows 8h .. 8h + 7), chunk c and word t: the 5-bit codes of 4 weights of 8
// rows, qs's nibble or'd with qh's bit (2c for the low nibbles, sub-block 2c; 2c + 1 for the high ones)
// moved to bit 4, against the token's 4 activations broadcast by vpmaddubsw, 4 words summed in int16
// (4 x 2 x 31 x 127 < 2^15), then vpmaddwd by each row's sub-block scale (pairs (sc, sc)) into int32, so a
// half takes one float multiply-add per token (d x d_x) where q4_K's tile (TileR16) converts every
// sub-block's sum to float; the mins as TileR16's, by vpmaddwd of the (min, min) pairs against the token's
// sub-block sums (PAIRS). Up to 2 tokens both sub-blocks of a chunk come from one load of qs and qh (4
// sums per token); 3-4 tokens take them one after the other (8 sums would not fit the 16 registers).
// Several groups unpack each word again (as R16Q6K). 512 x 2048, one thread, Zen 1, ns per super-block row
// against q5_K's file layout: 1 token 31.9 -> 22.0, 2 tokens 46.4 -> 31.7, 4 95.1 -> 54.7, 8 140 -> 105,
// 64 tokens 756 -> 832.
struct TileQ5KR16 : R16SumsInMemory<TileQ5KR16> {
    using Block = block_q5_K_r16;
    static constexpr bool PAIRS = true;
    static constexpr gemm_fn ref = &gemm_q5_K_r16_ref;
    static constexpr int GMAX = 4;
    static constexpr int LINES = (int)(sizeof(Block) + 63) / 64;
    template <Prefetch PF>
    __attribute__((always_inline)) static void prefetch(const void* p) {
        prefetch_r16<PF, 2048, 8192>(p);
    }
    // dword lane r: row 8h + r's scale of sub-block j in both int16 halves
    __attribute__((always_inline)) static __m256i scale_pairs(const Block& p, int h, int j) {
        const __m256i sc32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p.sc[j] + 8 * h)));
        return _mm256_or_si256(sc32, _mm256_slli_epi32(sc32, 16));
    }
    // bits j, j + 1 of each qh byte (word t, half h) at bits 4, 5 (16-bit shifts: what crosses into the
    // next byte lands below bit 4 or above bit 5)
    __attribute__((always_inline)) static __m256i high_bits(const Block& p, int h, int t, int j) {
        const __m256i qh = _mm256_loadu_si256((const __m256i*)p.qh[t][8 * h]);
        return j < 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
    }
    __attribute__((always_inline)) static __m256i act(const block_q8_K& x, int j, int t) {
        int32_t a;
        std::memcpy(&a, x.qs + 32 * j + 4 * t, 4);
        return _mm256_set1_epi32(a);
    }

    template <int G, Prefetch PF>
    static void superblock(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const* bsp,
                           float* acc) {
        const __m256i lo4 = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
        for (int h = 0; h < 2; h++) {
            __m256i isum[G], mi[G];
            for (int g = 0; g < G; g++) isum[g] = mi[g] = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                if (h == 0)  // the super-block ahead, spread over the first half's chunks
                    for (int l = c * LINES / 4; l < (c + 1) * LINES / 4; l++) prefetch<PF>((const char*)&p + 64 * l);
                const __m256i sc0 = scale_pairs(p, h, 2 * c), sc1 = scale_pairs(p, h, 2 * c + 1);
                for (int w4 = 0; w4 < 8; w4 += 4) {  // words w4 .. w4 + 3: one int16 chain per sub-block
                    if constexpr (G <= 2) {
                        __m256i sum0[G], sum1[G];
                        for (int g = 0; g < G; g++) sum0[g] = sum1[g] = _mm256_setzero_si256();
                        for (int t = w4; t < w4 + 4; t++) {
                            const __m256i w = _mm256_loadu_si256((const __m256i*)p.qs[c][t][8 * h]);
                            const __m256i hb = high_bits(p, h, t, 2 * c);
                            const __m256i q0 = _mm256_or_si256(_mm256_and_si256(w, lo4), _mm256_and_si256(hb, bit4));
                            const __m256i q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), lo4),
                                                               _mm256_and_si256(_mm256_srli_epi16(hb, 1), bit4));
                            for (int g = 0; g < G; g++) {
                                sum0[g] = _mm256_add_epi16(sum0[g], _mm256_maddubs_epi16(q0, act(xs[g][s], 2 * c, t)));
                                sum1[g] = _mm256_add_epi16(sum1[g], _mm256_maddubs_epi16(q1, act(xs[g][s], 2 * c + 1, t)));
                            }
                        }
                        for (int g = 0; g < G; g++)
                            isum[g] = _mm256_add_epi32(_mm256_add_epi32(isum[g], _mm256_madd_epi16(sum0[g], sc0)),
                                                       _mm256_madd_epi16(sum1[g], sc1));
                    } else {
                        for (int hi = 0; hi < 2; hi++) {
                            __m256i sum[G];
                            for (int g = 0; g < G; g++) sum[g] = _mm256_setzero_si256();
                            for (int t = w4; t < w4 + 4; t++) {
                                const __m256i w = _mm256_loadu_si256((const __m256i*)p.qs[c][t][8 * h]);
                                const __m256i hb = high_bits(p, h, t, 2 * c + hi);
                                const __m256i q = _mm256_or_si256(
                                    _mm256_and_si256(hi ? _mm256_srli_epi16(w, 4) : w, lo4), _mm256_and_si256(hb, bit4));
                                for (int g = 0; g < G; g++)
                                    sum[g] = _mm256_add_epi16(sum[g], _mm256_maddubs_epi16(q, act(xs[g][s], 2 * c + hi, t)));
                            }
                            for (int g = 0; g < G; g++)
                                isum[g] = _mm256_add_epi32(isum[g], _mm256_madd_epi16(sum[g], hi ? sc1 : sc0));
                        }
                    }
                }
            }
            for (int c = 0; c < 4; c++) {
                const __m256i mn = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p.mn[c][8 * h]));
                for (int g = 0; g < G; g++)
                    mi[g] = _mm256_add_epi32(mi[g], _mm256_madd_epi16(mn, _mm256_set1_epi32(bsp[g][4 * s + c])));
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p.d + 8 * h)));
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p.dmin + 8 * h)));
            for (int g = 0; g < G; g++) {
                const __m256 dx = _mm256_set1_ps(xs[g][s].d);
                float* a = acc + 16 * g + 8 * h;
                __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[g]), _mm256_mul_ps(d, dx), _mm256_loadu_ps(a));
                v = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mi[g]), _mm256_mul_ps(dmin, dx), v);
                _mm256_storeu_ps(a, v);
            }
        }
    }
};

// iq4_xs (block_iq4_xs_r16), iq3_xxs and iq3_s transcoded (block_iq3_xxs_r16, block_iq3_s_r16: the same layout
// with other values; kernel_r16.h's Codes*): per half, group j (32 weights) and word t: the low nibbles
// (weights 32 j + 4 t .. + 3 of 8 rows) and the high ones (+ 16) looked up in the format's 16 values
// (vpshufb) as signed bytes, their magnitudes against the
// token's 4 activations broadcast with the weights' signs (vpsignb), vpmaddubsw, C::CHAIN words summed in int16
// (iq4_xs none: two products of |q| <= 127 could overflow; iq3_xxs 2 words, iq3_s 8), then vpmaddwd by each
// row's group scale (pairs (sc, sc)). One float multiply-add per half and token: d x factor x d_x.
struct alignas(32) UnpackedCodes4 {
    __m256i w[2][8][8];  // [half][group j][word t, then t + 4 for the high nibbles]: the values
};

// The values of word t of group j and half h (hi: the high nibbles) of a block in block_iq4_xs_r16's layout
// (C::Block: iq4_xs, iq3_xxs, iq3_s, iq4_nl, mxfp4), and all of them into un.
template <class C>
__attribute__((always_inline)) inline __m256i codes4_word(const typename C::Block& p, int h, int j, int t, bool hi) {
    const __m256i q = _mm256_loadu_si256((const __m256i*)p.qs[j][t][8 * h]);
    const __m256i nib = _mm256_and_si256(hi ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0f));
    return lookup16(nib, C::VALUES);
}
template <class C>
inline void codes4_unpack_all(const typename C::Block& p, UnpackedCodes4& un) {
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 8; i++) un.w[h][j][i] = codes4_word<C>(p, h, j, i % 4, i >= 4);
}

// Words i0 .. i0 + C::CHAIN - 1 of group j and half h (word i: t = i % 4, the high nibbles from 4; SCRATCH:
// from un) against G tokens, x[g] token g's 32 activations of the group: the values' magnitudes against the
// activations with the values' signs (vpmaddubsw), the words' int16 pairs summed into s16[g].
template <class C, int G, bool SCRATCH>
__attribute__((always_inline)) inline void codes4_chain(const typename C::Block& p, const UnpackedCodes4& un, int h,
                                                        int j, int i0, const int8_t* const* x, __m256i* s16) {
    for (int c = 0; c < C::CHAIN; c++) {
        const int i = i0 + c;
        const __m256i w = SCRATCH ? _mm256_load_si256(&un.w[h][j][i]) : codes4_word<C>(p, h, j, i % 4, i >= 4);
        const __m256i mag = _mm256_abs_epi8(w);
        for (int g = 0; g < G; g++) {
            int32_t a;
            std::memcpy(&a, x[g] + 16 * (i / 4) + 4 * (i % 4), 4);
            const __m256i pr = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(_mm256_set1_epi32(a), w));
            s16[g] = c == 0 ? pr : _mm256_add_epi16(s16[g], pr);
        }
    }
}

template <class C>
struct TileCodes4R16 : R16LowScratch<TileCodes4R16<C>, UnpackedCodes4> {
    using Base = R16LowScratch<TileCodes4R16<C>, UnpackedCodes4>;
    using Block = typename C::Block;
    static constexpr gemm_fn ref = C::REF;
    static constexpr bool GROUP_SCRATCH = true;


    template <int G, Prefetch PF, bool SCRATCH>
    __attribute__((always_inline)) static void group(const Block& p, int h, int j, const block_q8_K* const* xs,
                                                     int64_t s, __m256i* isum) {
        Base::template prefetch_part<PF>(&p, h, j);
        // dword lane r: group j's scale of row 8h + r in both int16 halves
        const __m256i sc32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p.sc[j] + 8 * h)));
        const __m256i sc = _mm256_blend_epi16(sc32, _mm256_slli_epi32(sc32, 16), 0xAA);
        const UnpackedCodes4& un = Base::scratch();
        // words i0 .. i0 + CHAIN - 1 (i: word t = i % 4, high nibbles from 4): their vpmaddubsw pairs summed in
        // int16, then one vpmaddwd by the group's scale
        const int8_t* x[G];
        for (int g = 0; g < G; g++) x[g] = xs[g][s].qs + 32 * j;
        const auto words = [&](int i0) __attribute__((always_inline)) {
            __m256i s16[G];
            codes4_chain<C, G, SCRATCH>(p, un, h, j, i0, x, s16);
            for (int g = 0; g < G; g++) isum[g] = _mm256_add_epi32(isum[g], _mm256_madd_epi16(s16[g], sc));
        };
        if constexpr (!SCRATCH) {
            for (int i0 = 0; i0 < 8; i0 += C::CHAIN) words(i0);
        } else {
#pragma GCC unroll 1
            for (int i0 = 0; i0 < 8; i0 += C::CHAIN) words(i0);
        }
    }
    static void unpack_all(const Block& p) { codes4_unpack_all<C>(p, Base::scratch()); }

    // Super-block s of the 16 rows at p for G tokens: acc[16 g + r] += its share of row r's dot with token g
    // (SCRATCH: the values from scratch(), which unpack_all filled from p).
    template <int G, Prefetch PF, bool SCRATCH = false>
    static void superblock(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const*,
                           float* acc) {
        for (int h = 0; h < 2; h++) {
            __m256i isum[G];
            for (int g = 0; g < G; g++) isum[g] = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) group<G, PF, SCRATCH>(p, h, j, xs, s, isum);
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p.d + 8 * h)));
            if constexpr (C::FACTOR != 1.f) d = _mm256_mul_ps(d, _mm256_set1_ps(C::FACTOR));
            for (int g = 0; g < G; g++) {
                float* a = acc + 16 * g + 8 * h;
                _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[g]),
                                                    _mm256_mul_ps(d, _mm256_set1_ps(xs[g][s].d)), _mm256_loadu_ps(a)));
            }
        }
    }
};
using TileIQ4XSR16 = TileCodes4R16<CodesIQ4XS>;
using TileIQ3XXSR16 = TileCodes4R16<CodesIQ3XXS>;
using TileIQ3SR16 = TileCodes4R16<CodesIQ3S>;

// iq4_nl and mxfp4 (block_iq4_nl_r16, block_mxfp4_r16; kernel_r16.h's Blocks*): TileCodes4R16's words with a
// float scale per block of 32 and row, the activations as block_q8_a (blocks of 32 with their own scales, as
// the file layouts' products take them). Per half, block j and word: the values' magnitudes against the
// token's 4 activations with the values' signs (vpmaddubsw), C::CHAIN words summed in int16, vpmaddwd by ones
// into the block's int32 sum; per block and token, its sum to float times the rows' scales x d_x.
template <class C>
struct TileNL4R16 : R16LowScratch<TileNL4R16<C>, UnpackedCodes4> {
    using Base = R16LowScratch<TileNL4R16<C>, UnpackedCodes4>;
    using Block = typename C::Block;
    static constexpr gemm_fn ref = C::REF;
    static constexpr bool GROUP_SCRATCH = true;
    static constexpr bool Q8A = true, BLOCK_SUMS = false;

    // rows 8h .. 8h + 7's scales of block j (fp16 d, or e8m0_to_fp32_half)
    __attribute__((always_inline)) static __m256 scales(const Block& p, int h, int j) {
        if constexpr (!C::E8M0) {
            return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p.d[j] + 8 * h)));
        } else {
            const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p.e[j] + 8 * h)));
            const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
            const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
            return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
        }
    }
    static void unpack_all(const Block& p) { codes4_unpack_all<C>(p, Base::scratch()); }

    // Super-block s (blocks 8 s .. 8 s + 7) of the 16 rows at p for G tokens: acc[16 g + r] += its share of row
    // r's dot with token g (SCRATCH: the values from scratch(), which unpack_all filled from p).
    template <int G, Prefetch PF, bool SCRATCH = false>
    static void superblock(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const*,
                           float* acc) {
        const UnpackedCodes4& un = Base::scratch();
        const __m256i ones = _mm256_set1_epi16(1);
        for (int h = 0; h < 2; h++) {
            __m256 f[G];
            for (int g = 0; g < G; g++) f[g] = _mm256_setzero_ps();
            for (int j = 0; j < 8; j++) {
                Base::template prefetch_part<PF>(&p, h, j);
                const block_q8_a* x[G];
                const int8_t* xq[G];
                for (int g = 0; g < G; g++) {
                    x[g] = (const block_q8_a*)(const void*)xs[g] + 8 * s + j;
                    xq[g] = x[g]->qs;
                }
                __m256i sj[G];
                for (int g = 0; g < G; g++) sj[g] = _mm256_setzero_si256();
                for (int i0 = 0; i0 < 8; i0 += C::CHAIN) {
                    __m256i s16[G];
                    codes4_chain<C, G, SCRATCH>(p, un, h, j, i0, xq, s16);
                    for (int g = 0; g < G; g++) sj[g] = _mm256_add_epi32(sj[g], _mm256_madd_epi16(s16[g], ones));
                }
                const __m256 dw = scales(p, h, j);
                for (int g = 0; g < G; g++)
                    f[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sj[g]), _mm256_mul_ps(dw, _mm256_set1_ps(x[g]->d)), f[g]);
            }
            for (int g = 0; g < G; g++) {
                float* a = acc + 16 * g + 8 * h;
                _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), f[g]));
            }
        }
    }
};
using TileIQ4NLR16 = TileNL4R16<BlocksIQ4NL>;
using TileMXFP4R16 = TileNL4R16<BlocksMXFP4>;

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

// ---- super-blocks of 256 for more tokens: kernel_lanes256.h's q6_K lane layout (gemm_kquant_tiles) ----
// A row is unpacked once per call and token group count (stored for the later groups, kernel_tiles.h),
// into the layout KindQ6KV uses: lane L of vectors 0..3 holds group L (16 weights, 4 per vector), of
// vectors 4..7 group 8 + L, so one vpmaddubsw chain per vector and token sums each group's products, and
// the groups' scales are applied once per super-block and token, in float. The weights are stored
// unsigned as q + 2^LANE_SHIFT (no offset where LANE_SHIFT < 0; q3_K's u = q + 4 as LowQ3K makes it),
// and each lane sum starts at -2^LANE_SHIFT x the token's sum over its group, so the sums are q x exactly.
// q2_K's mins come in through the same group sums, in float. iq4_xs's -127..113 fit no unsigned byte
// that keeps a vpmaddubsw pair below 2^15: its lanes hold magnitudes, with the signs in a second set of
// vectors that each token's activations take (vpsignb) before the product (LANE_SIGNS).

template <class Low, class = void>
struct LaneSigns : std::false_type {};
template <class Low>
struct LaneSigns<Low, std::void_t<decltype(Low::LANE_SIGNS)>> : std::bool_constant<Low::LANE_SIGNS> {};
template <class Low>
constexpr bool lane_signs() { return LaneSigns<Low>::value; }

struct alignas(32) XLowV {  // one q8_K super-block of one token, in lane order
    int8_t q[QK_K];         // q[32 (4h + c) + 4L + i] = x[16 (8h + L) + 4c + i]
    int32_t nbs[16];        // lanes of half h: -(sum of x over group 8h + L)
    float d[8];
};

template <class Dot, class Low>
struct KindLowV : GroupedRows8 {
    using Block = typename Low::Block;
    using X = XLowV;
    static constexpr int GROUP = 4, SLOTS = GROUP;  // tokens per tile, as KindQ6KV's
    static_assert(Low::LANE_QMAX > 0 && Low::LANE_QMAX <= 127, "no lane form for this type");
    static constexpr bool SIGNS = lane_signs<Low>();
    static void reorder(const block_q8_K* const* x, X* out) {
        const block_q8_K* b = x[0];
        int32_t src[64], dst[64];  // src dword 4s + c: x[16s + 4c .. + 3] of group s
        std::memcpy(src, b->qs, QK_K);
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 4; c++)
                for (int L = 0; L < 8; L++) dst[8 * (4 * h + c) + L] = src[4 * (8 * h + L) + c];
        std::memcpy(out->q, dst, QK_K);
        for (int g = 0; g < 16; g++) out->nbs[g] = -b->bsums[g];
        for (int L = 0; L < 8; L++) out->d[L] = b->d;
    }
    struct alignas(32) U {
        __m256i q[8];
        __m256i s[SIGNS ? 8 : 1];  // (LANE_SIGNS) the weights' signs, as q
        __m256 sd[2];  // lanes of half h: d * factor * scale of group 8h + L
        __m256 mn[2];  // (q2_K) dmin * min of group 8h + L
    };
    template <int V>
    static __m256i stored(const Block& w, const PreScales& p, __m256i* sign = nullptr) {
        __m256i mag, sgn = _mm256_setzero_si256(), sc;
        Low::template vec<V>(w, p, mag, sgn, sc);
        if constexpr (SIGNS) {
            sign[V] = sgn;
            return mag;
        }
        if constexpr (Low::SIGNED)
            return _mm256_add_epi8(_mm256_sign_epi8(mag, sgn), _mm256_set1_epi8((char)(1 << Low::LANE_SHIFT)));
        else
            return mag;
    }
    // Vectors 4h .. 4h + 3 in the file's order (vector V: groups 2V, 2V + 1 in its dwords 0-3, 4-7) to lane
    // order: out c, dword L = group 8h + L's dword c = file vector 4h + L / 2's dword 4 (L % 2) + c. Each
    // vector's dwords paired (c, 4 + c) into qword c, then a 4 x 4 qword transpose.
    static void half_to_lanes(__m256i a, __m256i b, __m256i c, __m256i d, __m256i* out) {
        const __m256i pair = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        a = _mm256_permutevar8x32_epi32(a, pair);
        b = _mm256_permutevar8x32_epi32(b, pair);
        c = _mm256_permutevar8x32_epi32(c, pair);
        d = _mm256_permutevar8x32_epi32(d, pair);
        const __m256i ab_lo = _mm256_unpacklo_epi64(a, b), ab_hi = _mm256_unpackhi_epi64(a, b);
        const __m256i cd_lo = _mm256_unpacklo_epi64(c, d), cd_hi = _mm256_unpackhi_epi64(c, d);
        out[0] = _mm256_permute2x128_si256(ab_lo, cd_lo, 0x20);
        out[1] = _mm256_permute2x128_si256(ab_hi, cd_hi, 0x20);
        out[2] = _mm256_permute2x128_si256(ab_lo, cd_lo, 0x31);
        out[3] = _mm256_permute2x128_si256(ab_hi, cd_hi, 0x31);
    }
    static void unpack(const Block* w, U* u) {
        PreScales p;
        Low::prepare(*w, p);
        __m256i sg[8];
        half_to_lanes(stored<0>(*w, p, sg), stored<1>(*w, p, sg), stored<2>(*w, p, sg), stored<3>(*w, p, sg), u->q);
        half_to_lanes(stored<4>(*w, p, sg), stored<5>(*w, p, sg), stored<6>(*w, p, sg), stored<7>(*w, p, sg), u->q + 4);
        if constexpr (SIGNS) {
            half_to_lanes(sg[0], sg[1], sg[2], sg[3], u->s);
            half_to_lanes(sg[4], sg[5], sg[6], sg[7], u->s + 4);
        }
        const __m256 d = _mm256_set1_ps(p.d);
        u->sd[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(p.sc))), d);
        u->sd[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(p.sc, 1))), d);
        if constexpr (Low::MINS) {
            const __m256i m = Low::mins16(*w);
            const __m256 dm = _mm256_set1_ps(_cvtsh_ss(w->dmin));
            u->mn[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(m))), dm);
            u->mn[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(m, 1))), dm);
        }
    }
    template <int RN, Rows R>
    static void tile(const uint8_t* row, U* u, const X* x, int64_t nb, Part* part, const KSpan& ks) {
        const int64_t xs = ks.stride;  // between one token's (entry's) activations and the next's
        constexpr int CHAIN = std::max(1, std::min(4, Dot::chain(Low::LANE_QMAX)));
        const Block* w = (const Block*)row;
        U local;
        __m256 acc[RN];
        for (int t = 0; t < RN; t++) acc[t] = ks.first ? _mm256_setzero_ps() : part[t * ROWS];
        for (int64_t b = 0; b < nb; b++, w++) {
            const U* ub = row_block<KindLowV, R>(w, u + b, &local);
            for (int h = 0; h < 2; h++) {
                __m256i v[RN];
                for (int t = 0; t < RN; t++) {
                    if constexpr (Low::LANE_SHIFT < 0)
                        v[t] = _mm256_setzero_si256();
                    else
                        v[t] = _mm256_slli_epi32(_mm256_load_si256((const __m256i*)(x[t * xs + b].nbs + 8 * h)),
                                                 Low::LANE_SHIFT);
                }
                for (int c0 = 0; c0 < 4; c0 += CHAIN) {
                    typename Dot::Sum s[RN];
                    for (int t = 0; t < RN; t++) s[t] = Dot::start(v[t]);
                    for (int c = c0; c < c0 + CHAIN && c < 4; c++) {
                        const __m256i q = _mm256_load_si256(&ub->q[4 * h + c]);
                        for (int t = 0; t < RN; t++) {
                            __m256i xv = _mm256_load_si256((const __m256i*)(x[t * xs + b].q + 32 * (4 * h + c)));
                            if constexpr (SIGNS) xv = _mm256_sign_epi8(xv, _mm256_load_si256(&ub->s[4 * h + c]));
                            s[t] = Dot::dot(s[t], q, xv);
                        }
                    }
                    for (int t = 0; t < RN; t++) v[t] = Dot::end(v[t], s[t]);
                }
                for (int t = 0; t < RN; t++) {
                    const __m256 dx = _mm256_load_ps(x[t * xs + b].d);
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v[t]), _mm256_mul_ps(ub->sd[h], dx), acc[t]);
                    if constexpr (Low::MINS)
                        acc[t] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i*)(x[t * xs + b].nbs + 8 * h))),
                            _mm256_mul_ps(ub->mn[h], dx), acc[t]);
                }
            }
        }
        for (int t = 0; t < RN; t++) part[t * ROWS] = acc[t];
    }
};

}  // namespace
}  // namespace clover
