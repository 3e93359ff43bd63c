// AMX prompt products (Intel Xeon Sapphire Rapids and later: AMX-TILE + AMX-BF16, with AVX-512 BF16).
//
// The int8 products elsewhere multiply the weights' integer codes with int8 activations and apply the
// per-32 (or per-16) sub-block scales between dot products; AMX's int8 tile product sums 64 codes at a time,
// and taking its 16 x 16 result out to apply a scale every 32 weights would cost more than the product.
// So here the weights are dequantized (scales applied) into bf16 panels of 16 rows, the activations are
// rounded to bf16, and the tile unit sums 16 x 16 x 32 products in fp32 per instruction (tdpbf16ps: one
// per ~5 ns on a 2-vCPU Xeon VM from registers, ~9 ns with its tiles loaded from L2, against 64 products
// per vpdpbusd), where the dequantization is spread over enough tokens (amx_min_tokens). bf16 keeps 8 bits
// of mantissa: each dequantized weight rounds to within 2^-9 of its value, each activation too, which is
// finer than the other paths' int8 activations (tests/test_amx.py checks both against float64).
// Only the layouts with a decoder here (amx_min_tokens): the other types keep their int8 products.
//
// Layouts: C = tokens x weight rows (fp32, stored straight into Y); A = 16 tokens x 32 bf16, from the
// activations in the tiles' layout (amx_to_bf16: 1 KB per tile and chunk, contiguous, so a tile load does
// not touch 16 pages); B = the weights' panel in AMX's pair layout: for each 32-weight chunk c, 16 tile rows
// (weight pairs p) of 16 weight rows x 2 bf16 (weights 2p and 2p + 1), 1 KB per chunk.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "iq_tables.h"
#include "kernels.h"

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace clover {

namespace {

// One chunk of a panel (16 pair rows of 16 rows x 2 bf16). (A type of this file's own: a std::vector of
// uint16_t here would define vector's members as weak symbols compiled for AMX, which the linker may pick
// for every file: tests/test_isa_objects.py.)
struct alignas(64) PanelChunk {
    uint16_t v[512];
};

struct TileConfig {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// Tiles 0-3: C (token tile i, row panel j at 2 i + j); 4-5: A (token tiles); 6-7: B (row panels).
void load_config() {
    TileConfig c;
    std::memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

// 32 floats (two zmm) of one row -> 16 dwords: bf16 pairs (weights 2p, 2p + 1) in dword p.
inline __m512i pairs_bf16(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

// r[0..15] (row r's 16 dwords) -> r[p] holds dword p of every row (a 16 x 16 dword transpose).
inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // r[4 q + w] now holds, in 128-bit lane L, dword column 4 L + w of rows 4 q .. 4 q + 3: transpose the
    // 128-bit lanes of r[w], r[4 + w], r[8 + w], r[12 + w]
    for (int i = 0; i < 8; i++) {
        const int a = (i / 4) * 8 + (i % 4), b = a + 4;
        t[a] = _mm512_shuffle_i32x4(r[a], r[b], 0x88);
        t[b] = _mm512_shuffle_i32x4(r[a], r[b], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        const int a = i, b = i + 8;
        r[a] = _mm512_shuffle_i32x4(t[a], t[b], 0x88);
        r[b] = _mm512_shuffle_i32x4(t[a], t[b], 0xdd);
    }
}

// A chunk's 16 pair rows from 16 weight rows' pair dwords (rows[r]: row r's 16 pairs), in place.
inline void store_rows_chunk(__m512i rows[16], int32_t* out) {
    transpose16(rows);
    for (int p = 0; p < 16; p++) _mm512_storeu_si512(out + 16 * p, rows[p]);
}

// Lanes = rows: v(k) for weights k = 0..31 of a chunk, 16 rows per vector -> the chunk's 16 pair rows.
template <class V>
inline void store_lanes_chunk(int32_t* out, V&& v) {
    // (bf16 of weight 2p in rows 0..15 at words 0..15, of weight 2p + 1 at 16..31 -> row r's pair at dword r)
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
#pragma GCC unroll 16
    for (int p = 0; p < 16; p++)
        _mm512_storeu_si512(out + 16 * p, _mm512_permutexvar_epi16(idx, pairs_bf16(v(2 * p), v(2 * p + 1))));
}

inline __m512 fp16x16(const uint16_t* h) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)h)); }
inline __m512 i8x16(const int8_t* b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)b))); }
inline __m512 u8x16(const uint8_t* b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)b))); }
// table[bits [shift, shift + 4) of each dword of q] (vpermps reads the low 4 bits of its indices alone).
inline __m512 nib(__m512i q, int shift, __m512 table) {
    return _mm512_permutexvar_ps(shift ? _mm512_srli_epi32(q, shift) : q, table);
}

// One group of 16 rows of a repacked (r16) matrix as a panel, per super-block of 256 weights.
void panel_iq4_xs_r16(const uint8_t* G, int64_t K, int32_t* out) {
    const __m512 table = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)kvalues_iq4nl)));
    for (int64_t b = 0; b < K / 256; b++) {
        const block_iq4_xs_r16& x = ((const block_iq4_xs_r16*)G)[b];
        const __m512 d = fp16x16(x.d);
        for (int j = 0; j < 8; j++, out += 256) {
            const __m512 s = _mm512_mul_ps(d, i8x16(x.sc[j]));
            __m512i q[4];
            for (int t = 0; t < 4; t++) q[t] = _mm512_loadu_si512(x.qs[j][t]);
            // weight k: byte k % 16 (word k / 4 % 4, byte k % 4), low nibble below 16, high from 16
            store_lanes_chunk(out, [&](int k) {
                return _mm512_mul_ps(s, nib(q[k / 4 % 4], 8 * (k % 4) + 4 * (k / 16), table));
            });
        }
    }
}

void panel_q4_K_r16(const uint8_t* G, int64_t K, int32_t* out) {
    const __m512 codes = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int64_t b = 0; b < K / 256; b++) {
        const block_q4_K_r16& x = ((const block_q4_K_r16*)G)[b];
        const __m512 d = fp16x16(x.d), dmin = fp16x16(x.dmin);
        for (int j = 0; j < 8; j++, out += 256) {
            const int c = j / 2, h = j % 2;
            const __m512 s = _mm512_mul_ps(d, u8x16(x.sc[j]));
            const __m512i mn = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)x.mn[c]));
            const __m512 m = _mm512_mul_ps(
                dmin, _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(mn, 8 * h), _mm512_set1_epi32(255))));
            __m512i q[8];
            for (int t = 0; t < 8; t++) q[t] = _mm512_loadu_si512(x.qs[c][t]);
            // weight k of sub-block 2 c + h: word k / 4, byte k % 4, nibble h
            store_lanes_chunk(out, [&](int k) { return _mm512_fmsub_ps(s, nib(q[k / 4], 8 * (k % 4) + 4 * h, codes), m); });
        }
    }
}

void panel_q6_K_r16(const uint8_t* G, int64_t K, int32_t* out) {
    for (int64_t b = 0; b < K / 256; b++) {
        const block_q6_K_r16& x = ((const block_q6_K_r16*)G)[b];
        const __m512 d = fp16x16(x.d);
        for (int v = 0; v < 8; v++, out += 256) {
            const int n = v / 4, kk = v % 4;
            const __m512i sc = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i*)x.sc[v]));
            // groups 2 v (the low byte of each row's pair) and 2 v + 1 (the high byte), signed
            const __m512 s0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(sc, 24), 24)));
            const __m512 s1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32(sc, 8)));
            __m512i ql[8], qh[8];
            for (int t = 0; t < 8; t++) {
                ql[t] = _mm512_loadu_si512(x.ql[2 * n + kk % 2][t]);
                qh[t] = _mm512_loadu_si512(x.qh[n][t]);
            }
            // weight l = 4 t + i: low 4 bits at nibble kk / 2 of ql byte i, high 2 at bits 2 kk of qh byte i
            store_lanes_chunk(out, [&](int l) {
                const int t = l / 4, i = l % 4;
                const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(ql[t], 8 * i + 4 * (kk / 2)), _mm512_set1_epi32(15));
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(qh[t], 8 * i + 2 * kk), _mm512_set1_epi32(3));
                const __m512i q = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
                return _mm512_mul_ps(l < 16 ? s0 : s1, _mm512_cvtepi32_ps(q));
            });
        }
    }
}

// 16 rows of a layout whose rows are blocks of 256 weights (n of them real, the rest zero): decode(x, pairs)
// writes one row's super-block x as its 8 chunks' pair dwords, and each chunk's 16 rows are then transposed
// into the panel.
template <class Block, class Decode>
void panel_rows(const uint8_t* W, size_t row_bytes, int64_t n, int64_t K, int32_t* out, Decode decode) {
    for (int64_t b = 0; b < K / 256; b++) {
        __m512i rows[8][16];
        for (int r = 0; r < 16; r++) {
            __m512i pairs[8];
            if (r < n) {
                decode(((const Block*)(W + (size_t)r * row_bytes))[b], pairs);
            } else {
                for (int j = 0; j < 8; j++) pairs[j] = _mm512_setzero_si512();
            }
            for (int j = 0; j < 8; j++) rows[j][r] = pairs[j];
        }
        for (int j = 0; j < 8; j++, out += 256) store_rows_chunk(rows[j], out);
    }
}

// q5_K in the file's layout: weight l of sub-block j = 2 c + h is nibble h of qs[32 c + l] plus 16 x bit j
// of qh[l]; d * scale * q - dmin * min.
void panel_q5_K(const uint8_t* W, size_t row_bytes, int64_t n, int64_t K, int32_t* out) {
    panel_rows<block_q5_K>(W, row_bytes, n, K, out, [](const block_q5_K& x, __m512i* pairs) {
        const float d = fp16_to_f32(x.d), dmin = fp16_to_f32(x.dmin);
        const __m256i qh = _mm256_loadu_si256((const __m256i*)x.qh);
        for (int c = 0; c < 4; c++) {
            const __m256i qs = _mm256_loadu_si256((const __m256i*)(x.qs + 32 * c));
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h;
                uint8_t sc, m;
                scale_min_k4(j, x.scales, &sc, &m);
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(qs, 4 * h), _mm256_set1_epi8(15));
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
                const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
                const __m512 s = _mm512_set1_ps(d * sc), mm = _mm512_set1_ps(dmin * m);
                const __m512 w0 =
                    _mm512_fmsub_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q))), mm);
                const __m512 w1 =
                    _mm512_fmsub_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1))), mm);
                pairs[j] = pairs_bf16(w0, w1);
            }
        }
    });
}

// q6_K in the file's layout. Half h (weights 128 h ..) of a super-block: chunk 4 h + u holds weights 32 u + l
// (l < 32) of the half, low 4 bits from ql[64 h + l + 32 (u % 2)] (its high nibble for u >= 2), high 2 bits
// at bits 2 u of qh[32 h + l]; scales[8 h + 2 u + l / 16] (ggml's order); d * scale * (q - 32).
void panel_q6_K(const uint8_t* W, size_t row_bytes, int64_t n, int64_t K, int32_t* out) {
    panel_rows<block_q6_K>(W, row_bytes, n, K, out, [](const block_q6_K& x, __m512i* pairs) {
        const float d = fp16_to_f32(x.d);
        for (int h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(x.qh + 32 * h));
            for (int u = 0; u < 4; u++) {
                const __m256i ql = _mm256_loadu_si256((const __m256i*)(x.ql + 64 * h + 32 * (u % 2)));
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (u / 2)), _mm256_set1_epi8(15));
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * u), _mm256_set1_epi8(3));
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
                const int8_t* sc = x.scales + 8 * h + 2 * u;
                const __m512 w0 = _mm512_mul_ps(_mm512_set1_ps(d * sc[0]),
                                                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))));
                const __m512 w1 = _mm512_mul_ps(_mm512_set1_ps(d * sc[1]),
                                                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))));
                pairs[4 * h + u] = pairs_bf16(w0, w1);
            }
        }
    });
}

// 16 rows of q8_0 in the file's layout: one chunk per block of 32, its 16 rows transposed into the panel.
void panel_q8_0(const uint8_t* W, size_t row_bytes, int64_t n, int64_t K, int32_t* out) {
    for (int64_t c = 0; c < K / 32; c++, out += 256) {
        __m512i rows[16];
        for (int r = 0; r < 16; r++) {
            if (r >= n) {
                rows[r] = _mm512_setzero_si512();
                continue;
            }
            const block_q8_0& x = ((const block_q8_0*)(W + (size_t)r * row_bytes))[c];
            const __m512 d = _mm512_set1_ps(fp16_to_f32(x.d));
            rows[r] = pairs_bf16(_mm512_mul_ps(d, i8x16(x.qs)), _mm512_mul_ps(d, i8x16(x.qs + 16)));
        }
        store_rows_chunk(rows, out);
    }
}

// Rows [r0, r0 + 16) of W (a layout amx_min_tokens takes) as a bf16 panel: K / 32 chunks of 1 KB, rows past
// `rows` zero.
void make_panel(Type t, const uint8_t* W, size_t row_bytes, int64_t rows, int64_t K, int64_t r0, uint16_t* panel) {
    const uint8_t* src = W + (size_t)r0 * row_bytes;  // (a repacked group: 16 row shares from row r0)
    int32_t* out = (int32_t*)panel;
    const int64_t n = std::min<int64_t>(16, rows - r0);
    switch (t) {
        case Type::IQ4_XS_R16:
            return panel_iq4_xs_r16(src, K, out);
        case Type::Q4_K_R16:
            return panel_q4_K_r16(src, K, out);
        case Type::Q6_K_R16:
            return panel_q6_K_r16(src, K, out);
        case Type::Q5_K:
            return panel_q5_K(src, row_bytes, n, K, out);
        case Type::Q6_K:
            return panel_q6_K(src, row_bytes, n, K, out);
        case Type::Q8_0:
            return panel_q8_0(src, row_bytes, n, K, out);
        default:
            break;
    }
}

// From how many tokens the tiles beat the AVX-512 table's int8 products on weights of layout t; 0 where
// they are not used. Two threads, 2048 x 2048 (ns per super-block row and token, AVX-512 -> AMX): the
// repacked layouts, decoded with their rows in the vector lanes, 24 tokens 0.86 -> 0.89-0.98, 32 tokens
// 0.76-0.86 -> 0.68-0.69, 48 0.75-0.81 -> 0.60-0.61; the file layouts (each row decoded, then transposed)
// 48 tokens q5_K 0.75 -> 0.87, q6_K 0.95 -> 0.89, and from 64 faster (q5_K one thread 1.84 -> 1.59).
// The other types would take the scalar dequantizers, slower than their int8 products at any length.
int amx_min_tokens(Type t) {
    switch (t) {
        case Type::IQ4_XS_R16:
        case Type::Q4_K_R16:
        case Type::Q6_K_R16:
            return 32;
        case Type::Q5_K:
        case Type::Q6_K:
        case Type::Q8_0:
            return 64;
        default:
            return 0;
    }
}

// C tiles for NT token tiles x NB row panels over K / 32 chunks, stored to Y (full tiles) or through tmp.
template <int NT, int NB>
void tile_block(const uint16_t* A, int64_t K, const uint16_t* P0, const uint16_t* P1, int64_t nk, float* Y,
                int64_t ldy, int valid_tokens, int valid_rows) {
    _tile_zero(0);
    if (NB == 2) _tile_zero(1);
    if (NT == 2) _tile_zero(2);
    if (NT == 2 && NB == 2) _tile_zero(3);
    const uint16_t* A1 = A + 16 * K;  // the next token tile
    for (int64_t c = 0; c < nk; c++) {
        _tile_loadd(4, A + c * 512, 64);
        if (NT == 2) _tile_loadd(5, A1 + c * 512, 64);
        _tile_loadd(6, P0 + c * 512, 64);
        if (NB == 2) _tile_loadd(7, P1 + c * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (NB == 2) _tile_dpbf16ps(1, 4, 7);
        if (NT == 2) _tile_dpbf16ps(2, 5, 6);
        if (NT == 2 && NB == 2) _tile_dpbf16ps(3, 5, 7);
    }
    alignas(64) float tmp[16 * 16];
    auto store = [&](int i, int j, auto tile_store) {
        const int vt = std::min(16, valid_tokens - 16 * i), vr = std::min(16, valid_rows - 16 * j);
        if (vt <= 0 || vr <= 0) return;
        float* dst = Y + (int64_t)16 * i * ldy + 16 * j;
        if (vt == 16 && vr == 16) {
            tile_store(dst, (size_t)ldy * 4);
        } else {
            tile_store(tmp, (size_t)64);
            for (int m = 0; m < vt; m++) std::memcpy(dst + m * ldy, tmp + m * 16, vr * sizeof(float));
        }
    };
    store(0, 0, [](float* p, size_t s) { _tile_stored(0, p, s); });
    if (NB == 2) store(0, 1, [](float* p, size_t s) { _tile_stored(1, p, s); });
    if (NT == 2) store(1, 0, [](float* p, size_t s) { _tile_stored(2, p, s); });
    if (NT == 2 && NB == 2) store(1, 1, [](float* p, size_t s) { _tile_stored(3, p, s); });
}

}  // namespace

// X (M x K) -> rows m0 .. m0 + M - 1 of Xb in the tiles' layout (AmxOps::to_bf16), round to nearest even.
void amx_to_bf16(const float* X, int64_t M, int64_t K, uint16_t* Xb, int64_t m0) {
    for (int64_t m = m0; m < m0 + M; m++) {
        const float* x = X + (m - m0) * K;
        uint16_t* y = Xb + (m / 16) * 16 * K + (m % 16) * 32;
        for (int64_t c = 0; c < K / 32; c++)
            _mm512_storeu_si512(y + c * 512, pairs_bf16(_mm512_loadu_ps(x + 32 * c), _mm512_loadu_ps(x + 32 * c + 16)));
    }
}

void amx_gemm(Type t, const uint8_t* W, size_t row_bytes, int64_t rows, int64_t K, const uint16_t* Xb, int64_t M,
              float* Y, int64_t ldy, int64_t n0, int64_t n1) {
    // Blocks that stay in L2 (2 MB per core on Sapphire Rapids): the panels of RB rows (256 KB) and the
    // activations of TB tokens (1 MB at K = 2048). Each row block's panels are made once and meet every
    // token block; each token block is read from L2 once per 32 rows. (Two threads, 8192 x 2048 q4_K at 512
    // tokens: 0.54 ns per super-block row and token with 32-row blocks and all tokens at once, 0.39-0.44
    // with blocks from 64 to 512 rows and 128 to 512 tokens, all within the noise of each other.)
    constexpr int64_t TB = 256, PANEL_BYTES = 256 << 10;
    const int64_t panel = (size_t)16 * K;  // bf16 per 16-row panel
    const int64_t RB = std::max<int64_t>(32, PANEL_BYTES / (panel * 2) / 2 * 32);
    thread_local std::vector<PanelChunk> chunks;
    chunks.resize((size_t)(RB / 16) * (K / 32));
    uint16_t* const panels = chunks.data()->v;
    const int64_t nk = K / 32;
    load_config();
    for (int64_t rb = n0; rb < n1; rb += RB) {
        const int64_t rb1 = std::min(n1, rb + RB);
        for (int64_t r = rb; r < rb1; r += 16) make_panel(t, W, row_bytes, rows, K, r, &panels[(r - rb) / 16 * panel]);
        for (int64_t mb = 0; mb < M; mb += TB) {
            const int64_t mb1 = std::min(M, mb + TB);
            for (int64_t r = rb; r < rb1; r += 32) {
                const int vr = (int)std::min<int64_t>(32, rb1 - r);
                const uint16_t* P0 = &panels[(r - rb) / 16 * panel];
                const uint16_t* P1 = P0 + panel;
                for (int64_t m = mb; m < mb1; m += 32) {
                    const int vt = (int)std::min<int64_t>(32, mb1 - m);
                    const uint16_t* A = Xb + m * K;  // (token tile m / 16: 16 K bf16)
                    float* y = Y + m * ldy + r;
                    if (vt > 16 && vr > 16) {
                        tile_block<2, 2>(A, K, P0, P1, nk, y, ldy, vt, vr);
                    } else if (vt > 16) {
                        tile_block<2, 1>(A, K, P0, P1, nk, y, ldy, vt, vr);
                    } else if (vr > 16) {
                        tile_block<1, 2>(A, K, P0, P1, nk, y, ldy, vt, vr);
                    } else {
                        tile_block<1, 1>(A, K, P0, P1, nk, y, ldy, vt, vr);
                    }
                }
            }
        }
    }
    _tile_release();
}

namespace {
const AmxOps AMX_OPS = {amx_min_tokens, amx_to_bf16, amx_gemm};
}

bool cpu_has_amx() {
    static const bool ok = [] {
        unsigned a, b, c, d;
        __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
        if (a < 7) return false;
        __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
        const bool tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
        __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
        const bool avx512bf16 = (a >> 5) & 1;
        if (!tile || !bf16 || !avx512bf16) return false;
        // The OS saves the tile configuration and data (XCR0 bits 17, 18); Linux alone is known to grant them.
        uint32_t lo, hi;
        __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
#if defined(__linux__)
        return ((lo >> 17) & 3) == 3;
#else
        return false;
#endif
    }();
    return ok;
}

bool amx_tiles_granted() {
    // Linux 5.16+: ARCH_REQ_XCOMP_PERM for XTILEDATA, asked for once, when the table is first taken (not at
    // import: the grant makes every thread's signal frames larger).
    static const bool ok = [] {
#if defined(__linux__)
        return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
        return false;
#endif
    }();
    return ok;
}

const Kernels* kernels_amx() {
    static const Kernels table = [] {
        Kernels k = *kernels_avx512();
        k.isa = "amx";
        k.amx = &AMX_OPS;
        return k;
    }();
    return &table;
}

}  // namespace clover
