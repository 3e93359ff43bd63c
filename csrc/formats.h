// ggml block formats, byte for byte as GGUF stores them (ggml-common.h), plus the
// activation formats our integer kernels use internally.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "iq_tables.h"

namespace clover {

constexpr int QK = 32;     // block of the legacy formats (Q4_0, Q8_0)
constexpr int QK_K = 256;  // super-block of the k-quants

// GGML type ids, as written in GGUF tensor infos.
enum class Type : int32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    IQ1_M = 29,
    BF16 = 30,
    MXFP4 = 39,
    // Not a GGUF type: q4_K rows repacked at load in groups of 16 (block_q4_K_r16), for kernels that keep
    // one weight row per vector lane. Never read from or written to a file (type_table leaves it out).
    Q4_K_R16 = 1012,
    // Not GGUF types either: q2_K, q3_K, q5_K, q6_K, iq4_xs, iq3_xxs and iq3_s rows repacked at load in groups of 16
    // (block_q2_K_r16, block_q3_K_r16, block_q5_K_r16, block_q6_K_r16, block_iq4_xs_r16, block_iq3_xxs_r16,
    // block_iq3_s_r16).
    Q2_K_R16 = 1010,
    Q3_K_R16 = 1011,
    Q5_K_R16 = 1013,
    Q6_K_R16 = 1014,
    IQ3_XXS_R16 = 1018,
    IQ3_S_R16 = 1021,
    IQ4_XS_R16 = 1023,
    // iq4_nl and mxfp4 rows repacked at load in groups of 16, 256 weights (8 file blocks) per group block
    // (block_iq4_nl_r16, block_mxfp4_r16).
    IQ4_NL_R16 = 1020,
    MXFP4_R16 = 1039,
};

// x = d * (q - 8), q in 0..15; low nibbles are weights 0..15, high nibbles 16..31.
struct block_q4_0 {
    uint16_t d;  // fp16
    uint8_t qs[QK / 2];
};
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 is 18 bytes");

// x = d * q + m, q in 0..15; nibbles as block_q4_0.
struct block_q4_1 {
    uint16_t d;  // fp16
    uint16_t m;  // fp16
    uint8_t qs[QK / 2];
};
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 is 20 bytes");

// x = d * (q - 16), q in 0..31: nibbles as block_q4_0, bit j of qh the fifth bit of weight j.
struct block_q5_0 {
    uint16_t d;  // fp16
    uint8_t qh[4];
    uint8_t qs[QK / 2];
};
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 is 22 bytes");

// x = d * q + m, q in 0..31; bits as block_q5_0.
struct block_q5_1 {
    uint16_t d;  // fp16
    uint16_t m;  // fp16
    uint8_t qh[4];
    uint8_t qs[QK / 2];
};
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 is 24 bytes");

// x = d * kvalues_iq4nl[q], q a nibble laid out as block_q4_0's.
struct block_iq4_nl {
    uint16_t d;  // fp16
    uint8_t qs[QK / 2];
};
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl is 18 bytes");

// x = 2^(e - 128) * kvalues_mxfp4[q] (e2m1 values doubled, so the scale is half the E8M0 power); nibbles as
// block_q4_0's.
struct block_mxfp4 {
    uint8_t e;  // E8M0 exponent
    uint8_t qs[QK / 2];
};
static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 is 17 bytes");

// x = d * q, q in -127..127.
struct block_q8_0 {
    uint16_t d;  // fp16
    int8_t qs[QK];
};
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 is 34 bytes");

// x = d * sc_j * q - dmin * m_j over 8 sub-blocks of 32; sc_j, m_j are 6-bit, packed in scales[12].
// qs: 4 chunks of 32 bytes; chunk c holds sub-block 2c in low nibbles, 2c+1 in high nibbles.
struct block_q4_K {
    uint16_t d;     // fp16, scale of the sub-block scales
    uint16_t dmin;  // fp16, scale of the sub-block mins
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q4_K) == 144, "block_q4_K is 144 bytes");

// 16 rows of one q4_K super-block, repacked (repack_q4_K_r16): the same values, rows in the lanes of a
// 16-lane vector. scales and mins decoded to bytes; qs[c][t][r] holds row r's bytes 4t..4t+3 of chunk c
// (sub-block 2c in low nibbles, 2c+1 in high). A row's share is 148 bytes (144 in the file).
struct block_q4_K_r16 {
    uint16_t d[16];     // fp16, per row
    uint16_t dmin[16];  // fp16, per row
    uint8_t sc[8][16];  // [sub-block][row]
    uint8_t mn[4][16][2];  // [chunk][row][sub-block 2c, 2c+1]: int16 pairs after widening
    uint8_t qs[4][8][16][4];
};
static_assert(sizeof(block_q4_K_r16) == 2368, "block_q4_K_r16 is 2368 bytes");
constexpr int R16 = 16;  // rows per group of the repacked layout

// 16 rows of one q3_K super-block, repacked (repack_q3_K_r16): the same values, rows in the lanes of a
// 16-lane vector, so one 32-byte load holds 4 weights of 8 rows, each unpacked by shifts and masks alone
// (no per-row scale shuffles). Weight 32 v + l of a row (v = 4 n + j, l = 4 t + i) has its low 2 bits at
// bits 2j of ql[n][t][row][i] and its high bit at bit v of qh[t][row][i] (block_q3_K's qs and hmask, word
// t of each 32-byte run per row). sc[v][row] are the scales of groups 2v, 2v + 1 decoded (-32..31). A
// row's share is 114 bytes (110 in the file).
struct block_q3_K_r16 {
    uint16_t d[16];          // fp16, per row
    int8_t sc[8][16][2];     // [vector v][row][group 2v, 2v + 1]
    uint8_t ql[2][8][16][4]; // [half n][word t][row][byte i]
    uint8_t qh[8][16][4];    // [word t][row][byte i]
};
static_assert(sizeof(block_q3_K_r16) == 16 * 114, "block_q3_K_r16 is 1824 bytes");

// 16 rows of one q2_K super-block, repacked (repack_q2_K_r16): the 2-bit codes as block_q3_K_r16's ql (weight
// 32 v + l of a row, v = 4 n + j, l = 4 t + i, at bits 2j of qs[n][t][row][i]: block_q2_K's qs, word t of each
// 32-byte run per row), sc[g][row] the file's byte of group g (scale in the low nibble, min in the high
// one). The same 84 bytes per row as the file.
struct block_q2_K_r16 {
    uint16_t d[16];           // fp16, per row
    uint16_t dmin[16];        // fp16, per row
    uint8_t sc[16][16];       // [group g][row]
    uint8_t qs[2][8][16][4];  // [half n][word t][row][byte i]
};
static_assert(sizeof(block_q2_K_r16) == 16 * 84, "block_q2_K_r16 is 1344 bytes");

// 16 rows of one q6_K super-block, repacked (repack_q6_K_r16), as block_q3_K_r16: weight 32 v + l of a row
// (v = 4 n + k, l = 4 t + i) has its low 4 bits in the nibble k / 2 of ql[2 n + k % 2][t][row][i] and its
// high 2 bits at bits 2k of qh[n][t][row][i] (block_q6_K's ql and qh, word t of each 32-byte run per
// row); sc[v][row] the scales of groups 2v, 2v + 1. The same 210 bytes per row as the file.
struct block_q6_K_r16 {
    uint16_t d[16];           // fp16, per row
    int8_t sc[8][16][2];      // [vector v][row][group 2v, 2v + 1]
    uint8_t ql[4][8][16][4];  // [32-byte run c][word t][row][byte i]
    uint8_t qh[2][8][16][4];  // [half n][word t][row][byte i]
};
static_assert(sizeof(block_q6_K_r16) == 16 * 210, "block_q6_K_r16 is 3360 bytes");

// 16 rows of one iq4_xs super-block, repacked (repack_iq4_xs_r16): qs[j][t][row] holds the row's bytes
// 16 j + 4 t .. + 3 (group j's weights 32 j + 4 t .. + 3 in the low nibbles, 32 j + 16 + 4 t .. in the high),
// sc[j][row] group j's scale decoded (ls - 32). A row's share is 138 bytes (136 in the file).
struct block_iq4_xs_r16 {
    uint16_t d[16];           // fp16, per row
    int8_t sc[8][16];         // [group j][row]
    uint8_t qs[8][4][16][4];  // [group j][word t][row][byte i]
};
static_assert(sizeof(block_iq4_xs_r16) == 16 * 138, "block_iq4_xs_r16 is 2208 bytes");

// 16 rows of one iq3_xxs super-block, transcoded (repack_iq3_xxs_r16) into block_iq4_xs_r16's layout: every
// weight a 4-bit code (bits 0-2: which of the 8 magnitudes iq3xxs_grid's bytes take, 4, 12, ..., 52, 62;
// bit 3: its sign; kvalues_iq3xxs_r16 the 16 signed values), sc[j][row] group j's scale 2 s + 1, d the file's
// (weight = d / 4 * sc * value). A row's share is 138 bytes against the file's 98: 1.4x the bytes, for one
// table lookup per 32 weights where the file's layout takes 8 grid loads and 4 sign loads. Lossless: a
// row's file block is rebuilt byte for byte (r16_row; the grid's 256 entries are distinct, and each group
// of 8 signs is stored as 7 bits and the parity).
struct block_iq3_xxs_r16 {
    uint16_t d[16];           // fp16, per row
    int8_t sc[8][16];         // [group j][row]: 2 s + 1
    uint8_t qs[8][4][16][4];  // [group j][word t][row][byte i]: codes as block_iq4_xs_r16's nibbles
};
static_assert(sizeof(block_iq3_xxs_r16) == 16 * 138, "block_iq3_xxs_r16 is 2208 bytes");

// 16 rows of one iq3_s super-block, transcoded as iq3_xxs (block_iq3_xxs_r16's layout): bits 0-2 of a code
// which of iq3s_grid's 8 magnitudes 1, 3, ..., 15 (2 i + 1), bit 3 the weight's sign bit (kvalues_iq3s_r16),
// sc[j][row] group j's scale 2 s + 1, d the file's (weight = d * sc * value). 138 bytes per row against 110.
struct block_iq3_s_r16 {
    uint16_t d[16];           // fp16, per row
    int8_t sc[8][16];         // [group j][row]: 2 s + 1
    uint8_t qs[8][4][16][4];  // [group j][word t][row][byte i]: codes as block_iq4_xs_r16's nibbles
};
static_assert(sizeof(block_iq3_s_r16) == 16 * 138, "block_iq3_s_r16 is 2208 bytes");

// 8 consecutive iq4_nl / mxfp4 blocks of a row (256 weights): what the repacked layouts below hold of one row.
struct block_iq4_nl_x8 {
    block_iq4_nl b[8];
};
static_assert(sizeof(block_iq4_nl_x8) == 144, "block_iq4_nl_x8 is 144 bytes");
struct block_mxfp4_x8 {
    block_mxfp4 b[8];
};
static_assert(sizeof(block_mxfp4_x8) == 136, "block_mxfp4_x8 is 136 bytes");

// 16 rows of 8 iq4_nl blocks (256 weights), repacked (repack_iq4_nl_r16): qs as block_iq4_xs_r16's (qs[j][t][row]
// the bytes 4 t .. + 3 of the row's block j: weights 32 j + 4 t .. + 3 in the low nibbles, + 16 in the high),
// d[j][row] block j's fp16 scale. The file's 144 bytes per row and 256 weights, as they are.
struct block_iq4_nl_r16 {
    uint16_t d[8][16];        // [block j][row], fp16
    uint8_t qs[8][4][16][4];  // [block j][word t][row][byte i]
};
static_assert(sizeof(block_iq4_nl_r16) == 16 * 144, "block_iq4_nl_r16 is 2304 bytes");

// 16 rows of 8 mxfp4 blocks, repacked as iq4_nl (repack_mxfp4_r16): e[j][row] block j's E8M0 exponent. 136
// bytes per row and 256 weights, as the file.
struct block_mxfp4_r16 {
    uint8_t e[8][16];         // [block j][row]
    uint8_t qs[8][4][16][4];  // [block j][word t][row][byte i]
};
static_assert(sizeof(block_mxfp4_r16) == 16 * 136, "block_mxfp4_r16 is 2176 bytes");

// As q4_K with a fifth bit per weight in qh (bit 2c / 2c+1 for chunk c, low / high nibble).
struct block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q5_K) == 176, "block_q5_K is 176 bytes");

// 16 rows of one q5_K super-block, repacked (repack_q5_K_r16): block_q4_K_r16's fields (scales and mins
// decoded, qs[c][t][row] the row's bytes 32 c + 4 t .. + 3) and the fifth bits, qh[t][row] the row's qh
// bytes 4 t .. 4 t + 3 (bit 2c: chunk c's low nibble, 2c + 1 its high one). A row's share is 180 bytes (176
// in the file).
struct block_q5_K_r16 {
    uint16_t d[16];         // fp16, per row
    uint16_t dmin[16];      // fp16, per row
    uint8_t sc[8][16];      // [sub-block][row]
    uint8_t mn[4][16][2];   // [chunk][row][sub-block 2c, 2c+1]
    uint8_t qs[4][8][16][4];
    uint8_t qh[8][16][4];   // [word t][row][byte i]
};
static_assert(sizeof(block_q5_K_r16) == 16 * 180, "block_q5_K_r16 is 2880 bytes");

// x = d * sc_j * (q - 32) over 16 sub-blocks of 16; q is 6 bits: 4 in ql, 2 in qh.
struct block_q6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;  // fp16
};
static_assert(sizeof(block_q6_K) == 210, "block_q6_K is 210 bytes");

// x = d * (sc_g & 15) * q - dmin * (sc_g >> 4) over 16 groups of 16; q is 2 bits: weight 128 c + 32 s + l
// is bits 2s of qs[32 c + l].
struct block_q2_K {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d;     // fp16
    uint16_t dmin;  // fp16
};
static_assert(sizeof(block_q2_K) == 84, "block_q2_K is 84 bytes");

// x = d * (s_g - 32) * q over 16 groups of 16, s_g 6 bits packed in scales[12]; q = (2 bits of qs as
// q2_K's) - 4 unless bit b of hmask[l] is set, for weight 32 b + l.
struct block_q3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;  // fp16
};
static_assert(sizeof(block_q3_K) == 110, "block_q3_K is 110 bytes");

// x = d * (ls_j - 32) * kvalues_iq4nl[q] over 8 groups of 32; ls_j: 4 bits in scales_l, 2 in scales_h;
// group j's 16 bytes of qs: weights 0..15 in low nibbles, 16..31 in high.
struct block_iq4_xs {
    uint16_t d;  // fp16
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs is 136 bytes");

// x = d * (0.5 + s_j) / 4 * grid value * sign over 8 groups of 32: per group two words, the first the 4
// iq2xxs_grid indices (8 weights each), the second 4 x 7 sign bits (ksigns_iq2xs) and the scale s_j in its
// top 4 bits.
struct block_iq2_xxs {
    uint16_t d;  // fp16
    uint16_t qs[QK_K / 8];
};
static_assert(sizeof(block_iq2_xxs) == 66, "block_iq2_xxs is 66 bytes");

// x = d * (0.5 + s_g) / 4 * grid value * sign over 16 groups of 16: qs[i] = 9-bit iq2xs_grid index | 7
// sign bits << 9; s_g nibbles of scales.
struct block_iq2_xs {
    uint16_t d;  // fp16
    uint16_t qs[QK_K / 8];
    uint8_t scales[QK_K / 32];
};
static_assert(sizeof(block_iq2_xs) == 74, "block_iq2_xs is 74 bytes");

// As iq2_xs with 10-bit iq2s_grid indices (8 bits in qs[0..31], 2 in qh) and 8 plain sign bits per entry
// (qs[32..63]).
struct block_iq2_s {
    uint16_t d;  // fp16
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t scales[QK_K / 32];
};
static_assert(sizeof(block_iq2_s) == 82, "block_iq2_s is 82 bytes");

// x = d * (0.5 + s_j) / 2 * grid value * sign over 8 groups of 32: qs[0..63] iq3xxs_grid indices (4 weights
// each), then per group a word of 4 x 7 sign bits and the scale s_j in its top 4 bits.
struct block_iq3_xxs {
    uint16_t d;  // fp16
    uint8_t qs[3 * QK_K / 8];
};
static_assert(sizeof(block_iq3_xxs) == 98, "block_iq3_xxs is 98 bytes");

// x = d * (1 + 2 s_j) * grid value * sign over 8 groups of 32: 9-bit iq3s_grid indices (qs, and bit i % 8
// of qh[i / 8]), one plain sign bit per weight, s_j nibbles of scales.
struct block_iq3_s {
    uint16_t d;  // fp16
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t signs[QK_K / 8];
    uint8_t scales[QK_K / 64];
};
static_assert(sizeof(block_iq3_s) == 110, "block_iq3_s is 110 bytes");

// x = d * (2 s_j + 1) * (grid value + delta_j) over 8 groups of 32: per 8 weights an 11-bit iq1s_grid index
// (values -1, 0, 1), 8 bits in qs, 3 in qh[j] (bits 3 l .. 3 l + 2 for the l-th 8); qh[j]'s bits 12-14 are
// s_j, bit 15 the sign of delta_j = +-1/8 (IQ1S_DELTA).
struct block_iq1_s {
    uint16_t d;  // fp16
    uint8_t qs[QK_K / 8];
    uint16_t qh[QK_K / 32];
};
static_assert(sizeof(block_iq1_s) == 50, "block_iq1_s is 50 bytes");

// As iq1_s with a scale per group of 16 and a delta sign per 8 weights: 8 weights i take qs[i] and the 4 bits
// of qh[i / 2] at 4 (i % 2) (3 index bits, then the sign of delta); scales, read as 4 little-endian words,
// hold 3-bit s_g at bits 3 (g % 4) of word g / 4, and in the words' top nibbles the fp16 d (word 0's the
// lowest: iq1m_d).
struct block_iq1_m {
    uint8_t qs[QK_K / 8];
    uint8_t qh[QK_K / 16];
    uint8_t scales[QK_K / 32];
};
static_assert(sizeof(block_iq1_m) == 56, "block_iq1_m is 56 bytes");

// ggml_e8m0_to_fp32_half: 2^(e - 128), the E8M0 scale halved (subnormal below e = 2).
inline float e8m0_to_fp32_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// The 16 signed 6-bit scales of a q3_K super-block (gguf.quants' unpacking of its 12 bytes).
inline void decode_scales_q3_K(const uint8_t* s12, int8_t sc[16]) {
    for (int k = 0; k < 16; k++) {
        const int lo = (s12[k % 8] >> (4 * (k / 8))) & 0xf;
        const int hi = (s12[8 + k % 4] >> (2 * (k / 4))) & 3;
        sc[k] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

// The 8 signed scales of an iq4_xs super-block.
inline void decode_scales_iq4_xs(const block_iq4_xs& b, int8_t ls[8]) {
    for (int j = 0; j < 8; j++)
        ls[j] = (int8_t)((((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xf) | (((b.scales_h >> (2 * j)) & 3) << 4)) - 32);
}

// Activations for Q4_0 / Q8_0 weights: x ~= d * q, q in -127..127, fp32 scale (not stored in files).
struct block_q8_a {
    float d;
    int8_t qs[QK];
};
static_assert(sizeof(block_q8_a) == 36, "block_q8_a is 36 bytes");

// Activations for k-quant weights (ggml's block_q8_K): bsums[i] = sum of qs[16i .. 16i+15].
struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
};
static_assert(sizeof(block_q8_K) == 292, "block_q8_K is 292 bytes");

struct TypeInfo {
    Type type;
    const char* name;
    int block_size;   // weights per block
    int block_bytes;  // bytes per block
};

// nullptr for a type id we do not support.
const TypeInfo* type_info(int32_t type_id);
const TypeInfo* type_info_by_name(const char* name);

inline size_t row_bytes(const TypeInfo& ti, int64_t k) { return (size_t)(k / ti.block_size) * ti.block_bytes; }

// The activation format a weight type multiplies against.
enum class ActFormat { F32, Q8_A, Q8_K };
ActFormat act_format(Type t);
size_t act_row_bytes(Type t, int64_t k);

// ---- half and bfloat16 conversion (IEEE round-to-nearest-even, as numpy and F16C do) ----

inline float f32_from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint32_t bits_from_f32(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline float fp16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    const uint32_t man = h & 0x3ff;
    if (exp == 0) {
        // zero or subnormal: man * 2^-24
        const float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13));
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t f32_to_fp16(float f) {
    const uint32_t x = bits_from_f32(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // inf or nan (nan stays quiet nan)
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
    }
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // rounds to >= 65520: inf
    if (ax < 0x38800000u) {
        // result is subnormal or zero: round ax / 2^-24 to nearest even
        if (ax < 0x33000000u) return sign;  // < 2^-25: rounds to zero
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffff) | 0x800000;
        const uint32_t shift = 126 - e;  // 2^-24 unit: value = m * 2^(e-150)
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    // normal: rebias and round the 13 dropped bits to nearest even
    uint32_t r = ax - 0x38000000u;
    r += 0xfff + ((r >> 13) & 1);
    return (uint16_t)(sign | (r >> 13));
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

// ggml_compute_fp32_to_bf16: quiet NaNs, round to nearest even.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u = bits_from_f32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)(((uint64_t)u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

// The 6-bit scale and min of sub-block j of a q4_K / q5_K super-block.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// A q4_K super-block's 8 scales and 8 mins, decoded from its 12-byte header.
inline void decode_scales_q4_K(const uint8_t* scales12, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 8; j++) scale_min_k4(j, scales12, &sc[j], &m[j]);
}

// Row r of a repacked q4_K or q5_K super-block (the fields block_q5_K_r16 shares with block_q4_K_r16): qs in
// block_q4_K's order, scales and mins decoded.
template <class P>
inline void r16_row(const P& p, int r, uint8_t qs[QK_K / 2], uint8_t sc[8], uint8_t m[8]) {
    for (int c = 0; c < 4; c++)
        for (int t = 0; t < 8; t++) std::memcpy(qs + 32 * c + 4 * t, p.qs[c][t][r], 4);
    for (int j = 0; j < 8; j++) {
        sc[j] = p.sc[j][r];
        m[j] = p.mn[j / 2][r][j & 1];
    }
}

// Row r of a repacked q2_K super-block as the file holds it (block_q2_K, byte for byte), and its inverse.
inline void r16_row(const block_q2_K_r16& p, int r, block_q2_K& b) {
    b.d = p.d[r];
    b.dmin = p.dmin[r];
    for (int g = 0; g < 16; g++) b.scales[g] = p.sc[g][r];
    for (int n = 0; n < 2; n++)
        for (int t = 0; t < 8; t++) std::memcpy(b.qs + 32 * n + 4 * t, p.qs[n][t][r], 4);
}
inline void r16_put(const block_q2_K& b, int r, block_q2_K_r16& p) {
    p.d[r] = b.d;
    p.dmin[r] = b.dmin;
    for (int g = 0; g < 16; g++) p.sc[g][r] = b.scales[g];
    for (int n = 0; n < 2; n++)
        for (int t = 0; t < 8; t++) std::memcpy(p.qs[n][t][r], b.qs + 32 * n + 4 * t, 4);
}

// Row r of a repacked q3_K super-block as the file holds it (block_q3_K, byte for byte: the scales
// encoded back into decode_scales_q3_K's 12 bytes).
inline void r16_row(const block_q3_K_r16& p, int r, block_q3_K& b) {
    b.d = p.d[r];
    for (int t = 0; t < 8; t++) {
        for (int n = 0; n < 2; n++) std::memcpy(b.qs + 32 * n + 4 * t, p.ql[n][t][r], 4);
        std::memcpy(b.hmask + 4 * t, p.qh[t][r], 4);
    }
    std::memset(b.scales, 0, 12);
    for (int k = 0; k < 16; k++) {
        const int u = p.sc[k / 2][r][k % 2] + 32;
        b.scales[k % 8] |= (uint8_t)((u & 0xf) << (4 * (k / 8)));
        b.scales[8 + k % 4] |= (uint8_t)((u >> 4) << (2 * (k / 4)));
    }
}
// Row r's file block into a repacked q3_K super-block (r16_row's inverse; the scales decoded).
inline void r16_put(const block_q3_K& b, int r, block_q3_K_r16& p) {
    p.d[r] = b.d;
    int8_t sc[16];
    decode_scales_q3_K(b.scales, sc);
    for (int j = 0; j < 16; j++) p.sc[j / 2][r][j % 2] = sc[j];
    for (int t = 0; t < 8; t++) {
        for (int n = 0; n < 2; n++) std::memcpy(p.ql[n][t][r], b.qs + 32 * n + 4 * t, 4);
        std::memcpy(p.qh[t][r], b.hmask + 4 * t, 4);
    }
}

// A q4_K / q5_K super-block's 12-byte header from its 8 scales and 8 mins (6 bits each): scale_min_k4's
// inverse, every bit of the 12 bytes used, so a header decoded and encoded again is the same bytes.
inline void encode_scales_q4_K(const uint8_t sc[8], const uint8_t m[8], uint8_t scales12[12]) {
    for (int j = 0; j < 4; j++) {
        scales12[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        scales12[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        scales12[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4));
    }
}

// Row r's q4_K / q5_K file block into the fields block_q4_K_r16 and block_q5_K_r16 share: d, dmin, the
// scales and mins decoded, qs.
template <class P, class B>
inline void r16_put_q4_K_fields(const B& b, int r, P& p) {
    p.d[r] = b.d;
    p.dmin[r] = b.dmin;
    uint8_t sc[8], m[8];
    decode_scales_q4_K(b.scales, sc, m);
    for (int j = 0; j < 8; j++) {
        p.sc[j][r] = sc[j];
        p.mn[j / 2][r][j & 1] = m[j];
    }
    for (int c = 0; c < 4; c++)
        for (int t = 0; t < 8; t++) std::memcpy(p.qs[c][t][r], b.qs + 32 * c + 4 * t, 4);
}
inline void r16_put(const block_q4_K& b, int r, block_q4_K_r16& p) { r16_put_q4_K_fields(b, r, p); }

// Row r of a repacked q5_K super-block as the file holds it (block_q5_K, byte for byte).
inline void r16_row(const block_q5_K_r16& p, int r, block_q5_K& b) {
    b.d = p.d[r];
    b.dmin = p.dmin[r];
    uint8_t sc[8], m[8];
    r16_row(p, r, b.qs, sc, m);
    encode_scales_q4_K(sc, m, b.scales);
    for (int t = 0; t < 8; t++) std::memcpy(b.qh + 4 * t, p.qh[t][r], 4);
}
// Row r's file block into a repacked q5_K super-block (r16_row's inverse).
inline void r16_put(const block_q5_K& b, int r, block_q5_K_r16& p) {
    r16_put_q4_K_fields(b, r, p);
    for (int t = 0; t < 8; t++) std::memcpy(p.qh[t][r], b.qh + 4 * t, 4);
}

// Row r of a repacked iq4_xs super-block as the file holds it (block_iq4_xs, byte for byte).
inline void r16_row(const block_iq4_xs_r16& p, int r, block_iq4_xs& b) {
    b.d = p.d[r];
    b.scales_h = 0;
    std::memset(b.scales_l, 0, sizeof b.scales_l);
    for (int j = 0; j < 8; j++) {
        const int ls = p.sc[j][r] + 32;
        b.scales_l[j / 2] |= (uint8_t)((ls & 0xf) << (4 * (j % 2)));
        b.scales_h |= (uint16_t)((ls >> 4) << (2 * j));
        for (int t = 0; t < 4; t++) std::memcpy(b.qs + 16 * j + 4 * t, p.qs[j][t][r], 4);
    }
}
// Row r's file block into a repacked iq4_xs super-block (r16_row's inverse; the scales decoded).
inline void r16_put(const block_iq4_xs& b, int r, block_iq4_xs_r16& p) {
    p.d[r] = b.d;
    int8_t ls[8];
    decode_scales_iq4_xs(b, ls);
    for (int j = 0; j < 8; j++) {
        p.sc[j][r] = ls[j];
        for (int t = 0; t < 4; t++) std::memcpy(p.qs[j][t][r], b.qs + 16 * j + 4 * t, 4);
    }
}

// Row r's 8 iq4_nl / mxfp4 blocks into / out of their repacked group (byte for byte both ways): each block's
// scale field (Block::*scale: d or e) to and from the group's scales of block j (Packed::*scales), its 16 bytes of
// nibbles to and from qs[j][t][r] (4 per word t).
template <class X8, class Packed, class S, class Block>
inline void r16_put_blocks32(const X8& b, int r, Packed& p, S (Packed::*scales)[8][16], S Block::*scale) {
    for (int j = 0; j < 8; j++) {
        (p.*scales)[j][r] = b.b[j].*scale;
        for (int t = 0; t < 4; t++) std::memcpy(p.qs[j][t][r], b.b[j].qs + 4 * t, 4);
    }
}
template <class X8, class Packed, class S, class Block>
inline void r16_row_blocks32(const Packed& p, int r, X8& b, S (Packed::*scales)[8][16], S Block::*scale) {
    for (int j = 0; j < 8; j++) {
        b.b[j].*scale = (p.*scales)[j][r];
        for (int t = 0; t < 4; t++) std::memcpy(b.b[j].qs + 4 * t, p.qs[j][t][r], 4);
    }
}
inline void r16_put(const block_iq4_nl_x8& b, int r, block_iq4_nl_r16& p) {
    r16_put_blocks32(b, r, p, &block_iq4_nl_r16::d, &block_iq4_nl::d);
}
inline void r16_row(const block_iq4_nl_r16& p, int r, block_iq4_nl_x8& b) {
    r16_row_blocks32(p, r, b, &block_iq4_nl_r16::d, &block_iq4_nl::d);
}
inline void r16_put(const block_mxfp4_x8& b, int r, block_mxfp4_r16& p) {
    r16_put_blocks32(b, r, p, &block_mxfp4_r16::e, &block_mxfp4::e);
}
inline void r16_row(const block_mxfp4_r16& p, int r, block_mxfp4_x8& b) {
    r16_row_blocks32(p, r, b, &block_mxfp4_r16::e, &block_mxfp4::e);
}

// The signed value of each 4-bit code of block_iq3_xxs_r16.
alignas(16) static const int8_t kvalues_iq3xxs_r16[16] = {4, 12, 20, 28, 36, 44, 52, 62, -4, -12, -20, -28, -36, -44, -52, -62};

// The signed value of each 4-bit code of block_iq3_s_r16.
alignas(16) static const int8_t kvalues_iq3s_r16[16] = {1, 3, 5, 7, 9, 11, 13, 15, -1, -3, -5, -7, -9, -11, -13, -15};

// 32 codes of group j (weights 32 j ..) into / out of block_iq4_xs_r16's nibble layout in lane r.
template <typename Packed>
inline void r16_put_codes(const uint8_t code[32], int j, int r, Packed& p) {
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++) p.qs[j][t][r][i] = (uint8_t)(code[4 * t + i] | (code[16 + 4 * t + i] << 4));
}
template <typename Packed>
inline void r16_codes(const Packed& p, int j, int r, uint8_t code[32]) {
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++) {
            code[4 * t + i] = p.qs[j][t][r][i] & 0xf;
            code[16 + 4 * t + i] = p.qs[j][t][r][i] >> 4;
        }
}

// iq3_xxs magnitudes as 3-bit indices: iq3xxs_grid's bytes are 4, 12, ..., 52 (8 i + 4) and 62.
inline int iq3xxs_mag_index(int v) { return v == 62 ? 7 : (v - 4) / 8; }
// The grid entry of 4 magnitude indices (bits 3 i .. 3 i + 2 for byte i): the inverse of iq3xxs_grid.
inline const std::array<uint8_t, 4096>& iq3xxs_grid_index() {
    static const std::array<uint8_t, 4096> t = [] {
        std::array<uint8_t, 4096> out{};
        for (int e = 0; e < 256; e++) {
            int key = 0;
            for (int i = 0; i < 4; i++) key |= iq3xxs_mag_index((int)((iq3xxs_grid[e] >> (8 * i)) & 0xff)) << (3 * i);
            out[(size_t)key] = (uint8_t)e;
        }
        return out;
    }();
    return t;
}

// Row r's iq3_xxs block into a transcoded super-block: weight 32 j + 4 t + i's code in the low nibble of
// qs[j][t][r][i], weight 32 j + 16 + 4 t + i's in the high one (as block_iq4_xs_r16).
inline void r16_put(const block_iq3_xxs& b, int r, block_iq3_xxs_r16& p) {
    p.d[r] = b.d;
    for (int j = 0; j < 8; j++) {
        uint32_t aux;
        std::memcpy(&aux, b.qs + 64 + 4 * j, 4);
        uint8_t code[32];
        for (int l = 0; l < 4; l++) {
            const int signs = ksigns_iq2xs[(aux >> (7 * l)) & 127];
            for (int e = 0; e < 2; e++) {
                const uint32_t g = iq3xxs_grid[b.qs[8 * j + 2 * l + e]];
                for (int i = 0; i < 4; i++) {
                    const int w = 4 * e + i;
                    code[8 * l + w] = (uint8_t)(iq3xxs_mag_index((int)((g >> (8 * i)) & 0xff)) | (((signs >> w) & 1) << 3));
                }
            }
        }
        r16_put_codes(code, j, r, p);
        p.sc[j][r] = (int8_t)(2 * (aux >> 28) + 1);
    }
}
// Row r of a transcoded iq3_xxs super-block as the file holds it (block_iq3_xxs, byte for byte).
inline void r16_row(const block_iq3_xxs_r16& p, int r, block_iq3_xxs& b) {
    b.d = p.d[r];
    const auto& index = iq3xxs_grid_index();
    for (int j = 0; j < 8; j++) {
        uint8_t code[32];
        r16_codes(p, j, r, code);
        uint32_t aux = (uint32_t)((p.sc[j][r] - 1) / 2) << 28;
        for (int l = 0; l < 4; l++) {
            int signs = 0;
            for (int e = 0; e < 2; e++) {
                int key = 0;
                for (int i = 0; i < 4; i++) {
                    const int c = code[8 * l + 4 * e + i];
                    key |= (c & 7) << (3 * i);
                    signs |= (c >> 3) << (4 * e + i);
                }
                b.qs[8 * j + 2 * l + e] = index[(size_t)key];
            }
            aux |= (uint32_t)(signs & 127) << (7 * l);  // (bit 7 is the parity of the 7: ksigns_iq2xs)
        }
        std::memcpy(b.qs + 64 + 4 * j, &aux, 4);
    }
}

// The 9-bit iq3s_grid entry of 4 magnitude indices (bits 3 i .. 3 i + 2 for byte i; magnitude 2 m + 1).
inline const std::array<uint16_t, 4096>& iq3s_grid_index() {
    static const std::array<uint16_t, 4096> t = [] {
        std::array<uint16_t, 4096> out{};
        for (int e = 0; e < 512; e++) {
            int key = 0;
            for (int i = 0; i < 4; i++) key |= (int)(((iq3s_grid[e] >> (8 * i)) & 0xff) >> 1) << (3 * i);
            out[(size_t)key] = (uint16_t)e;
        }
        return out;
    }();
    return t;
}

// Row r's iq3_s block into a transcoded super-block (the codes as block_iq3_xxs_r16's).
inline void r16_put(const block_iq3_s& b, int r, block_iq3_s_r16& p) {
    p.d[r] = b.d;
    for (int j = 0; j < 8; j++) {
        uint8_t code[32];
        for (int w = 0; w < 32; w++) {
            const int i = 8 * j + w / 4;  // the weight's 4-group
            const uint32_t g = iq3s_grid[b.qs[i] | (((b.qh[i / 8] >> (i % 8)) & 1) << 8)];
            const int k = 32 * j + w;
            code[w] = (uint8_t)((((g >> (8 * (w % 4))) & 0xff) >> 1) | (((b.signs[k / 8] >> (k % 8)) & 1) << 3));
        }
        r16_put_codes(code, j, r, p);
        p.sc[j][r] = (int8_t)(2 * ((b.scales[j / 2] >> (4 * (j % 2))) & 0xf) + 1);
    }
}
// Row r of a transcoded iq3_s super-block as the file holds it (block_iq3_s, byte for byte).
inline void r16_row(const block_iq3_s_r16& p, int r, block_iq3_s& b) {
    b.d = p.d[r];
    std::memset(b.qh, 0, sizeof b.qh);
    std::memset(b.signs, 0, sizeof b.signs);
    std::memset(b.scales, 0, sizeof b.scales);
    const auto& index = iq3s_grid_index();
    for (int j = 0; j < 8; j++) {
        uint8_t code[32];
        r16_codes(p, j, r, code);
        for (int e = 0; e < 8; e++) {
            const int i = 8 * j + e;
            int key = 0;
            for (int w = 0; w < 4; w++) key |= (code[4 * e + w] & 7) << (3 * w);
            const int idx = index[(size_t)key];
            b.qs[i] = (uint8_t)(idx & 0xff);
            b.qh[i / 8] |= (uint8_t)((idx >> 8) << (i % 8));
        }
        for (int w = 0; w < 32; w++) {
            const int k = 32 * j + w;
            b.signs[k / 8] |= (uint8_t)((code[w] >> 3) << (k % 8));
        }
        b.scales[j / 2] |= (uint8_t)(((p.sc[j][r] - 1) / 2) << (4 * (j % 2)));
    }
}

// Row r of a repacked q6_K super-block as the file holds it (block_q6_K, byte for byte).
inline void r16_row(const block_q6_K_r16& p, int r, block_q6_K& b) {
    b.d = p.d[r];
    for (int j = 0; j < 16; j++) b.scales[j] = p.sc[j / 2][r][j % 2];
    for (int t = 0; t < 8; t++) {
        for (int c = 0; c < 4; c++) std::memcpy(b.ql + 32 * c + 4 * t, p.ql[c][t][r], 4);
        for (int n = 0; n < 2; n++) std::memcpy(b.qh + 32 * n + 4 * t, p.qh[n][t][r], 4);
    }
}
// Row r's file block into a repacked q6_K super-block (r16_row's inverse).
inline void r16_put(const block_q6_K& b, int r, block_q6_K_r16& p) {
    p.d[r] = b.d;
    for (int j = 0; j < 16; j++) p.sc[j / 2][r][j % 2] = b.scales[j];
    for (int t = 0; t < 8; t++) {
        for (int c = 0; c < 4; c++) std::memcpy(p.ql[c][t][r], b.ql + 32 * c + 4 * t, 4);
        for (int n = 0; n < 2; n++) std::memcpy(p.qh[n][t][r], b.qh + 32 * n + 4 * t, 4);
    }
}

}  // namespace clover
