// The q4_K product in the repacked layout (block_q4_K_r16) on 256-bit registers, for any token count:
// shared by kernels_avx2.cpp (DotMaddubs) and kernels_avxvnni.cpp (DotVnni), each compiled with its own
// target flags (everything in an anonymous namespace: kernel_tiles.h says why). The driver is
// kernel_r16.h's; results equal the reference's up to float summation order (integer sums are exact).
#pragma once

#if !defined(__AVX2__) || !defined(__F16C__) || !defined(__FMA__)
#error "kernel_r16_256.h needs -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>

#include <cstring>

#include "kernel_r16.h"

namespace clover {
namespace {

// ---- q4_K repacked by 16 rows (block_q4_K_r16): one row per int32 lane, a group of 16 in two halves ----
// kernels_avx512.cpp's kernel on 8-lane registers: per half, sub-block and token, 8 Dot::dot of 4 weights
// of 8 rows against the token's 4 activations broadcast, one chain per sub-block (Dot, kernel_lanes256.h:
// AVX2's vpmaddubsw sums in int16, at most 8 x 2 x 15 x 128 < 2^15, widened once by vpmaddwd; AVX-VNNI's
// vpdpbusd); the high nibbles shifted down (16 x the value would overflow vpmaddubsw's int16). Then the
// int32 sums to float times d x scale of each row, the mins by vpmaddwd of the (min, min) pairs against
// the token's sub-block sums, d_x once per super-block. The halves read 32 of each 64 bytes; the second
// finds them in L1. Both halves at once (each broadcast serving 16 rows) ran slower, in cache and from
// memory.
//
// Prefetch: to L1 2 KB ahead and to L2 8 KB ahead (kbench from memory, one thread, AVX2: one token
// 8.3-8.7 -> 5.5-6.4 ns per super-block row, 2 tokens 6.1-6.2 -> 4.7-4.8 per token, against 4 KB ahead
// to L1 alone); several groups to L2 8 KB ahead (5 tokens 4.9 -> 3.4-3.5 ns per token against 2 KB).
// kernels_avx512.cpp's kernel lost 14-25% at one token with the second prefetch and keeps it for two
// or more. The AVX-VNNI instance, timed on a Xeon with AVX-VNNI (bench/NOTES.md, after change 49):
// in the model, against the file layout (the AVX2 GEMV at one token, the vpdpbusd lane tiles from two),
// ~+15% at one token, +1 to +10% at 8, -4 to -12% at 32-128.
template <class Dot>
struct TileR16 : R16SumsInMemory<TileR16<Dot>> {
    // tokens per weight load: Dot::R16_TOKENS (AVX2 4: 4 sums, 4 chains, a weight vector and a broadcast;
    // AVX-VNNI 6, which spills a few sums and still wins: kernels_avxvnni.cpp)
    static constexpr int GMAX = Dot::R16_TOKENS;
    static_assert(Dot::chain(15) >= 8, "a sub-block's 8 vectors are one chain");

    template <Prefetch PF>
    static void prefetch(const void* p) {
        prefetch_r16<PF, 2048, 8192>(p);
    }

    // Super-block s of the 16 rows at p for G tokens: acc[16 g + r] += its share of row r's dot with token g.
    template <int G, Prefetch PF>
    static void superblock(const block_q4_K_r16& p, int64_t s, const block_q8_K* const* xs, const int32_t* const* bsp,
                           float* acc) {
        const __m256i lo4 = _mm256_set1_epi8(0x0f), zero = _mm256_setzero_si256();
        for (int k = 0; k < 5; k++) prefetch<PF>((const char*)&p + 64 * k);
        for (int h = 0; h < 2; h++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p.d + 8 * h)));
            __m256 f[G];
            for (int g = 0; g < G; g++) f[g] = _mm256_setzero_ps();
            for (int c = 0; c < 4; c++)
                for (int hi = 0; hi < 2; hi++) {  // sub-block 2c (low nibbles), then 2c + 1 (high)
                    typename Dot::Sum sum[G];
                    for (int g = 0; g < G; g++) sum[g] = Dot::start(zero);
                    for (int t = 0; t < 8; t++) {
                        const __m256i w = _mm256_loadu_si256((const __m256i*)p.qs[c][t][8 * h]);
                        if (h == 0 && hi == 0) prefetch<PF>(p.qs[c][t]);
                        const __m256i q = _mm256_and_si256(hi ? _mm256_srli_epi16(w, 4) : w, lo4);
                        for (int g = 0; g < G; g++) {
                            int32_t a;
                            std::memcpy(&a, xs[g][s].qs + 64 * c + 32 * hi + 4 * t, 4);
                            sum[g] = Dot::dot(sum[g], q, _mm256_set1_epi32(a));
                        }
                    }
                    const __m256 ds = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                                           _mm_loadl_epi64((const __m128i*)(p.sc[2 * c + hi] + 8 * h)))));
                    for (int g = 0; g < G; g++)
                        f[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Dot::end(zero, sum[g])), ds, f[g]);
                }
            __m256i mi[G];
            for (int g = 0; g < G; g++) mi[g] = _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                const __m256i mn = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p.mn[c][8 * h]));
                for (int g = 0; g < G; g++)
                    mi[g] = _mm256_add_epi32(mi[g], _mm256_madd_epi16(mn, _mm256_set1_epi32(bsp[g][4 * s + c])));
            }
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p.dmin + 8 * h)));
            for (int g = 0; g < G; g++) {
                const __m256 dx = _mm256_set1_ps(xs[g][s].d);
                float* a = acc + 16 * g + 8 * h;
                __m256 v = _mm256_fmadd_ps(f[g], dx, _mm256_loadu_ps(a));
                v = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mi[g]), _mm256_mul_ps(dmin, dx), v);
                _mm256_storeu_ps(a, v);
            }
        }
    }
};

}  // namespace
}  // namespace clover
