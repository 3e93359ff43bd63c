// AVX2 (256-bit) products of the low-bit super-block formats (lowbit.h) on the file's layout, against
// block_q8_K: the per-format unpackers (Low*), the register tiles (TileLow256) and the lane tiles (KindLowV,
// templated on the dot product: vpmaddubsw chains, or 256-bit vpdpbusd where the including file has VNNI).
// Included by the ISA files that multiply them (kernels_avx2.cpp through kernel_lowbit_avx2.h, kernels_avx512.cpp),
// each compiling its own copy with its own flags (everything here is in an anonymous namespace).
// - one 32-weight vector at a time as magnitudes (u8) and signs, vpmaddubsw with the signed activations, vpmaddwd
//   with the groups' int16 scales (two groups of 16 per vector), int32 sums per super-block, then one float
//   multiply-add by d * factor * x.d per super-block (q2_K's mins through the q8_K group sums).
// Register tiles of RM rows x RN tokens reuse each unpacked vector for RN tokens.
#pragma once

#include <immintrin.h>

#include <array>
#include <type_traits>
#include <utility>

#include "kernel_lanes256.h"
#include "kernel_tiles.h"
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

// iq1_s / iq1_m: q = 8 g + delta (lowbit.h), taken unsigned as u = q + 16 (7 .. 25; OFFSET: 16 x each group's
// activation sum comes off once per super-block): vpsignb puts 8 g (g = -1, 0, 1 from iq1s_grid), a byte add
// delta + 16 (15 or 17).
inline __m256i iq1_values(__m256i grid, __m256i delta16) {
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), grid), delta16);
}

struct LowIQ1S {
    using Block = block_iq1_s;
    static constexpr bool SIGNED = false, MINS = false, OFFSET = true;
    static constexpr int LANE_SHIFT = 4, LANE_QMAX = 25;  // (KindLowV and OFFSET: stored as u = q + 16)
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
        mag = iq1_values(grid, _mm256_set1_epi8((h & 0x8000) ? 15 : 17));
        sc = scale_pair<v>(p);
    }
};

struct LowIQ1M {
    using Block = block_iq1_m;
    static constexpr bool SIGNED = false, MINS = false, OFFSET = true;
    static constexpr int LANE_SHIFT = 4, LANE_QMAX = 25;  // (KindLowV and OFFSET: stored as u = q + 16)
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
        // -1 (0xffff) where set, so 17 + twice that: delta + 16 per byte
        const __m256i bit = _mm256_setr_epi64x(0x0008000800080008LL, 0x0080008000800080LL, 0x0800080008000800LL,
                                               (long long)0x8000800080008000ULL);
        const __m256i neg = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)h), bit), bit);
        mag = iq1_values(grid, _mm256_add_epi8(_mm256_add_epi8(neg, neg), _mm256_set1_epi8(17)));
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
                            isum[r][t] = _mm256_sub_epi32(isum[r][t],
                                                          _mm256_slli_epi32(_mm256_madd_epi16(pre[r].sc, bs), U::LANE_SHIFT));
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
