// The q4_K, q5_K and q6_K lane-layout tiles on 256-bit registers, for two or more tokens: shared by
// kernels_avxvnni.cpp (AVX-VNNI's vpdpbusd) and kernels_avx2.cpp (plain AVX2: vpmaddubsw sums, widened
// to int32 by vpmaddwd). Each file includes this with its own target flags, so everything stays in an
// anonymous namespace (kernel_tiles.h says why). Results equal the scalar kernels' up to float
// summation order (integer sums are exact), and the two Dots give the same integer sums.
//
// Lane L of every vector holds sub-block L (32 weights, its own 6-bit scale and min); vector c
// (0..7) holds weights 4c .. 4c + 3 of each, so one Dot::dot per token and vector adds 4 products to
// each sub-block's sum and a super-block's eight vectors finish all eight sums. The scales are applied
// once per super-block and token, in float: acc += sum * (d * scale_L) * d_x - dmin * min_L * d_x *
// (sum of x over sub-block L). The weights come out of the file's layout (sub-blocks 2i and 2i + 1 in
// the low and high nibbles of qs[32i .. 32i + 31]) by a 4 x 8 dword transpose of the four 32-byte
// chunks, a dword permute per vector and a per-lane nibble shift; the activations are reordered to
// match once per call and thread (an 8 x 8 dword transpose per super-block).
//
// A Dot is: Sum, the type of a chain of products; start(v), a chain that will add to the int32 lanes v;
// dot(s, q, x), the chain plus the 4-byte dot products of unsigned q and signed x in each int32 lane;
// end(v, s), v with the chain added; chain(qmax), how many vectors of weights <= qmax one chain may
// take (q8_K activations are within +-127).
#pragma once

#if !defined(__AVX2__) || !defined(__F16C__) || !defined(__FMA__)
#error "kernel_lanes256.h needs -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernel_tiles.h"

namespace clover {
namespace {

// Super-block b of a weight row, unpacked, for a tile: stored by an earlier token group (LOAD), or
// unpacked now into the store (STORE) or a local (RAW).
template <class Kind, Rows R, class Block>
const typename Kind::U* row_block(const Block* w, typename Kind::U* stored, typename Kind::U* local) {
    if constexpr (R == Rows::LOAD) {
        return stored;
    } else {
        prefetch_block(w, sizeof(Block));
        typename Kind::U* dst = R == Rows::STORE ? stored : local;
        Kind::unpack(w, dst);
        return dst;
    }
}

// Row partials reduced eight rows at a time (the tiles' finish, as kernels_avx512.cpp's): a[0..7] are
// eight rows' 8-float partial sums of one token -> their eight sums, stored to y[0 .. rows). Every
// row's lanes are added in the same order whatever its position in the group.
inline void finish_rows8(const __m256* a, int rows, float* y) {
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    const __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
    if (rows == 8) {
        _mm256_storeu_ps(y, s);
    } else {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(rows), lane), s);
    }
}

// Rows of the tiles below finish in groups of eight (kernel_tiles.h): a row's result per token (one
// token per activation entry) is one 8-float vector of partial sums.
struct GroupedRows8 {
    static constexpr int TOKENS_PER_ENTRY = 1;
    using Part = __m256;
    static constexpr int ROWS = 8;
    static void finish(const Part* part, int rn, int rows, float* Y, int64_t ldy) {
        for (int t = 0; t < rn; t++) finish_rows8(part + t * ROWS, rows, Y + t * ldy);
    }
};

struct alignas(32) XK4V {  // one q8_K super-block of one token, in lane order
    int8_t q[QK_K];        // q[32c + 4L + i] = x[32L + 4c + i]
    float bm[8];           // lane L: d * (sum of x over sub-block L)
    float d[8];            // the token's scale in every lane
};

// q4_K, and q5_K (FIVE: the same layout with a fifth bit per weight in qh; bit j of qh[l] belongs to
// weight l of sub-block j, so lane L of vector c takes bit L of qh[4c .. 4c + 3]).
template <class Dot, bool FIVE>
struct KindQ45KV : GroupedRows8 {
    using Block = std::conditional_t<FIVE, block_q5_K, block_q4_K>;
    static constexpr int QMAX = FIVE ? 31 : 15;  // the largest unpacked weight
    using X = XK4V;
    static constexpr int GROUP = 6, SLOTS = GROUP;  // tokens per tile: 2 x 6 accumulators + operands in 16 registers
    static void reorder(const block_q8_K* const* x, X* out) {
        const block_q8_K* b = x[0];
        int32_t src[64], dst[64];
        std::memcpy(src, b->qs, QK_K);
        for (int c = 0; c < 8; c++)
            for (int L = 0; L < 8; L++) dst[8 * c + L] = src[8 * L + c];
        std::memcpy(out->q, dst, QK_K);
        for (int L = 0; L < 8; L++) {
            out->bm[L] = b->d * (float)(b->bsums[2 * L] + b->bsums[2 * L + 1]);
            out->d[L] = b->d;
        }
    }
    struct alignas(32) U {  // a super-block unpacked: the eight lane-order vectors and the scale vectors
        __m256i q[8];
        __m256 sd, mins;
    };
    static void unpack(const Block* w, U* u) {
        const __m256i a = _mm256_loadu_si256((const __m256i*)w->qs);
        const __m256i b = _mm256_loadu_si256((const __m256i*)(w->qs + 32));
        const __m256i c = _mm256_loadu_si256((const __m256i*)(w->qs + 64));
        const __m256i d = _mm256_loadu_si256((const __m256i*)(w->qs + 96));
        // r_k, 128-bit half h: dword c = k + 4h of the chunks a, b, c, d
        const __m256i ab_lo = _mm256_unpacklo_epi32(a, b), ab_hi = _mm256_unpackhi_epi32(a, b);
        const __m256i cd_lo = _mm256_unpacklo_epi32(c, d), cd_hi = _mm256_unpackhi_epi32(c, d);
        const __m256i r[4] = {_mm256_unpacklo_epi64(ab_lo, cd_lo), _mm256_unpackhi_epi64(ab_lo, cd_lo),
                              _mm256_unpacklo_epi64(ab_hi, cd_hi), _mm256_unpackhi_epi64(ab_hi, cd_hi)};
        // lanes 2i and 2i + 1 take chunk i's dword; even lanes its low nibbles, odd lanes its high ones
        const __m256i lo_half = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
        const __m256i hi_half = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
        const __m256i shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4), mask = _mm256_set1_epi32(0x0f0f0f0f);
        for (int k = 0; k < 4; k++) {
            u->q[k] = _mm256_and_si256(_mm256_srlv_epi32(_mm256_permutevar8x32_epi32(r[k], lo_half), shift), mask);
            u->q[k + 4] = _mm256_and_si256(_mm256_srlv_epi32(_mm256_permutevar8x32_epi32(r[k], hi_half), shift), mask);
        }
        if constexpr (FIVE) {
            const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), one = _mm256_set1_epi32(0x01010101);
            int32_t qh[8];
            std::memcpy(qh, w->qh, sizeof qh);
            for (int c = 0; c < 8; c++)
                u->q[c] = _mm256_or_si256(
                    u->q[c], _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(qh[c]), lane), one), 4));
        }
        const __m128i hdr = k4_header(w->scales);  // bytes 0-7 the scales, 8-15 the mins
        u->sd = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hdr)), _mm256_set1_ps(_cvtsh_ss(w->d)));
        u->mins = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hdr, 8))),
                                _mm256_set1_ps(-_cvtsh_ss(w->dmin)));
    }
    // One weight row against RN tokens (token t: x[t * xs + b]) -> part[t * ROWS].
    template <int RN, Rows R>
    static void tile(const uint8_t* row, U* u, const X* x, int64_t nb, Part* part, const KSpan& ks) {
        const int64_t xs = ks.stride;  // between one token's (entry's) activations and the next's
        constexpr int CHAIN = std::min(8, Dot::chain(QMAX));
        const Block* w = (const Block*)row;
        U local;
        __m256 acc[RN];
        for (int t = 0; t < RN; t++) acc[t] = ks.first ? _mm256_setzero_ps() : part[t * ROWS];
        for (int64_t b = 0; b < nb; b++, w++) {
            const U* ub = row_block<KindQ45KV, R>(w, u + b, &local);
            __m256i v[RN];
            for (int t = 0; t < RN; t++) v[t] = _mm256_setzero_si256();
            for (int c0 = 0; c0 < 8; c0 += CHAIN) {
                typename Dot::Sum s[RN];
                for (int t = 0; t < RN; t++) s[t] = Dot::start(v[t]);
                for (int c = c0; c < c0 + CHAIN; c++) {
                    const __m256i q = _mm256_load_si256(&ub->q[c]);
                    for (int t = 0; t < RN; t++)
                        s[t] = Dot::dot(s[t], q, _mm256_load_si256((const __m256i*)(x[t * xs + b].q + 32 * c)));
                }
                for (int t = 0; t < RN; t++) v[t] = Dot::end(v[t], s[t]);
            }
            for (int t = 0; t < RN; t++) {
                const X& xt = x[t * xs + b];
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v[t]), _mm256_mul_ps(ub->sd, _mm256_load_ps(xt.d)), acc[t]);
                acc[t] = _mm256_fmadd_ps(ub->mins, _mm256_load_ps(xt.bm), acc[t]);
            }
        }
        for (int t = 0; t < RN; t++) part[t * ROWS] = acc[t];
    }
};


// ---- q6_K: 16 sub-blocks of 16 weights with int8 scales. Lane L holds sub-block L in the first four
// vectors (c = 0..3: its weights 4c .. 4c + 3) and sub-block 8 + L in the other four, so two lane sums
// per token, each with its own scale vector; the lane sums start at -32 x the token's sum over the
// sub-block (the weights are stored + 32). The unpacking follows kernels_avx512.cpp's q6_K vec(), its
// 16-lane dword permutes split into 8-lane halves (two permutes and a blend where it reads 64 bytes). ----

struct alignas(32) XK6V {  // one q8_K super-block of one token, in lane order
    int8_t q[QK_K];        // q[32 (4h + c) + 4L + i] = x[16 (8h + L) + 4c + i]
    int32_t bs32[16];      // lanes of half h: -32 * (sum of x over sub-block 8h + L)
    float d[8];
};

template <class Dot>
struct KindQ6KV : GroupedRows8 {
    using X = XK6V;
    static constexpr int GROUP = 4, SLOTS = GROUP;  // tokens per tile: 3 x 4 accumulators + operands in 16 registers
    static void reorder(const block_q8_K* const* x, X* out) {
        const block_q8_K* b = x[0];
        int32_t src[64], dst[64];  // src dword 4s + c: x[16s + 4c .. + 3] of sub-block s
        std::memcpy(src, b->qs, QK_K);
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 4; c++)
                for (int L = 0; L < 8; L++) dst[8 * (4 * h + c) + L] = src[4 * (8 * h + L) + c];
        std::memcpy(out->q, dst, QK_K);
        for (int s = 0; s < 16; s++) out->bs32[s] = -32 * b->bsums[s];
        for (int L = 0; L < 8; L++) out->d[L] = b->d;
    }
    struct alignas(32) U {
        __m256i q[8];
        __m256 sd[2];
    };
    static void unpack(const block_q6_K* w, U* u) {
        __m256i ql[4], qh[2];
        for (int i = 0; i < 4; i++) ql[i] = _mm256_loadu_si256((const __m256i*)(w->ql + 32 * i));
        for (int i = 0; i < 2; i++) qh[i] = _mm256_loadu_si256((const __m256i*)(w->qh + 32 * i));
        const __m256i li = _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12);
        const __m256i lshift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
        const __m256i hi = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
        const __m256i hshift = _mm256_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6);
        const __m256i m4 = _mm256_set1_epi32(0x0f0f0f0f), m2 = _mm256_set1_epi32(0x30303030);
        for (int h = 0; h < 2; h++)  // sub-blocks 8h .. 8h + 7: ql[64h .. 64h + 63], qh[32h .. 32h + 31]
            for (int c = 0; c < 4; c++) {
                const __m256i cc = _mm256_set1_epi32(c);
                // li + c: dwords of ql[64h .. 64h + 31] in lanes 0, 1, 4, 5, of the next 32 bytes in
                // lanes 2, 3, 6, 7 (vpermd reads index bits 2:0 only)
                const __m256i idx = _mm256_add_epi32(li, cc);
                const __m256i l = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(ql[2 * h], idx),
                                                     _mm256_permutevar8x32_epi32(ql[2 * h + 1], idx), 0xCC);
                const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(l, lshift), m4);
                const __m256i up = _mm256_slli_epi32(
                    _mm256_srlv_epi32(_mm256_permutevar8x32_epi32(qh[h], _mm256_add_epi32(hi, cc)), hshift), 4);
                u->q[4 * h + c] = _mm256_or_si256(lo, _mm256_and_si256(up, m2));
            }
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(w->d));
        for (int h = 0; h < 2; h++)
            u->sd[h] = _mm256_mul_ps(
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(w->scales + 8 * h)))), d);
    }
    template <int RN, Rows R>
    static void tile(const uint8_t* row, U* u, const X* x, int64_t nb, Part* part, const KSpan& ks) {
        const int64_t xs = ks.stride;  // between one token's (entry's) activations and the next's
        constexpr int CHAIN = std::min(4, Dot::chain(63));
        const block_q6_K* w = (const block_q6_K*)row;
        U local;
        __m256 acc[RN];
        for (int t = 0; t < RN; t++) acc[t] = ks.first ? _mm256_setzero_ps() : part[t * ROWS];
        for (int64_t b = 0; b < nb; b++, w++) {
            const U* ub = row_block<KindQ6KV, R>(w, u + b, &local);
            for (int h = 0; h < 2; h++) {
                __m256i v[RN];
                for (int t = 0; t < RN; t++) v[t] = _mm256_load_si256((const __m256i*)(x[t * xs + b].bs32 + 8 * h));
                for (int c0 = 0; c0 < 4; c0 += CHAIN) {
                    typename Dot::Sum s[RN];
                    for (int t = 0; t < RN; t++) s[t] = Dot::start(v[t]);
                    for (int c = c0; c < c0 + CHAIN; c++) {
                        const __m256i q = _mm256_load_si256(&ub->q[4 * h + c]);
                        for (int t = 0; t < RN; t++)
                            s[t] = Dot::dot(s[t], q,
                                            _mm256_load_si256((const __m256i*)(x[t * xs + b].q + 32 * (4 * h + c))));
                    }
                    for (int t = 0; t < RN; t++) v[t] = Dot::end(v[t], s[t]);
                }
                for (int t = 0; t < RN; t++)
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v[t]),
                                             _mm256_mul_ps(ub->sd[h], _mm256_load_ps(x[t * xs + b].d)), acc[t]);
            }
        }
        for (int t = 0; t < RN; t++) part[t * ROWS] = acc[t];
    }
};

}  // namespace
}  // namespace clover
