// AVX2 products of the low-bit and legacy formats (lowbit.h), included by kernels_avx2.cpp only (it is
// the file compiled with -mavx2): the super-blocks of 256 (q2_K, q3_K, iq4_xs, iq2_xxs, iq2_xs, iq2_s, iq3_xxs,
// iq3_s, iq1_s, iq1_m) on the file's layout are kernel_low256_avx2.h's; here the layouts repacked by 16 rows and
// the blocks of 32 (q4_1, q5_0, q5_1, iq4_nl, mxfp4) against block_q8_a, through kernels_avx2.cpp's TileQ8A
// (signed weights) or TileQ8A1 below (unsigned weights plus a min: d q + m).
#pragma once

#include <immintrin.h>

#include <array>
#include <type_traits>
#include <utility>

#include "kernel_low256_avx2.h"
#include "kernel_r16.h"
#include "lowbit.h"

namespace clover {
namespace {

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

}  // namespace
}  // namespace clover
