// The driver of the q4_K products in the repacked layout (block_q4_K_r16: 16 rows per group, one row per
// lane), shared by kernels_avx512.cpp (16 rows per register), kernel_r16_256.h's tile for kernels_avx2.cpp
// and kernels_avxvnni.cpp (8 rows per register, a group in two halves) and kernels_neon.cpp's dot-product
// build (4 rows per register). Each includes this with its own target flags, so everything stays in an
// anonymous namespace (kernel_tiles.h says why).
//
// A Tile is: GMAX, the most tokens that share each weight load; rows<G>(P, nsb, xs, bsp, y, ldy), every
// super-block of the 16 rows at P for G tokens, results to y + g * ldy; step<G>(p, s, xs, bsp, acc,
// first), super-block s alone for G tokens, acc[16 g + r] += its share of row r's dot with token g
// (first: the panel's first group reads p, so it prefetches the weights ahead). xs[g] are the tokens'
// q8_K rows; bsp[g][4 s + c] their sub-block sums of chunk c as int16 pairs (2c, 2c + 1).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "formats.h"
#include "kernel_tiles.h"
#include "kernels.h"

namespace clover {
namespace {

// Where a tile prefetches the weights ahead of its loads: while every token of the call is in one group
// (the stream is read once), to L1 NEAR bytes ahead, and to L2 FAR bytes ahead where FAR > 0; with several
// groups taking each super-block in turn, whose 8+ tokens' activations need L1, only to L2 (FAR, or NEAR
// where FAR is 0) (from memory, one thread, 512 x 2048, AVX-512: 8 tokens 14.9 -> 12.8 ns per super-block
// row, 16 tokens 26.1 -> 24.0; L2 at 1 and 4 tokens cost 3-5%).
enum class Prefetch { NONE, L1, L2 };
template <Prefetch PF, int NEAR, int FAR>
inline void prefetch_r16(const void* p) {
    if (PF == Prefetch::L1) {
        __builtin_prefetch((const char*)p + NEAR, 0, 3);
        if (FAR > 0) __builtin_prefetch((const char*)p + FAR, 0, 2);
    }
    if (PF == Prefetch::L2) __builtin_prefetch((const char*)p + (FAR > 0 ? FAR : NEAR), 0, 2);
}

struct BsumPair {
    int32_t v;
};
static_assert(sizeof(BsumPair) == 4, "BsumPair is one dword");

// The sums of each token's 32-value sub-blocks 2c and 2c + 1 as an int16 pair (low, high), one dword per chunk
// c of a super-block: bs[(m nsb + s) 4 + c] for the M block_q8_K rows at X, xrb bytes apart.
inline void subblock_sum_pairs(const uint8_t* X, size_t xrb, int M, int64_t nsb, int32_t* bs) {
    for (int m = 0; m < M; m++)
        for (int64_t s = 0; s < nsb; s++) {
            const block_q8_K& x = ((const block_q8_K*)(X + m * xrb))[s];
            for (int c = 0; c < 4; c++) {
                const uint16_t a = (uint16_t)(x.bsums[4 * c] + x.bsums[4 * c + 1]);
                const uint16_t b = (uint16_t)(x.bsums[4 * c + 2] + x.bsums[4 * c + 3]);
                bs[((size_t)m * nsb + s) * 4 + c] = (int32_t)((uint32_t)a | ((uint32_t)b << 16));
            }
        }
}

// f(std::integral_constant<int, n>) for a token count n in 1..GMAX.
template <int GMAX, class F>
inline void with_tokens(int n, F&& f) {
    if constexpr (GMAX > 1) {
        if (n < GMAX) return with_tokens<GMAX - 1>(n, f);
    }
    f(std::integral_constant<int, GMAX>());
}

// What gemm_r16 needs of a Tile beyond GMAX, rows and step: its repacked block (Block), the reference
// product for rows outside whole groups (ref), and whether its steps read the tokens' sub-block sums as
// int16 pairs of q4_K's 32-weight sub-blocks (PAIRS; a tile without them reads block_q8_K's bsums itself).
// A tile that names none of them is a q4_K one.
template <class T, class = void>
struct R16Of {
    using Block = block_q4_K_r16;
    static constexpr bool PAIRS = true;
    static constexpr gemm_fn ref = &gemm_q4_K_r16_ref;
};
template <class T>
struct R16Of<T, std::void_t<typename T::Block>> {
    using Block = typename T::Block;
    static constexpr bool PAIRS = T::PAIRS;
    static constexpr gemm_fn ref = T::ref;
};

// Whether a Tile's activations are block_q8_a rows (blocks of 32 with their own scale: the iq4_nl and mxfp4
// tiles, as their file layouts' products) rather than block_q8_K ones (Q8A). Its xs[g] then point at block_q8_a
// rows (super-block s is blocks 8 s .. 8 s + 7), and where it asks for them (BLOCK_SUMS: a tile that takes its
// weights as unsigned bytes, value + 128) bsp[g][b] holds 128 x the sum of block b's activations.
template <class T, class = void>
struct Q8AOf : std::false_type {};
template <class T>
struct Q8AOf<T, std::void_t<decltype(T::Q8A)>> : std::bool_constant<T::Q8A> {};

// rows and step of a Tile T whose superblock<G, PF>(p, s, xs, bsp, acc) adds super-block s of the 16 rows
// at p to the 16 G sums at acc in memory (kernel_r16_256.h's, kernel_lowbit_avx2.h's low-bit ones and the
// NEON one; AVX-512's keep theirs in registers).
template <class T>
struct R16SumsInMemory {
    // G tokens over every super-block (all the call's tokens in one group).
    template <int G, class Block>
    static void rows(const Block* P, int64_t nsb, const block_q8_K* const* xs, const int32_t* const* bsp,
                     float* y, int64_t ldy) {
        alignas(32) float acc[16 * G] = {};
        for (int64_t s = 0; s < nsb; s++) T::template superblock<G, Prefetch::L1>(P[s], s, xs, bsp, acc);
        for (int g = 0; g < G; g++) std::memcpy(y + g * ldy, acc + 16 * g, sizeof(float) * 16);
    }
    // One super-block for one of several groups.
    template <int G, class Block>
    static void step(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const* bsp,
                     float* acc, bool first) {
        if (first)
            T::template superblock<G, Prefetch::L2>(p, s, xs, bsp, acc);
        else
            T::template superblock<G, Prefetch::NONE>(p, s, xs, bsp, acc);
    }
};

template <class Tile>
void gemm_r16(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
              int64_t n0, int64_t n1) {
    using Of = R16Of<Tile>;
    using Block = typename Of::Block;
    constexpr bool Q8A = Q8AOf<Tile>::value;
    constexpr int GMAX = Tile::GMAX, PANEL = 8 * GMAX;  // tokens per group, per panel
    const int64_t nsb = K / QK_K;
    if (M < 1 || n1 <= n0) return;
    const int64_t g0 = (n0 + R16 - 1) / R16, g1 = n1 / R16;
    if (g0 >= g1) return Of::ref(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
    if (n0 < g0 * R16) Of::ref(W, wrb, X, xrb, K, M, Y, ldy, n0, g0 * R16);
    if (g1 * R16 < n1) Of::ref(W, wrb, X, xrb, K, M, Y, ldy, g1 * R16, n1);
    // each token's sub-block sums as int16 pairs (2c, 2c + 1), one dword per chunk c of a super-block (a
    // type of this file's own: a std::vector<int32_t> would be a weak symbol, tests/test_isa_objects.py)
    thread_local std::vector<BsumPair> bs_buf;
    constexpr bool SUMS = [] {
        if constexpr (Q8A) return Tile::BLOCK_SUMS;
        return false;
    }();
    const size_t per_token = Of::PAIRS ? (size_t)nsb * 4 : SUMS ? (size_t)nsb * 8 : 0;
    bs_buf.resize(std::max<size_t>(1, (size_t)M * per_token));
    int32_t* const bs = &bs_buf[0].v;
    for (int m = 0; m < (SUMS ? M : 0); m++)  // 128 x each block_q8_a's sum (Q8AOf)
        for (int64_t b = 0; b < 8 * nsb; b++) {
            const block_q8_a& x = ((const block_q8_a*)(X + m * xrb))[b];
            int32_t sum = 0;
            for (int i = 0; i < QK; i++) sum += x.qs[i];
            bs[(size_t)m * per_token + b] = 128 * sum;
        }
    if (Of::PAIRS) subblock_sum_pairs(X, xrb, M, nsb, bs);
    alignas(64) float acc[PANEL * R16];
    for (int mp = 0; mp < M; mp += PANEL) {
        const int mc = std::min(PANEL, M - mp), n_groups = (mc + GMAX - 1) / GMAX;
        const block_q8_K* xs[PANEL];
        const int32_t* bp[PANEL];
        int first[PANEL / GMAX + 1];
        for (int i = 0; i < mc; i++) {
            xs[i] = (const block_q8_K*)(X + (mp + i) * xrb);
            bp[i] = per_token ? bs + (size_t)(mp + i) * per_token : nullptr;
        }
        for (int tg = 0; tg <= n_groups; tg++) first[tg] = tg * mc / n_groups;  // groups of equal size
        for (int64_t g16 = g0; g16 < g1; g16++) {
            const Block* P = (const Block*)(W + (size_t)g16 * R16 * wrb);
            if (n_groups == 1) {
                float* y = Y + mp * ldy + g16 * R16;
                with_tokens<GMAX>(mc, [&](auto g) { Tile::template rows<decltype(g)::value>(P, nsb, xs, bp, y, ldy); });
                continue;
            }
            // every group takes a super-block before the next is read: the weights stream once, the
            // groups' sums wait in L1
            std::memset(acc, 0, sizeof(float) * R16 * mc);
            for (int64_t s = 0; s < nsb; s++)
                for (int tg = 0; tg < n_groups; tg++) {
                    const int i = first[tg];
                    with_tokens<GMAX>(first[tg + 1] - i, [&](auto g) {
                        Tile::template step<decltype(g)::value>(P[s], s, xs + i, bp + i, acc + R16 * i, tg == 0);
                    });
                }
            for (int i = 0; i < mc; i++) std::memcpy(Y + (mp + i) * ldy + g16 * R16, acc + R16 * i, sizeof(float) * R16);
        }
    }
}

// The formats of block_iq4_xs_r16's layout (kernel_lowbit_avx2.h's and kernels_neon.cpp's TileCodes4R16): the
// repacked block, the 16 signed values of the 4-bit codes, the factor of d, the reference product, and how
// many words' vpmaddubsw pairs the AVX2 tile may add in int16 (CHAIN).
struct CodesIQ4XS {
    using Block = block_iq4_xs_r16;
    static constexpr const int8_t* VALUES = kvalues_iq4nl;
    static constexpr float FACTOR = 1.f;
    static constexpr gemm_fn REF = &gemm_iq4_xs_r16_ref;
    static constexpr int CHAIN = 1;  // words per int16 sum: a vpmaddubsw pair reaches 2 x 127 x 127
};
struct CodesIQ3XXS {
    using Block = block_iq3_xxs_r16;
    static constexpr const int8_t* VALUES = kvalues_iq3xxs_r16;
    static constexpr float FACTOR = 0.25f;  // (iq3_xxs: weight = d / 4 * scale * value)
    static constexpr gemm_fn REF = &gemm_iq3_xxs_r16_ref;
    static constexpr int CHAIN = 2;  // 2 x 2 x 62 x 127 < 2^15
};
// The formats of block_iq4_nl_r16's and block_mxfp4_r16's layout (the 4-bit code tiles with a float scale per
// block of 32 and row, activations as block_q8_a): the repacked block, the 16 signed values, whether the
// scales are E8M0 exponents (else fp16), the reference product, and how many words' vpmaddubsw pairs the AVX2
// tile may add in int16 (CHAIN).
struct BlocksIQ4NL {
    using Block = block_iq4_nl_r16;
    static constexpr const int8_t* VALUES = kvalues_iq4nl;
    static constexpr bool E8M0 = false;
    static constexpr gemm_fn REF = &gemm_iq4_nl_r16_ref;
    static constexpr int CHAIN = 1;  // (as iq4_xs)
};
struct BlocksMXFP4 {
    using Block = block_mxfp4_r16;
    static constexpr const int8_t* VALUES = kvalues_mxfp4;
    static constexpr bool E8M0 = true;
    static constexpr gemm_fn REF = &gemm_mxfp4_r16_ref;
    static constexpr int CHAIN = 8;  // a block's 8 words: 8 x 2 x 12 x 127 < 2^15
};
struct CodesIQ3S {
    using Block = block_iq3_s_r16;
    static constexpr const int8_t* VALUES = kvalues_iq3s_r16;
    static constexpr float FACTOR = 1.f;
    static constexpr gemm_fn REF = &gemm_iq3_s_r16_ref;
    static constexpr int CHAIN = 8;  // a group's 8 words: 8 x 2 x 15 x 127 < 2^15
};

}  // namespace
}  // namespace clover
