// AVX-512 (F, BW, VL) + VNNI kernels for q4_K, q5_K, q6_K, q4_0, q8_0, q5_0, q4_1, q5_1, iq4_nl and mxfp4, and
// the layouts repacked at load of q4_K, q3_K, q2_K, iq4_xs, iq3_xxs and iq3_s (with model_ops_avx512.cpp and
// kernels_avx512_vbmi.cpp the only files compiled with -mavx512*). The low-bit super-block types on the file's
// layout (q2_K, q3_K, iq4_xs, the iq3, iq2 and iq1 types) run kernel_low256_avx2.h's lane tiles with 256-bit
// vpdpbusd from 2-8 tokens by type (use_lanes_vnni, near the end); below that the iq2 types run the VBMI kernels
// of kernels_avx512_vbmi.cpp where the CPU has VBMI and BITALG, and the others AVX2's register tiles. Every other
// format runs the AVX2 kernels: kernels_avx512() is the AVX2 table with these entries replaced.
//
// k-quants: one token (GEMV) runs one weight row at a time, 64 weights per register through
// vpdpbusd, two registers' sums packed to int16 and vpmaddwd with the sub-block scales; two or more tokens
// run the lane-layout tiles below (vpdpbusd, scales once per super-block). Q4_0 and Q8_0: vpdpbusd on
// biased unsigned weights, one token in a loop over a table of the activations, more in the lane layout
// (K a multiple of 256; register tiles otherwise). Results equal the AVX2 and scalar kernels' up to
// float rounding order (integer block sums are exact).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernel_low256_avx2.h"
#include "kernel_r16.h"
#include "kernel_tiles.h"
#include "kernels.h"

namespace clover {

namespace {

inline float half(uint16_t h) { return _cvtsh_ss(h); }

// int16 lanes: the first 16 take value lo, the last 16 value hi.
inline __m512i halves16(short lo, short hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(lo)), _mm256_set1_epi16(hi), 1);
}

// float acc += (float)sum * s
inline __m512 fma_i32(__m512i sum, float s, __m512 acc) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(s), acc);
}

// ---- q4_K: 8 sub-blocks of 32 with 6-bit scales and mins; step c covers sub-blocks 2c (low nibbles
// of qs[32c..32c+31]) and 2c+1 (high nibbles), activations x.qs[64c..64c+63] ----

// ---- k-quants, two or more tokens ----
// The products run on vpdpbusd (4 per int32 lane) with the sub-block scales applied once per
// super-block, in float: each of the four 64-weight vectors of a super-block puts the same sub-block
// in lane L (q4_K: sub-block L / 2, its weights 16 (L % 2) + 4c .. + 3 in vector c; q6_K: sub-block L,
// weights 4c .. + 3), so a lane sums 16 products of one sub-block. The weights are unpacked into that
// order in registers (one dword permute, shifts and masks per vector), the activations are reordered
// to match once per call and thread (XK4P, XK6L, 64-byte aligned: with malloc's 16-byte alignment
// every other call ran ~25% slower on loads split across cache lines).
// q4_K: lanes 2j and 2j + 1 hold the same sub-block, so each token's sums fold to 8 lanes and two
// tokens share one register for the float work: (scale j * sum) * d * d_x (q5_K: sum * (d * scale j)
// * d_x), and the mins term -dmin * min_j * d_x * sum_j(x) as one more multiply-add; the pair's d_x
// and group-sum vectors are built once per call (XK4P). Groups of up to 12 tokens (16 spill
// registers; fewer where K is long: group_tokens). q6_K: 16 distinct scales per
// super-block, one token per register; the offset 32 starts the lane sums at -32 x the token's sum
// over sub-block L. Groups of up to 8 tokens. With more tokens than one group, the first group stores each
// row of a chunk unpacked (Kind::U) as it computes, and the other groups load it.
// Measured in cache (1024 x 2048, one thread, 32 tokens, alternating runs), against the AVX-512 tiles
// before these (vpmaddubsw + vpdpwssd per 64 weights, two rows x four tokens, the scales per (row,
// token) and super-block in integer and float, every token streamed from L2 past each row pair):
// q4_K 220 -> 355 GFLOP/s (lane layout 271, loop order 319, scales in float 355), then 390 with token
// pairs and groups of 12; q6_K 225 -> 363.

struct alignas(64) XK4P {  // one super-block of two tokens (the second all zero past the last token)
    int8_t q[2][QK_K];  // q[i][64c + 4L + j] = token i's x[16L + 4c + j]
    // q5_K: lane 2j + i for token i and sub-block j (the order two in-lane shuffles and blends leave a
    // token pair's sums in); q4_K: lane 4k + i for token i / 2 and sub-block 2k + i % 2 (the order
    // vpackssdw + vpmaddwd leave them in)
    float dx[16];  // the token's d
    float bm[16];  // d * (the token's sum of x over the sub-block)
};
struct alignas(64) XK6L {
    int8_t q[QK_K];    // q[64c + 4L + i] = x[16L + 4c + i]
    int32_t bs32[16];  // -32 * (sum of x over sub-block L)
    float d;
    float pad[15];
};

// 256 activation bytes into the lane order of both kinds: dst[64c + 4L + i] = src[16L + 4c + i] (two
// dword permutes and a blend per vector).
// (x0 .. x3: the 256 bytes in registers)
inline void lane_order(__m512i x0, __m512i x1, __m512i x2, __m512i x3, int8_t* dst) {
    __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60);
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_mask_blend_epi32(0xff00, _mm512_permutex2var_epi32(x0, idx, x1),
                                                  _mm512_permutex2var_epi32(x2, idx, x3));
        _mm512_store_si512((void*)(dst + 64 * c), v);
        idx = _mm512_add_epi32(idx, _mm512_set1_epi32(1));
    }
}
inline void lane_order(const int8_t* src, int8_t* dst) {
    lane_order(_mm512_loadu_si512((const void*)src), _mm512_loadu_si512((const void*)(src + 64)),
               _mm512_loadu_si512((const void*)(src + 128)), _mm512_loadu_si512((const void*)(src + 192)), dst);
}

// Row partials reduced eight rows at a time (the lane-layout tiles' finish): a[0..7] are eight rows'
// 16-float partial-sum vectors; lane 4k + i of c03 is the sum of quarter k (four lanes) of a[i], of
// c47 the same for a[4 + i]. Every row's lanes are added in the same order whatever its position, so
// a row's result does not depend on the rows it is grouped with.
inline void quarter_sums8(const __m512* a, __m512& c03, __m512& c47) {
    auto pair = [](__m512 x, __m512 y) { return _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y)); };
    auto quad = [](__m512 x, __m512 y) {
        return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xEE));
    };
    c03 = quad(pair(a[0], a[1]), pair(a[2], a[3]));
    c47 = quad(pair(a[4], a[5]), pair(a[6], a[7]));
}

// lanes 8-15 (AVX512F has no 256-bit float extract; the pd one moves the same bits)
inline __m256 high_half(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// Quarters [half 0 of rows 0-3, half 1 of rows 0-3, half 0 of rows 4-7, half 1 of rows 4-7], where a
// half is the sum of quarters 0+1 (or 2+3) of each row.
inline __m512 half_sums8(const __m512* a) {
    __m512 c03, c47;
    quarter_sums8(a, c03, c47);
    return _mm512_add_ps(_mm512_shuffle_f32x4(c03, c47, 0x88), _mm512_shuffle_f32x4(c03, c47, 0xDD));
}

// q4_K, and q5_K (FIVE): the same lanes with the fifth bit of each weight from qh (bit j of qh[l]
// belongs to weight l of sub-block j).
template <bool FIVE>
struct KindQ45K {
    using Block = std::conditional_t<FIVE, block_q5_K, block_q4_K>;
    using X = XK4P;
    static constexpr int GROUP = 12;
    static constexpr int TOKENS_PER_ENTRY = 2;
    // a row's results: one vector per token pair (lanes 0-7 the even token's partial sums, 8-15 the odd one's)
    using Part = __m512;
    static constexpr int ROWS = 8, SLOTS = GROUP / 2;
    static void finish(const Part* part, int rn, int rows, float* Y, int64_t ldy) {
        const __mmask8 k = (__mmask8)((1u << rows) - 1);
        for (int p = 0; 2 * p < rn; p++) {
            const __m512 f = half_sums8(part + p * ROWS);
            const __m512 g = _mm512_shuffle_f32x4(f, f, 0xD8);  // [even token rows 0-7 | odd token rows 0-7]
            _mm256_mask_storeu_ps(Y + 2 * p * ldy, k, _mm512_castps512_ps256(g));
            if (2 * p + 1 < rn)
                _mm256_mask_storeu_ps(Y + (2 * p + 1) * ldy, k, high_half(g));
        }
    }
    // The float lane of token i (of a pair) and sub-block j (XK4P).
    static constexpr int lane(int i, int j) { return FIVE ? 2 * j + i : 4 * (j / 2) + 2 * i + j % 2; }
    // tokens x[0] and, unless null, x[1]
    static void reorder(const block_q8_K* const* x, X* out) {
        for (int i = 0; i < 2; i++) {
            if (!x[i]) {
                std::memset(out->q[i], 0, QK_K);
                for (int j = 0; j < 8; j++) out->dx[lane(i, j)] = out->bm[lane(i, j)] = 0.f;
                continue;
            }
            lane_order(x[i]->qs, out->q[i]);
            for (int j = 0; j < 8; j++) {
                const int L = lane(i, j);
                out->dx[L] = x[i]->d;
                out->bm[L] = x[i]->d * (float)(x[i]->bsums[2 * j] + x[i]->bsums[2 * j + 1]);
            }
        }
    }
    // A super-block's weights in lane order (vector c); its scale vectors: scales() below.
    static __m512i vec(__m512i lo, __m512i hi, __m512i h, int c) {
        // dword index of lane L in vector c: 8 (L / 4) + 4 (L % 2) + c; nibble shift 4 ((L / 2) % 2)
        const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 4, 0, 4, 8, 12, 8, 12, 16, 20, 16, 20, 24, 28, 24, 28),
                                             _mm512_set1_epi32(c));
        const __m512i shift = _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4);
        const __m512i q = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutex2var_epi32(lo, idx, hi), shift),
                                           _mm512_set1_epi32(0x0f0f0f0f));
        if constexpr (!FIVE) {
            (void)h;
            return q;
        } else {
            // lane L's weights 16 (L % 2) + 4c .. + 3 of sub-block L / 2: bit L / 2 of qh dword 4 (L % 2) + c
            const __m512i hidx = _mm512_add_epi32(_mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4),
                                                  _mm512_set1_epi32(c));
            const __m512i hshift = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            const __m512i up = _mm512_slli_epi32(_mm512_srlv_epi32(_mm512_permutexvar_epi32(hidx, h), hshift), 4);
            return _mm512_ternarylogic_epi32(q, up, _mm512_set1_epi32(0x10101010), 0xf8);  // q | (up & 0x10)
        }
    }
    // (always inlined: called out of line, it costs ~9% of a 32-token MoE through memory round trips)
    // q5_K: sd = d * scale j in float lanes 2j and 2j + 1. q4_K: sd holds the int16 multipliers of
    // vpmaddwd, scale 2k + i / 2 in words 8k + i and 8k + 4 + i (i < 4), and d = the broadcast d.
    // mins = -dmin * min j in the float lanes of sub-block j (lane()).
    __attribute__((always_inline)) static void scales(const Block* w, __m512* sd, __m512* d, __m512* mins) {
        const __m128i hdr = k4_header(w->scales);
        if constexpr (FIVE) {
            const __m128i dup8 = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            const __m128i mdup8 = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
            *sd = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_shuffle_epi8(hdr, dup8))),
                                _mm512_set1_ps(half(w->d)));
            *d = *sd;
            *mins = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_shuffle_epi8(hdr, mdup8))),
                                  _mm512_set1_ps(-half(w->dmin)));
        } else {
            const __m256i words = _mm256_setr_epi8(0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3, 4, 4, 5, 5, 4, 4, 5, 5, 6,
                                                   6, 7, 7, 6, 6, 7, 7);
            const __m256i sc = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(hdr), words);
            *sd = _mm512_castsi512_ps(_mm512_cvtepu8_epi16(sc));
            *d = _mm512_set1_ps(half(w->d));
            const __m128i mq = _mm_setr_epi8(8, 9, 8, 9, 10, 11, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15);
            *mins = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_shuffle_epi8(hdr, mq))),
                                  _mm512_set1_ps(-half(w->dmin)));
        }
    }
    // A row unpacked once for several token groups (what the tile computes per super-block, stored).
    struct alignas(64) U5 {
        __m512i q[4];
        __m512 sd, mins;
    };
    struct alignas(64) U4 : U5 {
        float d;
    };
    using U = std::conditional_t<FIVE, U5, U4>;
    // One weight row against RN tokens (token t: x[t / 2 * xs + b].q[t % 2]) -> part[p * ROWS], the
    // partial sums of tokens 2p and 2p + 1.
    template <int RN, Rows R>
    static void tile(const uint8_t* row, U* u, const X* x, int64_t nb, Part* part, const KSpan& ks) {
        const int64_t xs = ks.stride;  // between one token's (entry's) activations and the next's
        constexpr bool PRE = R == Rows::LOAD;
        const __m512i zero = _mm512_setzero_si512();
        const Block* w = (const Block*)row;
        constexpr int NP = (RN + 1) / 2;
        __m512 acc[NP];
        for (int p = 0; p < NP; p++) acc[p] = ks.first ? _mm512_setzero_ps() : part[p * ROWS];
        for (int64_t b = 0; b < nb; b++, w++) {
            __m512i lo, hi, h = zero;
            if constexpr (!PRE) {
                prefetch_block(w, sizeof(Block));
                lo = _mm512_loadu_si512((const void*)w->qs);
                hi = _mm512_loadu_si512((const void*)(w->qs + 64));
                if constexpr (FIVE) h = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)w->qh));
            }
            __m512i v[RN];
            for (int t = 0; t < RN; t++) v[t] = _mm512_setzero_si512();
            for (int c = 0; c < 4; c++) {
                const __m512i q = PRE ? _mm512_load_si512((const void*)&u[b].q[c]) : vec(lo, hi, h, c);
                if constexpr (R == Rows::STORE) _mm512_store_si512((void*)&u[b].q[c], q);
                for (int t = 0; t < RN; t++)
                    v[t] = _mm512_dpbusd_epi32(v[t], q, _mm512_load_si512((const void*)(x[t / 2 * xs + b].q[t % 2] + 64 * c)));
            }
            // Lanes 2j and 2j + 1 hold sub-block j: each token's sums fold to 8 lanes, two tokens per
            // register, so the float work per token is half a conversion and two half multiply-adds.
            // q4_K folds in integer: a lane sums at most 16 x 15 x 127 (int16), so vpackssdw packs a
            // pair's sums exactly and vpmaddwd adds each sub-block's two lanes times its scale, in place
            // of two dword permutes and an add (in cache, one thread on Zen 4, 2048 x 512: 8 tokens 201
            // -> 220 GFLOP/s, 12 tokens 213 -> 240; 32 tokens unchanged). q5_K's sums (weights to 31) do
            // not fit int16: lane 2j takes token 0's two lanes of sub-block j and lane 2j + 1 token 1's, by
            // two blends / shuffles within 128-bit lanes and an add (two cross-lane vpermt2d and an add
            // before, slower on Zen 4).
            __m512 sd, dd, mins;
            if constexpr (PRE) {
                sd = _mm512_load_ps((const float*)&u[b].sd);
                if constexpr (FIVE)
                    dd = sd;
                else
                    dd = _mm512_set1_ps(u[b].d);
                mins = _mm512_load_ps((const float*)&u[b].mins);
            } else {
                scales(w, &sd, &dd, &mins);
                if constexpr (R == Rows::STORE) {
                    u[b].sd = sd;
                    u[b].mins = mins;
                    if constexpr (!FIVE) u[b].d = _mm512_cvtss_f32(dd);
                }
            }
            for (int p = 0; p < NP; p++) {
                const X& xp = x[p * xs + b];
                const __m512i v1 = 2 * p + 1 < RN ? v[2 * p + 1] : zero;  // an odd count: the last token alone
                __m512i s;
                if constexpr (FIVE) {
                    const __m512i v0 = v[2 * p];
                    // a: v0's lane 2j, v1's lane 2j + 1; b: v0's lane 2j + 1 in lane 2j, v1's lane 2j in 2j + 1
                    const __m512i a = _mm512_mask_blend_epi32(0xAAAA, v0, v1);
                    const __m512i b = _mm512_mask_shuffle_epi32(_mm512_shuffle_epi32(v0, _MM_PERM_CDAB), 0xAAAA, v1,
                                                                _MM_PERM_CDAB);
                    s = _mm512_add_epi32(a, b);
                } else
                    s = _mm512_madd_epi16(_mm512_packs_epi32(v[2 * p], v1), _mm512_castps_si512(sd));
                acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dd, _mm512_load_ps(xp.dx)), acc[p]);
                acc[p] = _mm512_fmadd_ps(mins, _mm512_load_ps(xp.bm), acc[p]);
            }
        }
        if (ks.last) {  // back to finish's order: lanes 0-7 the even token's, 8-15 the odd one's
            const __m512i order = FIVE ? _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)
                                       : _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
            for (int p = 0; p < NP; p++) acc[p] = _mm512_permutexvar_ps(order, acc[p]);
        }
        for (int p = 0; p < NP; p++) part[p * ROWS] = acc[p];
    }
};

// Tiles whose row result per token is one 16-lane vector of partial sums (q6_K, Q8_0, Q4_0): eight rows
// finish together (kernel_tiles.h).
struct TokenRows16 {
    static constexpr int TOKENS_PER_ENTRY = 1;
    using Part = __m512;
    static constexpr int ROWS = 8;
    static void finish(const Part* part, int rn, int rows, float* Y, int64_t ldy) {
        const __mmask8 k = (__mmask8)((1u << rows) - 1);
        for (int t = 0; t < rn; t++) {
            const __m512 f = half_sums8(part + t * ROWS);
            const __m512 g = _mm512_shuffle_f32x4(f, f, 0xD8);  // [rows 0-7 half 0 | rows 0-7 half 1]
            const __m256 y = _mm256_add_ps(_mm512_castps512_ps256(g), high_half(g));
            _mm256_mask_storeu_ps(Y + t * ldy, k, y);
        }
    }
};

struct KindQ6K : TokenRows16 {
    using X = XK6L;
    static constexpr int GROUP = 8, SLOTS = GROUP;
    static void reorder(const block_q8_K* const* x, X* out) {
        lane_order(x[0]->qs, out->q);
        for (int L = 0; L < 16; L++) out->bs32[L] = -32 * x[0]->bsums[L];
        out->d = x[0]->d;
    }
    // Sub-block L = 16-weight group of half h = L / 8, 32-weight vector k = (L % 8) / 2 of that half,
    // first or second 16 by L % 2; its weights 4c..4c+3 (vector c) are byte l = 16 (L % 2) + 4c of
    // ql[64h + 32 (k % 2) + l] (low nibble for k < 2, high for k >= 2) and qh[32h + l] bits 2k, 2k + 1.
    static __m512i vec(__m512i l0, __m512i l1, __m512i h, int c) {
        const __m512i li = _mm512_add_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 16, 20, 24, 28, 16, 20, 24, 28),
                                            _mm512_set1_epi32(c));
        const __m512i lshift = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
        const __m512i hi = _mm512_add_epi32(_mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 8, 12, 8, 12, 8, 12, 8, 12),
                                            _mm512_set1_epi32(c));
        const __m512i hshift = _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 0, 0, 2, 2, 4, 4, 6, 6);
        const __m512i lo = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutex2var_epi32(l0, li, l1), lshift),
                                            _mm512_set1_epi32(0x0f0f0f0f));
        const __m512i up = _mm512_slli_epi32(_mm512_srlv_epi32(_mm512_permutexvar_epi32(hi, h), hshift), 4);
        return _mm512_ternarylogic_epi32(lo, up, _mm512_set1_epi32(0x30303030), 0xf8);  // lo | (up & 0x30)
    }
    static __m512 scales(const block_q6_K* w) {  // lane L: d * scale L
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)w->scales))),
                             _mm512_set1_ps(half(w->d)));
    }
    struct alignas(64) U {  // a row's super-block unpacked once for several token groups
        __m512i q[4];
        __m512 sd;
    };
    template <int RN, Rows R>
    static void tile(const uint8_t* row, U* u, const X* x, int64_t nb, Part* part, const KSpan& ks) {
        const int64_t xs = ks.stride;  // between one token's (entry's) activations and the next's
        constexpr bool PRE = R == Rows::LOAD;
        const block_q6_K* w = (const block_q6_K*)row;
        __m512 acc[RN];
        for (int t = 0; t < RN; t++) acc[t] = ks.first ? _mm512_setzero_ps() : part[t * ROWS];
        for (int64_t b = 0; b < nb; b++, w++) {
            __m512i l0, l1, h;
            if constexpr (!PRE) {
                prefetch_block(w, sizeof(block_q6_K));
                l0 = _mm512_loadu_si512((const void*)w->ql);
                l1 = _mm512_loadu_si512((const void*)(w->ql + 64));
                h = _mm512_loadu_si512((const void*)w->qh);
            }
            __m512i v[RN];
            for (int t = 0; t < RN; t++) v[t] = _mm512_load_si512((const void*)x[t * xs + b].bs32);
            for (int c = 0; c < 4; c++) {
                const __m512i q = PRE ? _mm512_load_si512((const void*)&u[b].q[c]) : vec(l0, l1, h, c);
                if constexpr (R == Rows::STORE) _mm512_store_si512((void*)&u[b].q[c], q);
                for (int t = 0; t < RN; t++)
                    v[t] = _mm512_dpbusd_epi32(v[t], q, _mm512_load_si512((const void*)(x[t * xs + b].q + 64 * c)));
            }
            const __m512 sd = PRE ? _mm512_load_ps((const float*)&u[b].sd) : scales(w);
            if constexpr (R == Rows::STORE) u[b].sd = sd;
            for (int t = 0; t < RN; t++)
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v[t]), _mm512_mul_ps(sd, _mm512_set1_ps(x[t * xs + b].d)), acc[t]);
        }
        for (int t = 0; t < RN; t++) part[t * ROWS] = acc[t];
    }
};

// ---- Q8_0 and Q4_0, two or more tokens: the lane layout over super-blocks of 8 blocks (256 weights).
// With the 8 blocks' values in a row, lane L of vector c takes values 4L + 4c .. + 3 of the 256
// (lane_order), so each lane sums 16 products of block L / 2 and the two scales apply once per
// super-block in float, instead of once per block pair and token (the register tiles below). The
// weights go unsigned (Q8_0: q xor 0x80; Q4_0: the nibbles) and each lane sum starts at -bias x the
// sum of its 16 activations. Rows unpacked once for several token groups as in the k-quant tiles. ----
struct alignas(64) X8L {  // 8 block_q8_a of one token, in lane order
    int8_t q[QK_K];
    int32_t start[16];  // lane L: -bias * (sum of the 16 activations lane L multiplies)
    float d[16];        // lane L: the scale of block L / 2
    float xs[16];       // lane L: d x (sum of its 16 activations), for the formats with a min (Q4_1, Q5_1)
};

template <typename Unpack>
struct KindQ8L : TokenRows16 {
    using XB = block_q8_a;
    static constexpr int64_t SB = QK_K, XB_VALUES = QK;
    static constexpr int BLOCKS = QK_K / QK;
    using X = X8L;
    static constexpr int GROUP = 8, SLOTS = GROUP;
    static void reorder(const block_q8_a* const* x, X* out) {
        alignas(64) int8_t v[QK_K];
        for (int j = 0; j < BLOCKS; j++) std::memcpy(v + QK * j, x[0][j].qs, QK);
        lane_order(v, out->q);
        for (int L = 0; L < 16; L++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += v[16 * L + i];
            out->start[L] = -Unpack::BIAS * sum;
            out->d[L] = x[0][L / 2].d;
            out->xs[L] = x[0][L / 2].d * (float)sum;
        }
    }
    struct alignas(64) U {
        __m512i q[4];
        __m512 dw;  // lane L: the scale of block L / 2
        __m512 mw;  // lane L: the min of block L / 2 (Unpack::MINS)
    };
    // Blocks 2i and 2i + 1 as 64 unsigned bytes (built in registers: a round trip through memory stalls
    // the 64-byte loads on the narrower stores).
    static __m512i two_blocks(const uint8_t* w, int i) { return Unpack::pair(w, 2 * i, false); }
    static void unpack(const uint8_t* w, U* u) {  // w: the super-block's 8 blocks
        lane_order(two_blocks(w, 0), two_blocks(w, 1), two_blocks(w, 2), two_blocks(w, 3), (int8_t*)u->q);
        const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        u->dw = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(Unpack::scales8(w)));
        if constexpr (Unpack::MINS) u->mw = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(Unpack::mins8(w)));
    }
    template <int RN, Rows R>
    static void tile(const uint8_t* row, U* u, const X* x, int64_t nb, Part* part, const KSpan& ks) {
        const int64_t xs = ks.stride;  // between one token's (entry's) activations and the next's
        constexpr int64_t SBB = BLOCKS * Unpack::BYTES;
        U local;
        __m512 acc[RN];
        for (int t = 0; t < RN; t++) acc[t] = ks.first ? _mm512_setzero_ps() : part[t * ROWS];
        for (int64_t b = 0; b < nb; b++) {
            const U* ub = u + b;
            if constexpr (R != Rows::LOAD) {
                prefetch_block(row + b * SBB, SBB);
                U* dst = R == Rows::STORE ? u + b : &local;
                unpack(row + b * SBB, dst);
                ub = dst;
            }
            __m512i v[RN];
            for (int t = 0; t < RN; t++) v[t] = _mm512_load_si512((const void*)x[t * xs + b].start);
            for (int c = 0; c < 4; c++) {
                const __m512i q = _mm512_load_si512((const void*)&ub->q[c]);
                for (int t = 0; t < RN; t++)
                    v[t] = _mm512_dpbusd_epi32(v[t], q, _mm512_load_si512((const void*)(x[t * xs + b].q + 64 * c)));
            }
            for (int t = 0; t < RN; t++) {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v[t]), _mm512_mul_ps(ub->dw, _mm512_load_ps(x[t * xs + b].d)),
                                         acc[t]);
                if constexpr (Unpack::MINS) acc[t] = _mm512_fmadd_ps(ub->mw, _mm512_load_ps(x[t * xs + b].xs), acc[t]);
            }
        }
        for (int t = 0; t < RN; t++) part[t * ROWS] = acc[t];
    }
};

// One token (GEMV) over q4_K and q5_K: the scale header decoded with two byte shuffles and a few
// shifts; 64 bytes of nibbles unpacked with two ANDs and one shift (sub-blocks 0 and 2 in the low
// nibbles, 1 and 3 in the high ones; q5_K adds each byte's fifth bit from qh), the activations
// reordered once per call and thread to match (XK4), with their pairwise group sums for the mins.
// vpdpbusd sums four products per int32 lane; two vectors' sums pack to int16 (vpackssdw, exact), and
// vpmaddwd adds each sub-block's lane pairs times its scale (in cache, one thread on Zen 4: q4_K 82 ->
// 89 GFLOP/s, q5_K 62 -> 65, against vpmaddubsw and vpdpwssd with word-permuted scales).
struct alignas(64) XK4 {  // one q8_K super-block of activations, reordered for the GEMV
    int8_t q[QK_K];  // [x0..31 x64..95 | x32..63 x96..127 | x128..159 x192..223 | x160..191 x224..255]
    int16_t bs8[8];  // sum of x over sub-block j (32 values)
    float d;
};

template <bool FIVE>
void gemm_q45k(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
               int64_t n0, int64_t n1) {
    using Block = std::conditional_t<FIVE, block_q5_K, block_q4_K>;
    if (M != 1) {
        gemm_kquant_tiles<KindQ45K<FIVE>>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
        return;
    }
    const int64_t nb = K / QK_K;
    thread_local std::vector<XK4> table;
    table.resize(nb);
    const block_q8_K* x = (const block_q8_K*)X;
    for (int64_t b = 0; b < nb; b++) {
        static const int src[8] = {0, 64, 32, 96, 128, 192, 160, 224};
        for (int i = 0; i < 8; i++) std::memcpy(table[b].q + 32 * i, x[b].qs + src[i], 32);
        for (int j = 0; j < 8; j++) table[b].bs8[j] = (int16_t)(x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
        table[b].d = x[b].d;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i i02 = halves16(0, 2), i13 = halves16(1, 3), i46 = halves16(4, 6), i57 = halves16(5, 7);
    const XK4* tb = table.data();
    // q5_K: the fifth bits of sub-blocks j0 (low 256 bits) and j1 (high) are bit j of qh[l], l the byte's
    // place in its half: qh in both halves shifted right by j per half (the shift counts above are
    // those pairs j0, j1) and moved to bit 4 of each byte
    const __m512i b4 = _mm512_set1_epi8(0x10);
    // the scales per int16 word after the pack of sub-blocks (0 | 2, 1 | 3): per 128-bit lane, four
    // words of the first vector's sub-block, four of the second's (+4: the pack of (4 | 6, 5 | 7))
    const __m256i sidx01 = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 2, 2,
                                            2, 2, 3, 3, 3, 3);
    const __m256i sidx45 = _mm256_add_epi8(sidx01, _mm256_set1_epi8(4));
    for (int64_t n = n0; n < n1; n++) {
        const Block* w = (const Block*)(W + n * wrb);
        __m512 acc = _mm512_setzero_ps();
        __m128 acc_min = _mm_setzero_ps();
        for (int64_t b = 0; b < nb; b++, w++) {
            prefetch_block(w, sizeof(Block));
            // the header: bytes 0-7 the 6-bit scales, 8-15 the mins (decode_k4_header, by lanes)
            const __m128i sm = k4_header(w->scales);
            const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
            // d and dmin times the activations' scale
            int d_dmin;  // the two fp16 words d, dmin
            std::memcpy(&d_dmin, &w->d, 4);
            const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(d_dmin)), _mm_set1_ps(tb[b].d));
            const __m512i a = _mm512_loadu_si512((const void*)w->qs), c = _mm512_loadu_si512((const void*)(w->qs + 64));
            __m512i q0 = _mm512_and_si512(a, m4), q1 = _mm512_and_si512(_mm512_srli_epi16(a, 4), m4);
            __m512i q2 = _mm512_and_si512(c, m4), q3 = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
            if constexpr (FIVE) {
                const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)w->qh));
                auto bit5 = [&](__m512i q, __m512i j) {  // q | (bit 4 of each byte of (qh >> j) << 4)
                    return _mm512_ternarylogic_epi32(q, _mm512_slli_epi16(_mm512_srlv_epi16(h, j), 4), b4, 0xf8);
                };
                q0 = bit5(q0, i02);
                q1 = bit5(q1, i13);
                q2 = bit5(q2, i46);
                q3 = bit5(q3, i57);
            }
            const int8_t* xq = tb[b].q;
            // (four products per int32 lane, at most 4 x 31 x 127: the packs to int16 are exact)
            const __m256i s2 = _mm256_broadcastsi128_si256(sm);
            const __m512i sc01 = _mm512_cvtepu8_epi16(_mm256_shuffle_epi8(s2, sidx01));
            const __m512i sc45 = _mm512_cvtepu8_epi16(_mm256_shuffle_epi8(s2, sidx45));
            const __m512i z = _mm512_setzero_si512();
            const __m512i p01 = _mm512_packs_epi32(_mm512_dpbusd_epi32(z, q0, _mm512_loadu_si512(xq)),
                                                   _mm512_dpbusd_epi32(z, q1, _mm512_loadu_si512(xq + 64)));
            const __m512i p23 = _mm512_packs_epi32(_mm512_dpbusd_epi32(z, q2, _mm512_loadu_si512(xq + 128)),
                                                   _mm512_dpbusd_epi32(z, q3, _mm512_loadu_si512(xq + 192)));
            const __m512i sum = _mm512_add_epi32(_mm512_madd_epi16(p01, sc01), _mm512_madd_epi16(p23, sc45));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_broadcastss_ps(dd), acc);
            const __m128i zp = _mm_madd_epi16(mins, _mm_loadu_si128((const __m128i*)tb[b].bs8));
            acc_min = _mm_fmadd_ps(_mm_cvtepi32_ps(zp), _mm_shuffle_ps(dd, dd, 0x55), acc_min);
        }
        __m128 m = _mm_add_ps(acc_min, _mm_movehl_ps(acc_min, acc_min));
        m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
        Y[n] = _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(m);
    }
}

// ---- q6_K: weights q in 0..63 (offset 32 through the q8_K group sums), 16 int8 scales of 16 weights.
// Half h (weights 128h..128h+127): ql[64h..64h+63] low nibbles are vectors j = 4h, 4h+1 (activations
// x.qs[128h..128h+63]), their high nibbles j = 4h+2, 4h+3 (x.qs[128h+64..]); qh[32h..32h+31] holds
// the two top bits, vector j at bit 2 (j % 4). Scale sc[2j + i] covers weights 16i..16i+15 of vector j,
// so the four 128-bit lanes of a 64-weight register take four consecutive scales ----

// One token, one row at a time: vpdpbusd sums four products per int32 lane (at most 4 x 63 x 127, so
// the low and high nibbles' sums of a half pack to int16 exactly) and vpmaddwd applies the scales:
// per 128-bit lane k of half h, four words of scale 8h + k, four of 8h + 4 + k. (In cache, one thread
// on Zen 4: 60 -> 67-68 GFLOP/s against vpmaddubsw + vpdpwssd with word-permuted scales, alternating
// runs.)
void gemv_q6k(const uint8_t* W, size_t wrb, const uint8_t* X, int64_t K, float* Y, int64_t n0, int64_t n1) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(3);
    const __m512i shift_lo = halves16(0, 2), shift_hi = halves16(4, 6);  // qh bits of j, j + 1
    const __m256i sidx0 = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2, 6, 6, 6, 6, 3, 3,
                                           3, 3, 7, 7, 7, 7);
    const __m256i sidx[2] = {sidx0, _mm256_add_epi8(sidx0, _mm256_set1_epi8(8))};  // half h: scales 8h ..
    const int64_t nb = K / QK_K;
    const block_q8_K* x = (const block_q8_K*)X;
    for (int64_t n = n0; n < n1; n++) {
        const block_q6_K* w = (const block_q6_K*)(W + n * wrb);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++, w++) {
            prefetch_block(w, sizeof(block_q6_K));
            const __m128i sc8 = _mm_loadu_si128((const __m128i*)w->scales);
            const __m256i sc2 = _mm256_broadcastsi128_si256(sc8);
            __m512i sum = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                const __m512i l = _mm512_loadu_si512((const void*)(w->ql + 64 * h));
                const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(w->qh + 32 * h)));
                const __m512i hi0 = _mm512_and_si512(_mm512_srlv_epi16(qh, shift_lo), m2);
                const __m512i hi1 = _mm512_and_si512(_mm512_srlv_epi16(qh, shift_hi), m2);
                const __m512i q0 = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(hi0, 4));
                const __m512i q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), _mm512_slli_epi16(hi1, 4));
                const int8_t* xq = x[b].qs + 128 * h;
                const __m512i z = _mm512_setzero_si512();
                const __m512i p = _mm512_packs_epi32(_mm512_dpbusd_epi32(z, q0, _mm512_loadu_si512((const void*)xq)),
                                                     _mm512_dpbusd_epi32(z, q1, _mm512_loadu_si512((const void*)(xq + 64))));
                const __m512i s = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(sc2, sidx[h]));
                sum = _mm512_add_epi32(sum, _mm512_madd_epi16(p, s));
            }
            const float d = half(w->d) * x[b].d;
            acc = fma_i32(sum, d, acc);
            const __m256i bs = _mm256_loadu_si256((const __m256i*)x[b].bsums);
            const __m512i zp = _mm512_zextsi256_si512(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), bs));
            acc = fma_i32(zp, -32.f * d, acc);
        }
        Y[n] = _mm512_reduce_add_ps(acc);
    }
}

// One token: the GEMV above; two or more: the lane-layout tiles.
void gemm_q6k(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
              int64_t n0, int64_t n1) {
    if (M == 1)
        gemv_q6k(W, wrb, X, K, Y, n0, n1);
    else
        gemm_kquant_tiles<KindQ6K>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
}

// ---- Q4_0 and Q8_0 weights against block_q8_a activations: two 32-weight blocks per register ----
// The weights are loaded as unsigned bytes u = q + BIAS (Q4_0: the nibble itself, BIAS 8; Q8_0: q xor
// 0x80, BIAS 128) so that vpdpbusd multiplies them by the signed activations directly; the bias comes
// off through the activations' sums: each token's accumulator starts at -BIAS * (sum of 4 x) per int32
// lane (one vpdpbusd per token and block pair, shared by every row of the tile). Block b's products
// land in int32 lanes 0-7, block b + 1's in lanes 8-15, and one float multiply-add by the per-lane
// scales d_w * d_x per pair (the AVX2 tile: 32 weights and five instructions per (row, token); here 64
// and four).

// float lanes 0-7 = fp16 a, 8-15 = fp16 b (two broadcasts and one conversion)
inline __m512 scales_of(uint16_t a, uint16_t b) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)a)),
                                                   _mm_set1_epi16((short)b), 1));
}

// 8 fp16 fields f of the 8 blocks at w (their scales d, or Q4_1's and Q5_1's mins m) as floats.
template <class Block>
inline __m256 fp16_fields8(const uint8_t* w, uint16_t Block::*f) {
    auto h = [&](int j) { return (short)(((const Block*)w)[j].*f); };
    return _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)));
}
// float lanes 0-7 = a, 8-15 = b
inline __m512 pair_ps(float a, float b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(a)),
                                               _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}
// The 64 nibbles of two blocks' 16 bytes each, in weight order (a block's weights 0-15 in the low nibbles,
// 16-31 in the high ones, so 128-bit lanes 1 and 3 shift by 4).
inline __m512i nibbles_pair(const uint8_t* qs0, const uint8_t* qs1) {
    const __m512i v =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)qs0))),
                           _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)qs1)), 1);
    const __m512i shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi64(v, shift), _mm512_set1_epi8(0x0f));
}
// nibbles_pair plus 16 where the blocks' qh bits are set (a masked byte add): Q5_0's and Q5_1's 5-bit codes.
inline __m512i five_bits_pair(const uint8_t* qs0, const uint8_t* qh0, const uint8_t* qs1, const uint8_t* qh1) {
    uint32_t h0, h1;
    std::memcpy(&h0, qh0, 4);
    std::memcpy(&h1, qh1, 4);
    const __m512i nib = nibbles_pair(qs0, qs1);
    return _mm512_mask_add_epi8(nib, _cvtu64_mask64((uint64_t)h0 | (uint64_t)h1 << 32), nib, _mm512_set1_epi8(16));
}
// A table of 16 signed values as unsigned bytes (value + 128) in every 128-bit lane, for vpshufb.
inline __m512i table_plus_128(const int8_t* values) {
    return _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)values)),
                            _mm512_set1_epi8((char)0x80));
}

// Each format's weights as unsigned bytes u = q + BIAS: pair(row, b, one), blocks b and b + 1 (b twice when
// `one`: an odd block count's last block, whose second scale is 0); scales(row, b, one), float lanes 0-7 the
// first block's scale, 8-15 the second's; scales8(w), the scales of the 8 blocks at w. Formats with a min
// (MINS: Q4_1, Q5_1, BIAS 0) give mins(row, b, one) and mins8(w) as well: their products add
// min x d_x x (sum of the activations) per block. Blocks32 holds what they share: the block type, bias and
// size, blocks b and b + 1 of a row (at, next), and the scales of the formats whose blocks start with an fp16
// d (MXFP4 has its own).
template <class B, int BIAS_, int FAR_ = 0>
struct Blocks32 {
    using Block = B;
    static constexpr int BIAS = BIAS_;
    // where the one-token product also prefetches the row to L2 FAR bytes ahead (0: not)
    static constexpr int FAR = FAR_;
    static constexpr int BYTES = sizeof(B);
    static constexpr bool MINS = false;
    static const B* at(const uint8_t* row, int64_t b) { return (const B*)row + b; }
    static const B* next(const uint8_t* row, int64_t b, bool one) { return (const B*)row + b + (one ? 0 : 1); }
    static __m512 scales(const uint8_t* row, int64_t b, bool one) {
        return scales_of(at(row, b)->d, one ? 0 : next(row, b, one)->d);
    }
    static __m256 scales8(const uint8_t* w) { return fp16_fields8<B>(w, &B::d); }
};
// Q8_0 and Q4_0 unpack fast enough that one thread's stream waits for the memory: their one-token product
// also prefetches to L2 16 KB ahead (kbench, one thread, 4096 x 2048 from memory, runs alternated: Q8_0
// 15.3-19.2 -> 22.2-29.0 GB/s, Q4_0 14.3-15.2 -> 14.1-17.5; Q5_0, Q4_1 and Q5_1 unchanged or 1-3% slower, so
// not there; in cache Q8_0 35.5 -> 33.0).
struct UnpackQ4_0 : Blocks32<block_q4_0, 8, 16384> {
    static __m512i pair(const uint8_t* row, int64_t b, bool one) {
        return nibbles_pair(at(row, b)->qs, next(row, b, one)->qs);
    }
};
struct UnpackQ8_0 : Blocks32<block_q8_0, 128, 16384> {
    static __m512i pair(const uint8_t* row, int64_t b, bool one) {
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)at(row, b)->qs)),
                                             _mm256_loadu_si256((const __m256i*)next(row, b, one)->qs), 1);
        return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    }
};
// Q5_0: the nibble plus 16 where the block's qh bit is set, so u = q + 16.
struct UnpackQ5_0 : Blocks32<block_q5_0, 16> {
    static __m512i pair(const uint8_t* row, int64_t b, bool one) {
        const Block *x = at(row, b), *y = next(row, b, one);
        return five_bits_pair(x->qs, x->qh, y->qs, y->qh);
    }
};
// IQ4_NL and MXFP4: the nibbles looked up in the format's 16 values plus 128 (vpshufb).
struct UnpackIQ4NL : Blocks32<block_iq4_nl, 128> {
    static __m512i pair(const uint8_t* row, int64_t b, bool one) {
        return _mm512_shuffle_epi8(table_plus_128(kvalues_iq4nl), nibbles_pair(at(row, b)->qs, next(row, b, one)->qs));
    }
};
struct UnpackMXFP4 : Blocks32<block_mxfp4, 128> {
    static __m512i pair(const uint8_t* row, int64_t b, bool one) {
        return _mm512_shuffle_epi8(table_plus_128(kvalues_mxfp4), nibbles_pair(at(row, b)->qs, next(row, b, one)->qs));
    }
    // the E8M0 scales
    static __m512 scales(const uint8_t* row, int64_t b, bool one) {
        return pair_ps(e8m0_to_fp32_half(at(row, b)->e), one ? 0.f : e8m0_to_fp32_half(next(row, b, one)->e));
    }
    static __m256 scales8(const uint8_t* w) {
        const Block* x = (const Block*)w;
        return _mm256_setr_ps(e8m0_to_fp32_half(x[0].e), e8m0_to_fp32_half(x[1].e), e8m0_to_fp32_half(x[2].e),
                              e8m0_to_fp32_half(x[3].e), e8m0_to_fp32_half(x[4].e), e8m0_to_fp32_half(x[5].e),
                              e8m0_to_fp32_half(x[6].e), e8m0_to_fp32_half(x[7].e));
    }
};
// Q4_1 and Q5_1: u = q (Q5_1 the nibble plus 16 where the qh bit is set), BIAS 0, and the fp16 mins.
template <bool FIVE>
struct UnpackQ41 : Blocks32<std::conditional_t<FIVE, block_q5_1, block_q4_1>, 0> {
    using Base = Blocks32<std::conditional_t<FIVE, block_q5_1, block_q4_1>, 0>;
    using Block = typename Base::Block;
    static constexpr bool MINS = true;
    static __m512i pair(const uint8_t* row, int64_t b, bool one) {
        const Block *x = Base::at(row, b), *y = Base::next(row, b, one);
        if constexpr (!FIVE)
            return nibbles_pair(x->qs, y->qs);
        else
            return five_bits_pair(x->qs, x->qh, y->qs, y->qh);
    }
    static __m512 mins(const uint8_t* row, int64_t b, bool one) {
        return scales_of(Base::at(row, b)->m, one ? 0 : Base::next(row, b, one)->m);
    }
    static __m256 mins8(const uint8_t* w) { return fp16_fields8<Block>(w, &Block::m); }
};
// Blocks b and b + 1 with their scales (float lanes 0-7 and 8-15).
template <class U>
inline __m512i load_pair(const uint8_t* row, int64_t b, bool one, __m512* dw) {
    *dw = U::scales(row, b, one);
    return U::pair(row, b, one);
}


template <typename U>
struct TileQ8A {
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            const __m512i bias = _mm512_set1_epi8((char)U::BIAS);
            __m512 acc[RM][RN];
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) acc[r][t] = _mm512_setzero_ps();
            const int64_t nb = a.K / QK;
            for (int64_t b = 0; b < nb; b += 2) {
                const bool one = b + 1 == nb;  // an odd block count: the last block alone
                __m512i w[RM];
                __m512 dw[RM], mw[RM];
                for (int r = 0; r < RM; r++) {
                    const uint8_t* row = a.W + (n + r) * a.wrb;
                    prefetch_block(row + b * U::BYTES, 2 * U::BYTES);
                    w[r] = load_pair<U>(row, b, one, &dw[r]);
                    if constexpr (U::MINS) mw[r] = U::mins(row, b, one);
                }
                for (int t = 0; t < RN; t++) {
                    const block_q8_a* x = (const block_q8_a*)(a.X + (m + t) * a.xrb) + b;
                    const __m256i xa = _mm256_loadu_si256((const __m256i*)x[0].qs);
                    const __m512i xv = one ? _mm512_zextsi256_si512(xa)
                                           : _mm512_inserti64x4(_mm512_castsi256_si512(xa),
                                                                _mm256_loadu_si256((const __m256i*)x[1].qs), 1);
                    const __m512 dx = pair_ps(x[0].d, one ? 0.f : x[1].d);
                    const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(),
                                                           _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, xv));
                    __m512 xs = _mm512_setzero_ps();  // lane i: d_x x (sum of its 4 activations), for the mins
                    if constexpr (U::MINS)
                        xs = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                                                                  _mm512_set1_epi8(1), xv)), dx);
                    for (int r = 0; r < RM; r++) {
                        const __m512i s = _mm512_dpbusd_epi32(start, w[r], xv);
                        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], dx), acc[r][t]);
                        if constexpr (U::MINS) acc[r][t] = _mm512_fmadd_ps(mw[r], xs, acc[r][t]);
                    }
                }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + r] = _mm512_reduce_add_ps(acc[r][t]);
        }
    };
};

template <int RM, int RN>
using TileQ4_0 = TileQ8A<UnpackQ4_0>::T<RM, RN>;
template <int RM, int RN>
using TileQ8_0 = TileQ8A<UnpackQ8_0>::T<RM, RN>;

// One token (GEMV): the tile above redoes the activation side (two loads, the bias sums, the scale
// pair) for every weight row; here it is done once per call and thread into a small table (192 bytes
// per block pair, L1-resident), and each row's loop is weights, one vpdpbusd, one multiply-add.
// Measured on 8192x2048, one thread (whose own read bandwidth is ~24 GB/s here): Q4_0 13.7 GB/s with
// the tile, 18.5 with the fp16 scale pair converted in one instruction, 23.8 with this table; Q8_0
// 18.3 -> 23.5. Two threads: Q4_0 24.9 -> 35.9 GB/s, 512x2048 23 -> 29.
template <typename U, int RM_GEMM_FROM>
void gemm_q8a(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
              int64_t n0, int64_t n1) {
    if (M != 1) {
        if (K % QK_K == 0)
            gemm_kquant_tiles<KindQ8L<U>>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
        else
            gemm_tiled<TileQ8A<U>::template T, 1, 2, RM_GEMM_FROM>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
        return;
    }
    const int64_t nb = K / QK, np = (nb + 1) / 2;
    struct Pair {
        __m512i x, start;
        __m512 d, xs;  // xs, lane i: d_x x (sum of its 4 activations), for the mins
    };
    thread_local std::vector<Pair> table;
    table.resize(np);
    const __m512i bias = _mm512_set1_epi8((char)U::BIAS);
    const block_q8_a* x = (const block_q8_a*)X;
    for (int64_t p = 0; p < np; p++) {
        const int64_t b = 2 * p;
        const bool one = b + 1 == nb;
        const __m256i xa = _mm256_loadu_si256((const __m256i*)x[b].qs);
        table[p].x = one ? _mm512_zextsi256_si512(xa)
                         : _mm512_inserti64x4(_mm512_castsi256_si512(xa), _mm256_loadu_si256((const __m256i*)x[b + 1].qs), 1);
        table[p].start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, table[p].x));
        table[p].d = pair_ps(x[b].d, one ? 0.f : x[b + 1].d);
        if constexpr (U::MINS)
            table[p].xs = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), table[p].x)),
                table[p].d);
    }
    const Pair* tb = table.data();
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t* row = W + n * wrb;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t p = 0; p < np; p++) {
            prefetch_block(row + 2 * p * U::BYTES, 2 * U::BYTES);
            if constexpr (U::FAR > 0)
                for (int off = 0; off < 2 * U::BYTES; off += 64) __builtin_prefetch(row + 2 * p * U::BYTES + U::FAR + off, 0, 2);
            __m512 dw;
            const __m512i w = load_pair<U>(row, 2 * p, 2 * p + 1 == nb, &dw);
            const __m512i s = _mm512_dpbusd_epi32(tb[p].start, w, tb[p].x);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, tb[p].d), acc);
            if constexpr (U::MINS) acc = _mm512_fmadd_ps(U::mins(row, 2 * p, 2 * p + 1 == nb), tb[p].xs, acc);
        }
        Y[n] = _mm512_reduce_add_ps(acc);
    }
}

// ---- q4_K repacked by 16 rows (block_q4_K_r16): one row per lane ----
// Per sub-block and token, 8 vpdpbusd of 4 weights of 16 rows (low nibbles as they are, high nibbles
// masked in place: 16 x the value, the 1/16 folded into the scale) against the token's 4 activations
// broadcast from memory; then the int32 sums to float times d x scale of each row (the scales decoded at
// load), the mins as 4 vpdpwssd of the (min, min) pairs against the token's sub-block sums, and d_x once
// per super-block. No unpack permutes, no header decode, no horizontal sums: ~80 cycles per 16 rows,
// token and super-block, where 64 vpdpbusd are the floor. Up to 6 tokens share each weight load
// (groups of equal size); every group of a panel of tokens takes a super-block before the next one is
// read (the accumulators wait in L1), so the weights stream from memory once, at the pace of all the
// tokens, prefetched 4 KB ahead in step with the loads (without the prefetch, 4-8 tokens from memory
// ran at half their in-cache speed: each new 4 KB page waited for the memory). With two or more tokens
// per group the weights also go to L2 12 KB ahead (one group: besides L1 4 KB ahead; several groups:
// instead of L2 4 KB ahead) (from memory, one thread: 2 tokens 3.5-3.75 -> 2.6 ns per super-block row
// and token, 4 tokens 2.7-2.8 -> 1.6; the twin's 8-token forwards 3.6-4.5% faster); one token keeps the
// single prefetch (with a second to L2 8 KB ahead, as the AVX2 kernel's, the twin's one-token forwards
// ran 14-25% slower in four alternating process pairs). The driver, shared with the AVX2 kernel, is
// kernel_r16.h's.

// One super-block of 16 rows for G tokens: acc[g] (lane r) += the super-block's share of row r's dot
// with token g.
template <int G, Prefetch PF>
inline void r16_superblock(const block_q4_K_r16& p, int64_t s, const block_q8_K* const* xs, const int32_t* const* bsp,
                           __m512* acc) {
    constexpr int FAR = G >= 2 ? 12288 : 0;  // (see above)
    const __m512i lo4 = _mm512_set1_epi8(0x0f), hi4 = _mm512_set1_epi8((char)0xf0);
    for (int k = 0; k < 5; k++) prefetch_r16<PF, PREFETCH_BYTES, FAR>((const char*)&p + 64 * k);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p.d));
    const __m512 d16 = _mm512_mul_ps(d, _mm512_set1_ps(1.f / 16));
    __m512 f[G];
    for (int g = 0; g < G; g++) f[g] = _mm512_setzero_ps();
    for (int c = 0; c < 4; c++) {
        const __m512 dlo =
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p.sc[2 * c]))));
        const __m512 dhi = _mm512_mul_ps(
            d16, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p.sc[2 * c + 1]))));
        __m512i sl[G], sh[G];
        for (int g = 0; g < G; g++) sl[g] = sh[g] = _mm512_setzero_si512();
        for (int t = 0; t < 8; t++) {
            const __m512i w = _mm512_loadu_si512(p.qs[c][t]);
            prefetch_r16<PF, PREFETCH_BYTES, FAR>(p.qs[c][t]);
            const __m512i wl = _mm512_and_si512(w, lo4), wh = _mm512_and_si512(w, hi4);
            for (int g = 0; g < G; g++) {
                const int8_t* q = xs[g][s].qs + 64 * c + 4 * t;
                int32_t a, b;
                std::memcpy(&a, q, 4);
                std::memcpy(&b, q + 32, 4);
                sl[g] = _mm512_dpbusd_epi32(sl[g], wl, _mm512_set1_epi32(a));
                sh[g] = _mm512_dpbusd_epi32(sh[g], wh, _mm512_set1_epi32(b));
            }
        }
        for (int g = 0; g < G; g++) {
            f[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl[g]), dlo, f[g]);
            f[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sh[g]), dhi, f[g]);
        }
    }
    __m512i mi[G];
    for (int g = 0; g < G; g++) mi[g] = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        const __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p.mn[c]));
        for (int g = 0; g < G; g++) mi[g] = _mm512_dpwssd_epi32(mi[g], mn, _mm512_set1_epi32(bsp[g][4 * s + c]));
    }
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p.dmin));
    for (int g = 0; g < G; g++) {
        const __m512 dx = _mm512_set1_ps(xs[g][s].d);
        acc[g] = _mm512_fmadd_ps(f[g], dx, acc[g]);
        acc[g] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi[g]), _mm512_mul_ps(dmin, dx), acc[g]);
    }
}

// rows and step (kernel_r16.h's Tile) of a tile T whose superblock<G, PF>(p, s, xs, bsp, acc) adds super-block
// s of the 16 rows at p to G sums in registers (acc[g], lane r: row r's dot with token g). LARGE: T's
// superblock is large code (its loops unrolled whole: the q3_K and q2_K tiles, 8-11 KB at 8 tokens), so step
// runs one body for every group of a panel, the first group's prefetch (the block 12 KB ahead, to L2) issued
// before it. With a body per prefetch kind, two such bodies alternate; one body, kbench, one thread, 512 x 2048
// in cache (8192 x 2048 from memory), ns per super-block row and token at 12 / 16 / 64 tokens, two runs: q3_K
// 1.95 / 2.11 / 1.86 -> 1.81 / 1.77 / 1.78 (2.10-2.13 / 2.21-2.24 / 2.01 -> 1.97-2.12 / 1.91-2.00 / 1.90),
// q2_K 1.52-1.88 / 1.66 / 1.64-1.66 -> 1.50 / 1.50-1.51 / 1.51 (1.58-1.60 / 1.72 / 1.72-1.73 -> 1.58-1.59 /
// 1.58 / 1.59-1.63). Prefetching in every group's body instead cost 1.5-2.5x (AMD's prefetches to L2 fill L1
// too, where the activations are). The q4_K and 4-bit code tiles keep a body per kind (one body: 1-6% slower).
template <class T, bool LARGE = true>
struct R16SumsInRegisters {
    // G tokens over every super-block, the sums in registers (all the call's tokens in one group).
    template <int G, class Block>
    static void rows(const Block* P, int64_t nsb, const block_q8_K* const* xs, const int32_t* const* bsp, float* y,
                     int64_t ldy) {
        __m512 acc[G];
        for (int g = 0; g < G; g++) acc[g] = _mm512_setzero_ps();
        for (int64_t s = 0; s < nsb; s++) T::template superblock<G, Prefetch::L1>(P[s], s, xs, bsp, acc);
        for (int g = 0; g < G; g++) _mm512_storeu_ps(y + g * ldy, acc[g]);
    }
    // One super-block for one of several groups: the group's sums wait in L1 (acc) between super-blocks.
    template <int G, class Block>
    static void step(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const* bsp, float* acc,
                     bool first) {
        __m512 a[G];
        for (int g = 0; g < G; g++) a[g] = _mm512_load_ps(acc + 16 * g);
        if constexpr (LARGE) {
            if (first)
                for (size_t k = 0; k < sizeof(Block); k += 64) __builtin_prefetch((const char*)&p + 12288 + k, 0, 2);
            T::template superblock<G, Prefetch::NONE>(p, s, xs, bsp, a);
        } else if (first) {
            T::template superblock<G, Prefetch::L2>(p, s, xs, bsp, a);
        } else {
            T::template superblock<G, Prefetch::NONE>(p, s, xs, bsp, a);
        }
        for (int g = 0; g < G; g++) _mm512_store_ps(acc + 16 * g, a[g]);
    }
};

// kernel_r16.h's Tile for q4_K: up to 6 tokens share each weight load (6 sums, 12 chains and 2 weight vectors in
// registers).
struct TileR16 : R16SumsInRegisters<TileR16, false> {
    static constexpr int GMAX = 6;
    template <int G, Prefetch PF>
    static void superblock(const block_q4_K_r16& p, int64_t s, const block_q8_K* const* xs, const int32_t* const* bsp,
                           __m512* acc) {
        r16_superblock<G, PF>(p, s, xs, bsp, acc);
    }
};

// ---- iq4_xs repacked, iq3_xxs and iq3_s transcoded (block_iq4_xs_r16's layout, kernel_r16.h's Codes*) ----
// One row per int32 lane, 16 rows per register. Per group j (32 weights) and word t, one 64-byte load holds
// 4 weights of 16 rows: the low nibbles (weights 32 j + 4 t .. + 3) and the high ones (+ 16) looked up by
// vpshufb in the format's 16 values plus 128 (unsigned bytes 1..255: vpdpbusd takes its weights unsigned and
// AVX-512 has no vpsignb), 2 vpdpbusd per token against its 4 activations broadcast. The group's sum then
// drops 128 x the token's sum over the group (two of block_q8_K's bsums) and is multiplied by each row's
// scale (vpmulld) into int32; one float multiply-add per token and super-block (d x factor x d_x). The
// integer sums are exact, so the results equal the AVX2 tile's bit for bit. 64 vpdpbusd per super-block,
// 16 rows and token, as q4_K's tile; up to 6 tokens share each weight load.
// The sums of one group of 32 weights of 16 rows in this layout for G tokens: qs its 4 words of 64 bytes
// (block_iq4_xs_r16's qs[j]), tab the values + 128, x[g] token g's 32 activations of the group; sj[g] lane r
// = row r's sum of (value + 128) x activation.
template <int G, Prefetch PF, int FAR>
__attribute__((always_inline)) inline void codes4_sums(const uint8_t (*qs)[16][4], __m512i tab, const int8_t* const* x,
                                                       __m512i* sj) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    for (int g = 0; g < G; g++) sj[g] = _mm512_setzero_si512();
    for (int t = 0; t < 4; t++) {
        const __m512i q = _mm512_loadu_si512(qs[t]);
        prefetch_r16<PF, PREFETCH_BYTES, FAR>(qs[t]);
        const __m512i lo = _mm512_shuffle_epi8(tab, _mm512_and_si512(q, lo4));
        const __m512i hi = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(q, 4), lo4));
        for (int g = 0; g < G; g++) {
            int32_t a, b;
            std::memcpy(&a, x[g] + 4 * t, 4);
            std::memcpy(&b, x[g] + 16 + 4 * t, 4);
            sj[g] = _mm512_dpbusd_epi32(sj[g], lo, _mm512_set1_epi32(a));
            sj[g] = _mm512_dpbusd_epi32(sj[g], hi, _mm512_set1_epi32(b));
        }
    }
}

template <class C>
struct TileCodes4R16 : R16SumsInRegisters<TileCodes4R16<C>, false> {
    using Block = typename C::Block;
    static constexpr bool PAIRS = false;  // (the group sums come from block_q8_K's bsums)
    static constexpr gemm_fn ref = C::REF;
    static constexpr int GMAX = 6;
    static constexpr int HEAD_LINES = (int)(offsetof(Block, qs) + 63) / 64;

    template <int G, Prefetch PF>
    static void group_sums(const Block& p, int64_t s, const block_q8_K* const* xs, __m512i* isum) {
        constexpr int FAR = G >= 2 ? 12288 : 0;  // (as TileR16)
        for (int k = 0; k < HEAD_LINES; k++) prefetch_r16<PF, PREFETCH_BYTES, FAR>((const char*)&p + 64 * k);
        const __m512i tab = table_plus_128(C::VALUES);
        for (int j = 0; j < 8; j++) {
            __m512i sj[G];
            const int8_t* x[G];
            for (int g = 0; g < G; g++) x[g] = xs[g][s].qs + 32 * j;
            codes4_sums<G, PF, FAR>(p.qs[j], tab, x, sj);
            const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p.sc[j]));
            for (int g = 0; g < G; g++) {
                const int32_t off = 128 * ((int32_t)xs[g][s].bsums[2 * j] + xs[g][s].bsums[2 * j + 1]);
                isum[g] = _mm512_add_epi32(isum[g], _mm512_mullo_epi32(_mm512_sub_epi32(sj[g], _mm512_set1_epi32(off)), sc));
            }
        }
    }
    // acc[g] (lane r) += super-block s's share of row r's dot with token g
    template <int G, Prefetch PF>
    static void superblock(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const*,
                           __m512* acc) {
        __m512i isum[G];
        for (int g = 0; g < G; g++) isum[g] = _mm512_setzero_si512();
        group_sums<G, PF>(p, s, xs, isum);
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p.d));
        if constexpr (C::FACTOR != 1.f) d = _mm512_mul_ps(d, _mm512_set1_ps(C::FACTOR));
        for (int g = 0; g < G; g++)
            acc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g]), _mm512_mul_ps(d, _mm512_set1_ps(xs[g][s].d)), acc[g]);
    }
};

// ---- iq4_nl and mxfp4 repacked (block_iq4_nl_r16, block_mxfp4_r16; kernel_r16.h's Blocks*) ----

// The 16 rows' scales of block j as floats: fp16 d, or e8m0_to_fp32_half ((e - 1) << 23, and 0x00200000 << e
// below e = 2).
template <class C>
inline __m512 nl_scales(const typename C::Block& p, int j) {
    if constexpr (!C::E8M0) {
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p.d[j]));
    } else {
        const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p.e[j]));
        const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
        const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
        return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, sub));
    }
}
// The 4-bit code tile above with a float scale per block of 32 weights and row (fp16 d, or E8M0 2^(e - 128)
// with mxfp4's values doubled) and activations in blocks of 32 with their own scales (block_q8_a, as the file
// layouts' products and llama.cpp's take them, Q8AOf): per block j and token, the 8 vpdpbusd sums less 128 x
// the block's activation sum (from the driver, bsp), to float, times the rows' scales x d_x, added. The int32
// sums are exact; the float sums run in another order than the reference's (one row at a time, block after
// block), so the results agree with it to rounding.
template <class C>
struct TileNL4R16 : R16SumsInRegisters<TileNL4R16<C>, false> {
    using Block = typename C::Block;
    static constexpr bool PAIRS = false;
    static constexpr bool Q8A = true, BLOCK_SUMS = true;
    static constexpr gemm_fn ref = C::REF;
    static constexpr int GMAX = 6;
    static constexpr int HEAD_LINES = (int)(offsetof(Block, qs) + 63) / 64;

    template <int G, Prefetch PF>
    static void superblock(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const* bsp,
                           __m512* acc) {
        constexpr int FAR = G >= 2 ? 12288 : 0;  // (as TileR16)
        for (int k = 0; k < HEAD_LINES; k++) prefetch_r16<PF, PREFETCH_BYTES, FAR>((const char*)&p + 64 * k);
        const __m512i tab = table_plus_128(C::VALUES);
        for (int j = 0; j < 8; j++) {
            __m512i sj[G];
            const block_q8_a* x[G];  // the tokens' block 8 s + j
            const int8_t* xq[G];
            for (int g = 0; g < G; g++) {
                x[g] = (const block_q8_a*)(const void*)xs[g] + 8 * s + j;
                xq[g] = x[g]->qs;
            }
            codes4_sums<G, PF, FAR>(p.qs[j], tab, xq, sj);
            const __m512 dw = nl_scales<C>(p, j);
            for (int g = 0; g < G; g++) {
                const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(sj[g], _mm512_set1_epi32(bsp[g][8 * s + j])));
                acc[g] = _mm512_fmadd_ps(f, _mm512_mul_ps(dw, _mm512_set1_ps(x[g]->d)), acc[g]);
            }
        }
    }
};

// The q3_K and q2_K tiles' inner loop: the sums of vector v's two groups of 16 weights (words 0-3 and 4-7)
// for G tokens, sv[i][g] lane r = row r's codes of group 2v + i (code(t): 4 weights of 16 rows for word t,
// unsigned) against token g's activations (vpdpbusd), with the block at p prefetched ahead, a line every
// other word, to L1 and L2 (FAR bytes ahead).
template <int G, Prefetch PF, int FAR, int LINES, class Code>
__attribute__((always_inline)) inline void vector_sums(const void* p, int64_t s, const block_q8_K* const* xs, int v,
                                                       Code code, __m512i (*sv)[G]) {
#pragma GCC unroll 2
    for (int gg = 0; gg < 2; gg++) {
        for (int g = 0; g < G; g++) sv[gg][g] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int t = 4 * gg; t < 4 * gg + 4; t++) {
            if ((8 * v + t) % 2 == 0 && (8 * v + t) / 2 < LINES)
                prefetch_r16<PF, PREFETCH_BYTES, FAR>((const char*)p + 64 * ((8 * v + t) / 2));
            const __m512i u = code(t);
            for (int g = 0; g < G; g++) {
                int32_t a;
                std::memcpy(&a, xs[g][s].qs + 32 * v + 4 * t, 4);
                sv[gg][g] = _mm512_dpbusd_epi32(sv[gg][g], u, _mm512_set1_epi32(a));
            }
        }
    }
}

// ---- q3_K repacked (block_q3_K_r16) ----
// One row per int32 lane, 16 rows per register. Per vector v (weights 32 v .., half n = v / 4) and word t,
// the unsigned codes u = q + 4 (0..7) of 4 weights of 16 rows: ql[n][t]'s 2 bits at 2 (v % 4) by a shift and
// a mask, plus 4 by a masked byte add where bit v of qh[t] is set (vptestmb), each by vpdpbusd against the
// token's 4 activations broadcast; words 0-3 of a vector are its group 2 v (16 weights), words 4-7 group
// 2 v + 1. The two groups' sums (at most 16 x 7 x 127) go as an int16 pair per row through one vpdpwssd
// against the rows' pair of scales, and the offset through a second against the pair of -4 x the token's
// group sums (block_q8_K's bsums); one float multiply-add per token and super-block (d x d_x). Exact int32
// sums, so bit for bit the AVX2 tile's results. Up to 8 tokens share each unpacked word. kbench, one
// thread, 512 x 2048, Zen 4, ns per super-block row and token, AVX2 tile -> this one, one run: in cache
// 1 token 7.93 -> 4.18, 4 tokens 4.75 -> 2.17, 8 3.28 -> 2.28, 64 2.91 -> 2.31; from memory 6.88 -> 7.12,
// 3.87 -> 3.38, 3.54 -> 3.16, 2.99 -> 2.37 (with the loops over words and vectors not unrolled, the shifts
// by a count in a register, 1 token in cache 5.87; one token from memory with the whole block prefetched at
// the first vector 15.6, spread but to L1 only 14.9). Those figures are with each group's sum times its
// scale by vpmulld, less 4 x the group's activation sum; the vpdpwssd pairs since, in cache, two runs:
// 1 token 4.17 -> 3.77, 4 tokens 2.55 -> 1.94, 8 2.40 -> 1.95, 16 2.65 -> 2.12, 64 2.18 -> 1.87; from
// memory 1 token 8.13 -> 7.34, 4 tokens 2.98 -> 2.28, 64 2.25 -> 1.97.
struct TileQ3KR16 : R16SumsInRegisters<TileQ3KR16> {
    using Block = block_q3_K_r16;
    static constexpr bool PAIRS = false;
    static constexpr gemm_fn ref = &gemm_q3_K_r16_ref;
    static constexpr int GMAX = 8;
    static constexpr int LINES = (int)(sizeof(Block) + 63) / 64;

    template <int G, Prefetch PF>
    static void superblock(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const*,
                           __m512* acc) {
        constexpr int FAR = G >= 2 ? 12288 : 8192;  // (see above)
        const __m512i m3 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi8(4);
        __m512i isum[G];
        for (int g = 0; g < G; g++) isum[g] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            const int n = v / 4, j = v % 4;
            // dword lane r: (sc_2v, sc_2v + 1) of row r as int16
            const __m512i scp = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)p.sc[v]));
            __m512i sv[2][G];  // the sums of groups 2v, 2v + 1
            // (the block ahead to L2 8 KB ahead even for one token)
            vector_sums<G, PF, FAR, LINES>(&p, s, xs, v, [&](int t) __attribute__((always_inline)) {
                const __m512i ql = _mm512_loadu_si512(p.ql[n][t]), qh = _mm512_loadu_si512(p.qh[t]);
                // the low 2 bits, and 4 where bit v of qh is set
                const __m512i lo = _mm512_and_si512(j ? _mm512_srli_epi16(ql, 2 * j) : ql, m3);
                return _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, _mm512_set1_epi8((char)(1 << v))), lo, m4);
            }, sv);
            // both groups' sums (<= 16 x 7 x 127) as an int16 pair per row, by vpdpwssd against the pair of
            // scales; the offset as the pair of scales against the pair of -4 x the token's group sums
            for (int g = 0; g < G; g++) {
                const __m512i pair = _mm512_mask_blend_epi16(0xAAAAAAAA, sv[0][g], _mm512_slli_epi32(sv[1][g], 16));
                isum[g] = _mm512_dpwssd_epi32(isum[g], pair, scp);
                const int16_t* bs = xs[g][s].bsums + 2 * v;
                const uint32_t off = (uint16_t)(-4 * bs[0]) | (uint32_t)(uint16_t)(-4 * bs[1]) << 16;
                isum[g] = _mm512_dpwssd_epi32(isum[g], scp, _mm512_set1_epi32((int32_t)off));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p.d));
        for (int g = 0; g < G; g++)
            acc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g]), _mm512_mul_ps(d, _mm512_set1_ps(xs[g][s].d)), acc[g]);
    }
};

// ---- q2_K repacked (block_q2_K_r16) ----
// As the q3_K tile without the high bit: per vector v and word t the codes q (0..3) of 4 weights of 16 rows
// by a shift and a mask of qs[v / 4][t], each by vpdpbusd against the token's 4 activations broadcast; the
// two groups' sums of a vector (at most 16 x 3 x 127) as an int16 pair per row through vpdpwssd against the
// rows' pair of 4-bit scales, and the mins' share as the rows' pair of 4-bit mins against the token's pair
// of group sums (block_q8_K's bsums), a second int32 sum; per token and super-block d x d_x times the one
// and dmin x d_x times the other. Exact int32 sums. Up to 8 tokens share each unpacked word.
struct TileQ2KR16 : R16SumsInRegisters<TileQ2KR16> {
    using Block = block_q2_K_r16;
    static constexpr bool PAIRS = false;
    static constexpr gemm_fn ref = &gemm_q2_K_r16_ref;
    static constexpr int GMAX = 8;
    static constexpr int LINES = (int)(sizeof(Block) + 63) / 64;

    // int16 lane 2r + i: the byte of group 2v + i of row r (from the 32 bytes sc[2v], sc[2v + 1])
    __attribute__((always_inline)) static __m512i pairs(const Block& p, int v, __m512i interleave) {
        return _mm512_permutexvar_epi16(interleave, _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p.sc[2 * v])));
    }
    template <int G, Prefetch PF>
    static void superblock(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const*,
                           __m512* acc) {
        constexpr int FAR = G >= 2 ? 12288 : 8192;  // (as the q3_K tile)
        const __m512i m3 = _mm512_set1_epi8(3);
        const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                    23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        __m512i isum[G];
        for (int g = 0; g < G; g++) isum[g] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            const int n = v / 4, j = v % 4;
            const __m512i scp = _mm512_and_si512(pairs(p, v, interleave), _mm512_set1_epi16(0x0f));
            __m512i sv[2][G];  // the sums of groups 2v, 2v + 1
            vector_sums<G, PF, FAR, LINES>(&p, s, xs, v, [&](int t) __attribute__((always_inline)) {
                const __m512i q = _mm512_loadu_si512(p.qs[n][t]);
                return _mm512_and_si512(j ? _mm512_srli_epi16(q, 2 * j) : q, m3);
            }, sv);
            for (int g = 0; g < G; g++) {
                const __m512i pair = _mm512_mask_blend_epi16(0xAAAAAAAA, sv[0][g], _mm512_slli_epi32(sv[1][g], 16));
                isum[g] = _mm512_dpwssd_epi32(isum[g], pair, scp);
            }
        }
        // the mins' share after the products (its sums in registers of their own would leave room for 6 tokens)
        __m512i msum[G];
        for (int g = 0; g < G; g++) msum[g] = _mm512_setzero_si512();
        for (int v = 0; v < 8; v++) {
            const __m512i mnp = _mm512_srli_epi16(pairs(p, v, interleave), 4);
            for (int g = 0; g < G; g++) {
                int32_t bp;
                std::memcpy(&bp, xs[g][s].bsums + 2 * v, 4);
                msum[g] = _mm512_dpwssd_epi32(msum[g], mnp, _mm512_set1_epi32(bp));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p.d));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p.dmin));
        for (int g = 0; g < G; g++) {
            const __m512 dx = _mm512_set1_ps(xs[g][s].d);
            acc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g]), _mm512_mul_ps(d, dx), acc[g]);
            acc[g] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[g]), _mm512_mul_ps(dmin, dx), acc[g]);
        }
    }
};

// ---- the low-bit super-block types on the file's layout, for many tokens ----
// AVX2's lane tiles (kernel_low256_avx2.h's KindLowV: a row unpacked once for every token group, each lane a
// group of 16 weights) with 256-bit vpdpbusd (AVX-512 VL + VNNI) as the dot product: one instruction per 4
// byte products and token, where vpmaddubsw chains take three (product, int16 add, and a widening vpmaddwd per
// chain). The lane sums start at the offset's correction, as AVX2's.
struct DotVnni256 {
    using Sum = __m256i;
    static constexpr int chain(int) { return 1 << 20; }
    static __m256i start(__m256i v) { return v; }
    static __m256i dot(__m256i s, __m256i q, __m256i x) { return _mm256_dpbusd_epi32(s, q, x); }
    static __m256i end(__m256i, __m256i s) { return s; }
};

// From FROM tokens the vpdpbusd lane tiles, below them the table's product as it was (AVX2's tiles, or the VBMI
// kernels of the IQ2 types).
template <class Low, int FROM>
struct LowLanesVnni {
    static inline gemm_fn few = nullptr;
    static void gemm(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
                     int64_t n0, int64_t n1) {
        if (M >= FROM) return gemm_kquant_tiles<KindLowV<DotVnni256, Low>>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
        few(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
    }
};
template <class Low, int FROM>
void use_lanes_vnni(gemm_fn& entry) {
    LowLanesVnni<Low, FROM>::few = entry;
    entry = LowLanesVnni<Low, FROM>::gemm;
}

// ---- q5_K, many tokens: each thread's 16-row groups expanded once per call to codes as bytes ----
// The file-layout tile (KindQ45K<true>) unpacks a row's nibbles and fifth bits per group of 12 tokens and folds
// each token pair's sub-block lanes before its float work: ~2 ns per super-block row and token at 64 tokens
// in cache against 1.4 for the 4-bit code tiles below (kbench, Zen 4). Repacking q5_K at load lost at one
// token (bench/NOTES.md, 2026-12-06), so for a product over many tokens (a prefill, the experts of a long
// prompt) each thread expands its rows here, 16 at a time: every weight as a byte 0..31, laid out as the r16
// tiles read them (4 weights of 16 rows per 64-byte vector), the scales and the mins' pairs as bytes per
// row, d and dmin as floats (4480 bytes per super-block of 16 rows; a 2048-wide panel is 35 KB and stays
// in L2 while every token group reads it). Per group of 32 weights and token: 8 vpdpbusd against the
// token's 4 activations broadcast, one vpmulld by the rows' scales; the mins by 4 vpdpwssd per super-block
// against the tokens' sub-block sums; all of it exact in int32 (at most 8 x 63 x 32 x 31 x 127 per
// super-block), then d x d_x and dmin x d_x in float once per super-block.
struct alignas(64) Q5Bytes16 {
    uint8_t q[8][8][16][4];  // [sub-block j][word t][row][i]: the row's weight 32 j + 4 t + i, 0..31
    uint8_t sc[8][16];       // [sub-block][row]
    uint8_t mn[4][16][2];    // [chunk c][row][the mins of sub-blocks 2c, 2c + 1]
    float d[16], dmin[16];
};
static_assert(sizeof(Q5Bytes16) == 4480, "Q5Bytes16 is 4480 bytes");

// Rows r (low 256 bits) and r + 8 (high) of a 16-row group: 8 such vectors (r = 0..7), each the two rows'
// 8 words of one sub-block, to 8 vectors of one word of all 16 rows (dst[t], rows in dword order): the
// 8 x 8 dword transpose within each 256-bit half.
inline void transpose_words(const __m512i* z, __m512i* dst) {
    __m512i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // u[k] (k < 4), 128-bit lane L: rows 0-3 (L = 0, 1) or 8-11 (L = 2, 3) of word k + 4 (L % 2); u[4 + k]: rows 4-7 / 12-15
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int k = 0; k < 4; k++) {
        dst[k] = _mm512_permutex2var_epi64(u[k], lo, u[4 + k]);
        dst[4 + k] = _mm512_permutex2var_epi64(u[k], hi, u[4 + k]);
    }
}

// Super-block s of the 16 rows at rows[0 .. 15] (block_q5_K arrays) into out.
inline void expand_q5k16(const uint8_t* const* rows, int64_t s, Q5Bytes16& out) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
    __m512i qh[8];
    const block_q5_K* row[16];
    for (int r = 0; r < 16; r++) row[r] = (const block_q5_K*)rows[r] + s;
    for (int r = 0; r < 8; r++)
        qh[r] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)row[r]->qh)),
                                   _mm256_loadu_si256((const __m256i*)row[r + 8]->qh), 1);
    for (int c = 0; c < 4; c++) {
        __m512i zl[8], zh[8];
        for (int r = 0; r < 8; r++) {
            const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(row[r]->qs + 32 * c))),
                                                 _mm256_loadu_si256((const __m256i*)(row[r + 8]->qs + 32 * c)), 1);
            // bit j of each qh byte to bit 4 (j = 2c, 2c + 1), within bytes: the 16-bit shifts' spill is masked off
            const int j0 = 2 * c, j1 = 2 * c + 1;
            const __m512i h0 = j0 <= 4 ? _mm512_slli_epi16(qh[r], 4 - j0) : _mm512_srli_epi16(qh[r], j0 - 4);
            const __m512i h1 = j1 <= 4 ? _mm512_slli_epi16(qh[r], 4 - j1) : _mm512_srli_epi16(qh[r], j1 - 4);
            zl[r] = _mm512_ternarylogic_epi32(_mm512_and_si512(q, lo4), h0, bit4, 0xf8);  // a | (b & c)
            zh[r] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(q, 4), lo4), h1, bit4, 0xf8);
        }
        __m512i t[8];
        transpose_words(zl, t);
        for (int k = 0; k < 8; k++) _mm512_store_si512((void*)out.q[2 * c][k], t[k]);
        transpose_words(zh, t);
        for (int k = 0; k < 8; k++) _mm512_store_si512((void*)out.q[2 * c + 1][k], t[k]);
    }
    for (int r = 0; r < 16; r++) {
        alignas(16) uint8_t h[16];  // the 8 scales, then the 8 mins
        _mm_store_si128((__m128i*)h, k4_header(row[r]->scales));
        for (int j = 0; j < 8; j++) out.sc[j][r] = h[j];
        for (int c = 0; c < 4; c++) {
            out.mn[c][r][0] = h[8 + 2 * c];
            out.mn[c][r][1] = h[9 + 2 * c];
        }
        out.d[r] = half(row[r]->d);
        out.dmin[r] = half(row[r]->dmin);
    }
}

// acc[g] (lane r) += super-block s's share of row r's dot with token g (bsp[g]: the token's sub-block sums as
// int16 pairs, 4 per super-block).
template <int G>
inline void q5bytes_superblock(const Q5Bytes16& p, int64_t s, const block_q8_K* const* xs, const int32_t* const* bsp,
                               __m512* acc) {
    __m512i isum[G];
    for (int g = 0; g < G; g++) isum[g] = _mm512_setzero_si512();
    for (int j = 0; j < 8; j++) {
        __m512i sj[G];
        for (int g = 0; g < G; g++) sj[g] = _mm512_setzero_si512();
        for (int t = 0; t < 8; t++) {
            const __m512i w = _mm512_load_si512((const void*)p.q[j][t]);
            for (int g = 0; g < G; g++) {
                int32_t a;
                std::memcpy(&a, xs[g][s].qs + 32 * j + 4 * t, 4);
                sj[g] = _mm512_dpbusd_epi32(sj[g], w, _mm512_set1_epi32(a));
            }
        }
        const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i*)p.sc[j]));
        for (int g = 0; g < G; g++) isum[g] = _mm512_add_epi32(isum[g], _mm512_mullo_epi32(sj[g], sc));
    }
    __m512i mi[G];
    for (int g = 0; g < G; g++) mi[g] = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        const __m512i mn = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i*)p.mn[c]));
        for (int g = 0; g < G; g++) mi[g] = _mm512_dpwssd_epi32(mi[g], mn, _mm512_set1_epi32(bsp[g][4 * s + c]));
    }
    const __m512 d = _mm512_load_ps(p.d), dmin = _mm512_load_ps(p.dmin);
    for (int g = 0; g < G; g++) {
        const __m512 dx = _mm512_set1_ps(xs[g][s].d);
        acc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g]), _mm512_mul_ps(d, dx), acc[g]);
        acc[g] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi[g]), _mm512_mul_ps(dmin, dx), acc[g]);
    }
}

// From this many tokens the expansion pays (kbench, one thread, 512 x 2048 in cache, Zen 4: bench/NOTES.md,
// 2026-12-07 (night)); fewer take the file-layout tiles.
constexpr int Q5_BYTES_FROM = 16;
constexpr int Q5_BYTES_G = 8;  // tokens per group (24 accumulators in registers)

// Rows run in the groups of 16 that the matrix's rows fall into (0-15, 16-31, ...); a group that [n0, n1)
// covers in part is expanded with its other lanes repeating a row of the range and stored masked. So every
// row is computed the same way wherever its range starts and however the rows are split among threads.
void gemm_q5k(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
              int64_t n0, int64_t n1) {
    if (M < Q5_BYTES_FROM || n1 <= n0) return gemm_q45k<true>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
    const int64_t nsb = K / QK_K;
    // (thread-local vectors of this file's own types: tests/test_isa_objects.py)
    thread_local std::vector<Q5Bytes16> panel;
    thread_local std::vector<BsumPair> pairs;
    panel.resize((size_t)nsb);
    pairs.resize((size_t)M * nsb * 4);
    int32_t* const bs = &pairs[0].v;
    subblock_sum_pairs(X, xrb, M, nsb, bs);
    const int n_groups = (M + Q5_BYTES_G - 1) / Q5_BYTES_G;
    // the 16 rows of group g16 within [n0, n1) (the lanes outside repeat its first or last row), and the mask
    // of the lanes to store
    auto group_rows = [&](int64_t g16, const uint8_t** rows) {
        const int64_t lo = std::max(n0, 16 * g16), hi = std::min(n1, 16 * g16 + 16);
        for (int r = 0; r < 16; r++) rows[r] = W + (size_t)std::clamp(16 * g16 + r, lo, hi - 1) * wrb;
        return (__mmask16)(((1u << (hi - lo)) - 1) << (lo - 16 * g16));
    };
    const uint8_t* next[16];
    __mmask16 next_keep = group_rows(n0 / 16, next);
    for (int64_t g16 = n0 / 16; 16 * g16 < n1; g16++) {
        const uint8_t* rows[16];
        std::copy(next, next + 16, rows);
        const __mmask16 keep = next_keep;
        const bool more = 16 * (g16 + 1) < n1;
        if (more) next_keep = group_rows(g16 + 1, next);
        for (int64_t s = 0; s < nsb; s++) expand_q5k16(rows, s, panel[s]);
        for (int tg = 0; tg < n_groups; tg++) {  // groups of equal size
            const int i0 = tg * M / n_groups, i1 = (tg + 1) * M / n_groups;
            const block_q8_K* xs[Q5_BYTES_G];
            const int32_t* bp[Q5_BYTES_G];
            for (int i = i0; i < i1; i++) {
                xs[i - i0] = (const block_q8_K*)(X + i * xrb);
                bp[i - i0] = bs + (size_t)i * nsb * 4;
            }
            with_tokens<Q5_BYTES_G>(i1 - i0, [&](auto gc) {
                constexpr int G = decltype(gc)::value;
                __m512 acc[G];
                for (int g = 0; g < G; g++) acc[g] = _mm512_setzero_ps();
                for (int64_t s = 0; s < nsb; s++) {
                    // the next group's super-block s to L2 while the first token group reads this one's: 16
                    // rows are 16 streams, too many for the hardware prefetcher (from memory, 16 tokens ran
                    // at 2.9 ns per super-block row and token without this, 2.3 on the file's layout)
                    if (more && tg == 0)
                        for (int r = 0; r < 16; r++) {
                            const char* b = (const char*)next[r] + s * (int64_t)sizeof(block_q5_K);
                            for (int off : {0, 64, 128, (int)sizeof(block_q5_K) - 1}) _mm_prefetch(b + off, _MM_HINT_T1);
                        }
                    q5bytes_superblock<G>(panel[s], s, xs, bp, acc);
                }
                for (int g = 0; g < G; g++) _mm512_mask_storeu_ps(Y + (i0 + g) * ldy + 16 * g16, keep, acc[g]);
            });
        }
    }
}

Kernels make_table() {
    Kernels k = *kernels_avx2();
    k.isa = "avx512";  // (family stays "avx2": the model operators and the rest of the table are AVX2's)
    // One token: one weight row per tile (on this project's AMD EPYC VM a single-row tile streamed
    // Q6_K weights at 34-35 GB/s against 14-19 with 2 or 4 rows); two or more: the lane-layout tiles.
    k.gemm_q4_K = gemm_q45k<false>;
    k.gemm_q5_K = gemm_q5k;
    k.gemm_q6_K = gemm_q6k;
    k.gemm_q4_K_r16 = gemm_r16<TileR16>;
    // (q5_K and q6_K: gemm_q45k and gemm_q6k stream the file's layout; AVX-512 tiles for their repacked layouts
    // were faster in cache and from 4-8 tokens but slower from memory at one token, and the model's one-token
    // forwards lost 12-17%: bench/NOTES.md, 2026-12-06, "q5_K and q6_K repacked on AVX-512")
    k.gemm_q5_K_r16 = nullptr;
    k.gemm_q6_K_r16 = nullptr;
    k.gemm_q3_K_r16 = gemm_r16<TileQ3KR16>;
    k.gemm_q2_K_r16 = gemm_r16<TileQ2KR16>;
    k.gemm_iq4_xs_r16 = gemm_r16<TileCodes4R16<CodesIQ4XS>>;
    k.gemm_iq3_xxs_r16 = gemm_r16<TileCodes4R16<CodesIQ3XXS>>;
    k.gemm_iq3_s_r16 = gemm_r16<TileCodes4R16<CodesIQ3S>>;
    k.gemm_iq4_nl_r16 = gemm_r16<TileNL4R16<BlocksIQ4NL>>;
    k.gemm_mxfp4_r16 = gemm_r16<TileNL4R16<BlocksMXFP4>>;
    // Q4_0 (more unpacking per byte) gains from two rows already at 4 tokens (1.7x the AVX2 tile
    // against 1.3x with one row, same run); Q8_0 at 4 tokens streams 25 GB/s with one row, 15 with two.
    k.gemm_q4_0 = gemm_q8a<UnpackQ4_0, 4>;
    k.gemm_q8_0 = gemm_q8a<UnpackQ8_0, 16>;
    // Q5_0, IQ4_NL, MXFP4, Q4_1 and Q5_1 the same way (their own unpacking: u = q + 16, the values + 128, or
    // q and the mins)
    k.gemm_q5_0 = gemm_q8a<UnpackQ5_0, 4>;
    k.gemm_iq4_nl = gemm_q8a<UnpackIQ4NL, 4>;
    k.gemm_mxfp4 = gemm_q8a<UnpackMXFP4, 4>;
    k.gemm_q4_1 = gemm_q8a<UnpackQ41<false>, 4>;
    k.gemm_q5_1 = gemm_q8a<UnpackQ41<true>, 4>;
    // iq2_xxs / iq2_xs / iq2_s below the lane tiles' thresholds (next): the VBMI kernels where the CPU has VBMI and
    // BITALG (else AVX2's)
    if (cpu_has_avx512vbmi_bitalg()) add_avx512_vbmi(k);
    // The types that stay on the file's layout here: the vpdpbusd lane tiles from where they beat the VBMI kernels
    // (IQ2) and AVX2's register tiles (IQ1). kbench, one thread, 512 x 2048 in cache, ns per super-block row and
    // token at 4 / 5 / 6 / 7 / 8 tokens, the table's product before -> the lane tiles (taken from the threshold given
    // to each type below): IQ2_XXS 4.57 / 5.24 / 4.92 /
    // 4.69 / 4.51 -> 6.20 / 5.98 / 5.24 / 4.75 / 4.38; IQ2_XS 4.74 / 5.57 / 5.19 / 4.90 / 4.74 -> 6.08 / 5.85 /
    // 5.15 / 4.68 / 4.32; IQ2_S 5.34 / 6.45 / 6.06 / 5.54 -> 6.40 / 6.04 / 5.30 / 4.82; IQ1_S 5.88 / 8.31 / 7.26 ->
    // 6.41 / 6.15 / 5.44; IQ1_M 7.32 / 9.66 -> 6.62 / 6.23. At 64 tokens all five 3.67-3.93 -> 2.58-2.63.
    use_lanes_vnni<LowIQ2XXS, 8>(k.gemm_iq2_xxs);
    use_lanes_vnni<LowIQ2XS, 6>(k.gemm_iq2_xs);
    use_lanes_vnni<LowIQ2S, 5>(k.gemm_iq2_s);
    use_lanes_vnni<LowIQ1S, 5>(k.gemm_iq1_s);
    use_lanes_vnni<LowIQ1M, 4>(k.gemm_iq1_m);
    // The types this table repacks, on the file's layout (a file larger than half the free memory, --repack off,
    // rows that are not whole groups): the same, at 2 / 3 / 4 / 16 / 64 tokens before -> after: q2_K 6.40 / 5.65 /
    // 5.27 / 3.79 / 3.52 -> 4.75 / 3.78 / 3.32 / 2.67 / 2.48; q3_K 6.80 / 5.68 / 4.98 / 4.00 / 3.59 -> 5.55 / 4.21 /
    // 3.59 / 2.71 / 2.42; iq4_xs 8.75 / 6.84 / 6.10 / 5.13 / 4.61 -> 7.48 / 6.07 / 5.19 / 3.74 / 3.32; iq3_xxs
    // 13.27 (at 2 the register tiles stay) / 9.97 / 8.43 / 5.06 / 3.95 -> 9.73 / 7.77 / 3.76 / 2.67; iq3_s 18.86 /
    // 13.62 / 11.31 / 5.40 / 3.90 -> 13.20 / 10.38 / 4.36 / 2.84.
    use_lanes_vnni<LowQ2K, 2>(k.gemm_q2_K);
    use_lanes_vnni<LowQ3K, 2>(k.gemm_q3_K);
    use_lanes_vnni<LowIQ4XS, 2>(k.gemm_iq4_xs);
    use_lanes_vnni<LowIQ3XXS, 3>(k.gemm_iq3_xxs);
    use_lanes_vnni<LowIQ3S, 3>(k.gemm_iq3_s);
    return k;
}

}  // namespace

const Kernels* kernels_avx512() {
    static const Kernels table = make_table();
    return &table;
}

}  // namespace clover
