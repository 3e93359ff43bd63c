// The low-bit and legacy block formats as integers (scalar): each block's weights as int8 with their sign,
// the integer scale of each group of 16 weights, and the float factors, such that
//     weight = d * factor * scale[g] * q  (- dmin * min[g] for q2_K; + m for q4_1 / q5_1).
// The reference dequantizers (quants_lowbit.cpp) and the reference kernels (kernels_ref.cpp) both read
// blocks through these; the SIMD kernels unpack the same integers their own way and are checked against
// them. Layouts: formats.h; tables: iq_tables.h.
#pragma once

#include "formats.h"
#include "iq_tables.h"

namespace clover {

// A super-block of 256 weights: q[k] for weight k, scale[g] for weights 16 g .. 16 g + 15 (groups of 32
// repeat their scale), min[g] (q2_K only).
struct SuperInts {
    int8_t q[QK_K];
    int16_t scale[QK_K / 16];
    uint8_t min[QK_K / 16];
};

inline int grid_byte(uint64_t word, int j) { return (int)((word >> (8 * j)) & 0xff); }

// q2_K: q in 0..3, scale = sc & 15, min = sc >> 4; weight = d * scale * q - dmin * min.
inline void unpack_q2_K(const block_q2_K& b, SuperInts& s) {
    for (int c = 0; c < 2; c++)
        for (int sh = 0; sh < 4; sh++)
            for (int l = 0; l < 32; l++) s.q[128 * c + 32 * sh + l] = (int8_t)((b.qs[32 * c + l] >> (2 * sh)) & 3);
    for (int g = 0; g < 16; g++) {
        s.scale[g] = b.scales[g] & 0xf;
        s.min[g] = b.scales[g] >> 4;
    }
}

// q3_K: q in -4..3, scale the signed 6-bit one; weight = d * scale * q.
inline void unpack_q3_K(const block_q3_K& b, SuperInts& s) {
    for (int c = 0; c < 2; c++)
        for (int sh = 0; sh < 4; sh++)
            for (int l = 0; l < 32; l++) {
                const int k = 128 * c + 32 * sh + l;
                const int lo = (b.qs[32 * c + l] >> (2 * sh)) & 3;
                const int hbit = (b.hmask[l] >> (k / 32)) & 1;
                s.q[k] = (int8_t)(lo - (hbit ? 0 : 4));
            }
    int8_t sc[16];
    decode_scales_q3_K(b.scales, sc);
    for (int g = 0; g < 16; g++) s.scale[g] = sc[g];
}

// iq4_xs: q = kvalues_iq4nl[nibble], scale = ls - 32 per group of 32; weight = d * scale * q.
inline void unpack_iq4_xs(const block_iq4_xs& b, SuperInts& s) {
    int8_t ls[8];
    decode_scales_iq4_xs(b, ls);
    for (int j = 0; j < 8; j++) {
        for (int l = 0; l < 16; l++) {
            s.q[32 * j + l] = kvalues_iq4nl[b.qs[16 * j + l] & 0xf];
            s.q[32 * j + 16 + l] = kvalues_iq4nl[b.qs[16 * j + l] >> 4];
        }
        s.scale[2 * j] = s.scale[2 * j + 1] = ls[j];
    }
}

// Eight grid magnitudes with their signs (bit j of `signs` set: weight j negative).
inline void put8(int8_t* q, uint64_t grid, int signs) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(((signs >> j) & 1) ? -grid_byte(grid, j) : grid_byte(grid, j));
}

// iq2_xxs: scale = 2 s + 1 (weight = d * scale * q / 8).
inline void unpack_iq2_xxs(const block_iq2_xxs& b, SuperInts& s) {
    for (int ib = 0; ib < 8; ib++) {
        uint32_t aux0, aux1;
        std::memcpy(&aux0, b.qs + 4 * ib, 4);
        std::memcpy(&aux1, b.qs + 4 * ib + 2, 4);
        for (int l = 0; l < 4; l++)
            put8(s.q + 32 * ib + 8 * l, iq2xxs_grid[(aux0 >> (8 * l)) & 0xff], ksigns_iq2xs[(aux1 >> (7 * l)) & 127]);
        s.scale[2 * ib] = s.scale[2 * ib + 1] = (int16_t)(2 * (aux1 >> 28) + 1);
    }
}

// iq2_xs: scale = 2 s + 1 per group of 16 (weight = d * scale * q / 8).
inline void unpack_iq2_xs(const block_iq2_xs& b, SuperInts& s) {
    for (int i = 0; i < 32; i++) put8(s.q + 8 * i, iq2xs_grid[b.qs[i] & 511], ksigns_iq2xs[b.qs[i] >> 9]);
    for (int g = 0; g < 16; g++) s.scale[g] = (int16_t)(2 * ((b.scales[g / 2] >> (4 * (g % 2))) & 0xf) + 1);
}

// iq2_s: 10-bit indices, plain sign bytes; scale = 2 s + 1 per group of 16 (weight = d * scale * q / 8).
inline void unpack_iq2_s(const block_iq2_s& b, SuperInts& s) {
    for (int i = 0; i < 32; i++) {
        const int idx = b.qs[i] | (((b.qh[i / 4] >> (2 * (i % 4))) & 3) << 8);
        put8(s.q + 8 * i, iq2s_grid[idx], b.qs[32 + i]);
    }
    for (int g = 0; g < 16; g++) s.scale[g] = (int16_t)(2 * ((b.scales[g / 2] >> (4 * (g % 2))) & 0xf) + 1);
}

// Four grid magnitudes with signs.
inline void put4(int8_t* q, uint32_t grid, int signs) {
    for (int j = 0; j < 4; j++) {
        const int v = (int)((grid >> (8 * j)) & 0xff);
        q[j] = (int8_t)(((signs >> j) & 1) ? -v : v);
    }
}

// iq3_xxs: scale = 2 s + 1 per group of 32 (weight = d * scale * q / 4).
inline void unpack_iq3_xxs(const block_iq3_xxs& b, SuperInts& s) {
    for (int ib = 0; ib < 8; ib++) {
        uint32_t aux;
        std::memcpy(&aux, b.qs + 64 + 4 * ib, 4);
        for (int l = 0; l < 4; l++) {
            const int signs = ksigns_iq2xs[(aux >> (7 * l)) & 127];
            put4(s.q + 32 * ib + 8 * l, iq3xxs_grid[b.qs[8 * ib + 2 * l]], signs);
            put4(s.q + 32 * ib + 8 * l + 4, iq3xxs_grid[b.qs[8 * ib + 2 * l + 1]], signs >> 4);
        }
        s.scale[2 * ib] = s.scale[2 * ib + 1] = (int16_t)(2 * (aux >> 28) + 1);
    }
}

// iq3_s: 9-bit indices, plain sign bits; scale = 2 s + 1 per group of 32 (weight = d * scale * q).
inline void unpack_iq3_s(const block_iq3_s& b, SuperInts& s) {
    for (int i = 0; i < 64; i++) {
        const int idx = b.qs[i] | (((b.qh[i / 8] >> (i % 8)) & 1) << 8);
        put4(s.q + 4 * i, iq3s_grid[idx], b.signs[i / 2] >> (4 * (i % 2)));
    }
    for (int j = 0; j < 8; j++) s.scale[2 * j] = s.scale[2 * j + 1] = (int16_t)(2 * ((b.scales[j / 2] >> (4 * (j % 2))) & 0xf) + 1);
}

// iq1_s / iq1_m: q = 8 (grid value + delta) = 8 g +- 1 (g in -1, 0, 1; delta +-1/8), scale = 2 s + 1 (weight =
// d * scale * q / 8). The 8 weights of one grid entry, delta's sign given (+1 or -1).
inline void put8_iq1(int8_t* q, uint64_t grid, int delta) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(8 * (int8_t)grid_byte(grid, j) + delta);
}

inline void unpack_iq1_s(const block_iq1_s& b, SuperInts& s) {
    for (int ib = 0; ib < 8; ib++) {
        const int h = b.qh[ib];
        const int delta = (h & 0x8000) ? -1 : 1;
        for (int l = 0; l < 4; l++)
            put8_iq1(s.q + 32 * ib + 8 * l, iq1s_grid[b.qs[4 * ib + l] | (((h >> (3 * l)) & 7) << 8)], delta);
        s.scale[2 * ib] = s.scale[2 * ib + 1] = (int16_t)(2 * ((h >> 12) & 7) + 1);
    }
}

// iq1_m's scales as the 4 words they are read as (and as one little-endian 64-bit word)
inline void iq1m_words(const block_iq1_m& b, uint16_t w[4]) { std::memcpy(w, b.scales, 8); }
inline uint64_t iq1m_words64(const block_iq1_m& b) {
    uint64_t w;
    std::memcpy(&w, b.scales, 8);
    return w;
}

// iq1_m's fp16 d, from the top nibbles of its 4 scale words
inline uint16_t iq1m_d(const block_iq1_m& b) {
    uint16_t w[4];
    iq1m_words(b, w);
    return (uint16_t)((w[0] >> 12) | ((w[1] >> 8) & 0x00f0) | ((w[2] >> 4) & 0x0f00) | (w[3] & 0xf000));
}

// Store fp16 d in iq1_m's scale words (the inverse of iq1m_d; the 3-bit scales below stay), for tests and benches
// that make blocks of random bytes.
inline void iq1m_set_d(block_iq1_m& b, uint16_t d) {
    uint16_t w[4];
    iq1m_words(b, w);
    for (int k = 0; k < 4; k++) w[k] = (uint16_t)((w[k] & 0x0fff) | (((d >> (4 * k)) & 0xf) << 12));
    std::memcpy(b.scales, w, 8);
}

inline void unpack_iq1_m(const block_iq1_m& b, SuperInts& s) {
    for (int i = 0; i < 32; i++) {
        const int h = (b.qh[i / 2] >> (4 * (i % 2))) & 0xf;
        put8_iq1(s.q + 8 * i, iq1s_grid[b.qs[i] | ((h & 7) << 8)], (h & 8) ? -1 : 1);
    }
    uint16_t w[4];
    iq1m_words(b, w);
    for (int g = 0; g < 16; g++) s.scale[g] = (int16_t)(2 * ((w[g / 4] >> (3 * (g % 4))) & 7) + 1);
}

// A super-block's fp16 d (iq1_m keeps it in its scales)
template <typename Block>
inline uint16_t block_d(const Block& b) {
    return b.d;
}
inline uint16_t block_d(const block_iq1_m& b) { return iq1m_d(b); }

// The 32 weights of a legacy block as integers: q4_1 / q5_1 unsigned (weight = d q + m), q5_0 as q - 16,
// iq4_nl and mxfp4 their table values (weight = d q).
inline void nibbles32(const uint8_t* qs, int q[32]) {
    for (int l = 0; l < 16; l++) {
        q[l] = qs[l] & 0xf;
        q[l + 16] = qs[l] >> 4;
    }
}
inline void fifth_bits(const uint8_t qh[4], int q[32]) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    for (int j = 0; j < 32; j++) q[j] |= ((h >> j) & 1) << 4;
}
inline void unpack32(const block_q4_1& b, int q[32]) { nibbles32(b.qs, q); }
inline void unpack32(const block_q5_1& b, int q[32]) {
    nibbles32(b.qs, q);
    fifth_bits(b.qh, q);
}
inline void unpack32(const block_q5_0& b, int q[32]) {
    nibbles32(b.qs, q);
    fifth_bits(b.qh, q);
    for (int j = 0; j < 32; j++) q[j] -= 16;
}
inline void unpack32(const block_iq4_nl& b, int q[32]) {
    nibbles32(b.qs, q);
    for (int j = 0; j < 32; j++) q[j] = kvalues_iq4nl[q[j]];
}
inline void unpack32(const block_mxfp4& b, int q[32]) {
    nibbles32(b.qs, q);
    for (int j = 0; j < 32; j++) q[j] = kvalues_mxfp4[q[j]];
}

}  // namespace clover
