// AArch64 NEON kernels. The design of kernels_avx2.cpp: register tiles of RM weight rows x RN tokens,
// each weight block unpacked once per tile and reused for RN tokens. Int8 weights and activations are
// multiplied signed x signed, so q4_0 and q6_K subtract their offsets in int8 and need no zero-point term.
// Built twice: as is for Armv8.0 (int8 products with vmull_s8 + vpadalq_s16), and by
// kernels_neon_dotprod.cpp, the only file compiled with -march=armv8.2-a+dotprod (sdot, vdotq_s32).
// kernels_neon() picks one of the two tables once, from cpu_features().dotprod. Only the dot-product build
// multiplies q4_K weights repacked at load (block_q4_K_r16, TileR16 below): the loader repacks for it alone.
#include <arm_neon.h>

#include "dispatch.h"
#include "kernel_tiles.h"
#include "kernels.h"
#if defined(CLOVER_NEON_DOTPROD)
#include "kernel_r16.h"
#endif

#if defined(CLOVER_NEON_DOTPROD) && !defined(__ARM_FEATURE_DOTPROD)
#error "the dot-product build of kernels_neon.cpp needs -march=armv8.2-a+dotprod"
#endif

namespace clover {

// The two builds of this file; kernels_neon() returns one, the native test (tests/native) runs both.
const Kernels* kernels_neon_plain();
const Kernels* kernels_neon_dotprod();

namespace {

// acc += products of 16 int8 pairs, summed into 4 int32 lanes (which products land in which lane differs
// between the two builds; callers only use the sum of the lanes or scale all lanes alike).
inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(CLOVER_NEON_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    // Each int16 product is widened before any addition: (-128) * (-128) pairs cannot overflow.
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

// ---- float weights (f32, f16, bf16) against fp32 activations ----

struct LoadF32 {
    static float32x4_t load(const uint8_t* w, int64_t k) { return vld1q_f32((const float*)w + k); }
    static float load1(const uint8_t* w, int64_t k) { return ((const float*)w)[k]; }
};
struct LoadF16 {
    static float32x4_t load(const uint8_t* w, int64_t k) {
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t*)w + k)));
    }
    static float load1(const uint8_t* w, int64_t k) { return fp16_to_f32(((const uint16_t*)w)[k]); }
};
struct LoadBF16 {
    // bf16 is the top half of an fp32: widen each u16 shifted left by 16.
    static float32x4_t load(const uint8_t* w, int64_t k) {
        return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t*)w + k), 16));
    }
    static float load1(const uint8_t* w, int64_t k) { return bf16_to_f32(((const uint16_t*)w)[k]); }
};

template <typename L>
struct TileFloat {
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            float32x4_t acc[RM][RN];
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) acc[r][t] = vdupq_n_f32(0.f);
            const int64_t K4 = a.K & ~int64_t(3);
            for (int64_t k = 0; k < K4; k += 4) {
                float32x4_t w[RM];
                for (int r = 0; r < RM; r++) w[r] = L::load(a.W + (n + r) * a.wrb, k);
                for (int t = 0; t < RN; t++) {
                    const float32x4_t x = vld1q_f32((const float*)(a.X + (m + t) * a.xrb) + k);
                    for (int r = 0; r < RM; r++) acc[r][t] = vfmaq_f32(acc[r][t], w[r], x);
                }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) {
                    float s = vaddvq_f32(acc[r][t]);
                    const float* x = (const float*)(a.X + (m + t) * a.xrb);
                    for (int64_t k = K4; k < a.K; k++) s += L::load1(a.W + (n + r) * a.wrb, k) * x[k];
                    a.Y[(m + t) * a.ldy + n + r] = s;
                }
        }
    };
};

template <int RM, int RN>
using TileF32 = TileFloat<LoadF32>::T<RM, RN>;
template <int RM, int RN>
using TileF16 = TileFloat<LoadF16>::T<RM, RN>;
template <int RM, int RN>
using TileBF16 = TileFloat<LoadBF16>::T<RM, RN>;

// ---- Q8_0 and Q4_0 weights against block_q8_a activations ----

// One weight block as 2 x 16 signed quants (weights 0..15, 16..31) and its scale.
struct UnpackQ8_0 {
    static void load(const uint8_t* row, int64_t b, int8x16_t q[2], float* d) {
        const block_q8_0* blk = (const block_q8_0*)row + b;
        *d = fp16_to_f32(blk->d);
        q[0] = vld1q_s8(blk->qs);
        q[1] = vld1q_s8(blk->qs + 16);
    }
};
struct UnpackQ4_0 {
    static void load(const uint8_t* row, int64_t b, int8x16_t q[2], float* d) {
        const block_q4_0* blk = (const block_q4_0*)row + b;
        *d = fp16_to_f32(blk->d);
        const uint8x16_t v = vld1q_u8(blk->qs);
        const int8x16_t eight = vdupq_n_s8(8);
        q[0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), eight);
        q[1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight);
    }
};

template <typename U>
struct TileQ8A {
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            float32x4_t acc[RM][RN];
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) acc[r][t] = vdupq_n_f32(0.f);
            const int64_t nb = a.K / QK;
            for (int64_t b = 0; b < nb; b++) {
                int8x16_t w[RM][2];
                float dw[RM];
                for (int r = 0; r < RM; r++) U::load(a.W + (n + r) * a.wrb, b, w[r], &dw[r]);
                for (int t = 0; t < RN; t++) {
                    const block_q8_a* xb = (const block_q8_a*)(a.X + (m + t) * a.xrb) + b;
                    const int8x16_t x0 = vld1q_s8(xb->qs), x1 = vld1q_s8(xb->qs + 16);
                    for (int r = 0; r < RM; r++) {
                        const int32x4_t p = dot16(dot16(vdupq_n_s32(0), w[r][0], x0), w[r][1], x1);
                        acc[r][t] = vfmaq_n_f32(acc[r][t], vcvtq_f32_s32(p), dw[r] * xb->d);
                    }
                }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + r] = vaddvq_f32(acc[r][t]);
        }
    };
};

template <int RM, int RN>
using TileQ8_0 = TileQ8A<UnpackQ8_0>::T<RM, RN>;
template <int RM, int RN>
using TileQ4_0 = TileQ8A<UnpackQ4_0>::T<RM, RN>;

// ---- k-quants against block_q8_K activations ----

// One weight super-block unpacked to 16 vectors of 16 quants (vector v holds weights 16v .. 16v+15).
// Integer sums are exact and the float arithmetic per super-block is the reference's, so with
// -ffp-contract=off (CMakeLists.txt) the results equal kernels_ref.cpp's bit for bit.
struct SuperQ {
    int8x16_t q[16];
    int32_t sc[16];  // multiplier of each group of G consecutive vectors
    int16x8_t mins;  // q4_K / q5_K: m_j of the 8 sub-blocks, against the sub-block sums of the activations
    float d, dmin;   // y = x.d * (d * sum(sc * q.x) - dmin * sum(mins * bsums))
};

inline void unpack_k4_scales(const uint8_t* scales12, SuperQ& s) {
    int16_t mins[8];
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        scale_min_k4(j, scales12, &sc, &m);
        s.sc[j] = sc;
        mins[j] = m;
    }
    s.mins = vld1q_s16(mins);
}

// q4_K: sub-block j (scale j) is vectors 2j, 2j+1; chunk c of qs holds sub-block 2c in its low nibbles.
struct UnpackQ4_K {
    static constexpr int G = 2;
    static constexpr bool MINS = true;
    static void load(const uint8_t* row, int64_t b, SuperQ& s) {
        const block_q4_K* blk = (const block_q4_K*)row + b;
        s.d = fp16_to_f32(blk->d);
        s.dmin = fp16_to_f32(blk->dmin);
        unpack_k4_scales(blk->scales, s);
        const uint8x16_t mask = vdupq_n_u8(0x0f);
        for (int c = 0; c < 4; c++)
            for (int h = 0; h < 2; h++) {
                const uint8x16_t q = vld1q_u8(blk->qs + 32 * c + 16 * h);
                s.q[4 * c + h] = vreinterpretq_s8_u8(vandq_u8(q, mask));
                s.q[4 * c + 2 + h] = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
            }
    }
};

// q5_K: as q4_K plus bit j of qh[l] as bit 4 of weight l of sub-block j.
struct UnpackQ5_K {
    static constexpr int G = 2;
    static constexpr bool MINS = true;
    static void load(const uint8_t* row, int64_t b, SuperQ& s) {
        const block_q5_K* blk = (const block_q5_K*)row + b;
        s.d = fp16_to_f32(blk->d);
        s.dmin = fp16_to_f32(blk->dmin);
        unpack_k4_scales(blk->scales, s);
        const uint8x16_t mask = vdupq_n_u8(0x0f), bit4 = vdupq_n_u8(0x10);
        uint8x16_t qh[2] = {vld1q_u8(blk->qh), vld1q_u8(blk->qh + 16)};  // weights 0..15, 16..31
        for (int c = 0; c < 4; c++)
            for (int h = 0; h < 2; h++) {
                const uint8x16_t q = vld1q_u8(blk->qs + 32 * c + 16 * h);
                const uint8x16_t lo = vorrq_u8(vandq_u8(q, mask), vandq_u8(vshlq_n_u8(qh[h], 4), bit4));
                const uint8x16_t hi = vorrq_u8(vshrq_n_u8(q, 4), vandq_u8(vshlq_n_u8(qh[h], 3), bit4));
                s.q[4 * c + h] = vreinterpretq_s8_u8(lo);
                s.q[4 * c + 2 + h] = vreinterpretq_s8_u8(hi);
                qh[h] = vshrq_n_u8(qh[h], 2);  // bits 2c+2, 2c+3 for the next chunk
            }
    }
};

// q6_K: q - 32 in -32..31 (signed, no zero-point term), one scale per 16 weights. In half h, byte l of
// ql[64h..] and qh[32h..] gives weights 128h + l (+32 from ql[l+32], +64 and +96 from the high nibbles).
struct UnpackQ6_K {
    static constexpr int G = 1;
    static constexpr bool MINS = false;
    static void load(const uint8_t* row, int64_t b, SuperQ& s) {
        const block_q6_K* blk = (const block_q6_K*)row + b;
        s.d = fp16_to_f32(blk->d);
        s.dmin = 0.f;
        s.mins = vdupq_n_s16(0);
        const uint8x16_t mask4 = vdupq_n_u8(0x0f), mask2 = vdupq_n_u8(0x03);
        const int8x16_t offset = vdupq_n_s8(32);
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 2; l++) {
                const uint8x16_t la = vld1q_u8(blk->ql + 64 * h + 16 * l);
                const uint8x16_t lb = vld1q_u8(blk->ql + 64 * h + 32 + 16 * l);
                const uint8x16_t qh = vld1q_u8(blk->qh + 32 * h + 16 * l);
                const uint8x16_t q1 = vorrq_u8(vandq_u8(la, mask4), vshlq_n_u8(vandq_u8(qh, mask2), 4));
                const uint8x16_t q2 = vorrq_u8(vandq_u8(lb, mask4), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 2), mask2), 4));
                const uint8x16_t q3 = vorrq_u8(vshrq_n_u8(la, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 4), mask2), 4));
                const uint8x16_t q4 = vorrq_u8(vshrq_n_u8(lb, 4), vshlq_n_u8(vshrq_n_u8(qh, 6), 4));
                s.q[8 * h + 0 + l] = vsubq_s8(vreinterpretq_s8_u8(q1), offset);
                s.q[8 * h + 2 + l] = vsubq_s8(vreinterpretq_s8_u8(q2), offset);
                s.q[8 * h + 4 + l] = vsubq_s8(vreinterpretq_s8_u8(q3), offset);
                s.q[8 * h + 6 + l] = vsubq_s8(vreinterpretq_s8_u8(q4), offset);
            }
        for (int g = 0; g < 16; g++) s.sc[g] = blk->scales[g];
    }
};

template <typename U>
struct TileQK {
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            constexpr int G = U::G;
            float acc[RM][RN] = {};
            const int64_t nb = a.K / QK_K;
            SuperQ s[RM];
            for (int64_t b = 0; b < nb; b++) {
                for (int r = 0; r < RM; r++) U::load(a.W + (n + r) * a.wrb, b, s[r]);
                for (int t = 0; t < RN; t++) {
                    const block_q8_K& x = ((const block_q8_K*)(a.X + (m + t) * a.xrb))[b];
                    int32x4_t sum[RM];
                    for (int r = 0; r < RM; r++) sum[r] = vdupq_n_s32(0);
                    for (int j = 0; j < 16 / G; j++) {
                        int8x16_t xv[G];
                        for (int g = 0; g < G; g++) xv[g] = vld1q_s8(x.qs + 16 * (G * j + g));
                        for (int r = 0; r < RM; r++) {
                            int32x4_t p = vdupq_n_s32(0);
                            for (int g = 0; g < G; g++) p = dot16(p, s[r].q[G * j + g], xv[g]);
                            sum[r] = vmlaq_n_s32(sum[r], p, s[r].sc[j]);
                        }
                    }
                    // sub-block sums of the activations: pairs of the 16-value group sums
                    int16x8_t bs = vdupq_n_s16(0);
                    if constexpr (U::MINS) bs = vpaddq_s16(vld1q_s16(x.bsums), vld1q_s16(x.bsums + 8));
                    for (int r = 0; r < RM; r++) {
                        const float sum_q = (float)vaddvq_s32(sum[r]);
                        if constexpr (U::MINS) {
                            int32x4_t zp = vmull_s16(vget_low_s16(s[r].mins), vget_low_s16(bs));
                            zp = vmlal_high_s16(zp, s[r].mins, bs);
                            acc[r][t] += x.d * (s[r].d * sum_q - s[r].dmin * (float)vaddvq_s32(zp));
                        } else {
                            acc[r][t] += s[r].d * x.d * sum_q;
                        }
                    }
                }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + r] = acc[r][t];
        }
    };
};

template <int RM, int RN>
using TileQ4_K = TileQK<UnpackQ4_K>::T<RM, RN>;
template <int RM, int RN>
using TileQ5_K = TileQK<UnpackQ5_K>::T<RM, RN>;
template <int RM, int RN>
using TileQ6_K = TileQK<UnpackQ6_K>::T<RM, RN>;

#if defined(CLOVER_NEON_DOTPROD)
// ---- q4_K repacked by 16 rows (block_q4_K_r16): one row per int32 lane, a group of 16 in four quads ----
// The layout's kernel on 4-lane registers with sdot by element (vdotq_laneq_s32): per chunk, word and
// token, each quad's 4 weights of 4 rows against the token's 4 activations of that word, the low nibbles
// (sub-block 2c) and the high ones (2c + 1) of one load in two chains: 8 chains per token, 16 at 2 tokens
// (sdot's latency wants several in flight). Weights are 0..15, so signed x signed sdot needs no offset.
// Each sub-block's sum times its scale is added in int32 (at most 8 x 63 x 32 x 15 x 128 < 2^31), the
// mins by widening multiplies of the (min, min) pairs against the token's sub-block sums, and the float
// arithmetic per super-block is the reference's, so with -ffp-contract=off the results equal
// kernels_ref.cpp's bit for bit. Not timed: nothing here runs Arm code natively (qemu checks it,
// tests/native; bench/native/icount_aarch64.sh counts its instructions); the prefetch distances are the
// AVX2 kernel's.
struct TileR16 : R16SumsInMemory<TileR16> {
    static constexpr int GMAX = 2;  // 2 tokens: 16 chains, 4 activation vectors, 8 sums of the super-block

    template <Prefetch PF>
    static void prefetch(const void* p) {
        prefetch_r16<PF, 2048, 8192>(p);
    }

    // Word 4u + L of chunk c for G tokens: 4 quads x (low, high) x G sdot.
    template <int G, int L, Prefetch PF>
    static void word(const block_q4_K_r16& p, int c, int u, const int8x16_t* xl, const int8x16_t* xh,
                     int32x4_t (*sl)[4], int32x4_t (*sh)[4]) {
        const uint8_t* w = (const uint8_t*)p.qs[c][4 * u + L];  // the word's 16 rows: 64 bytes
        prefetch<PF>(w);  // each word is a line of its own
        for (int q = 0; q < 4; q++) {
            const uint8x16_t v = vld1q_u8(w + 16 * q);
            const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
            const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
            for (int g = 0; g < G; g++) {
                sl[g][q] = vdotq_laneq_s32(sl[g][q], lo, xl[g], L);
                sh[g][q] = vdotq_laneq_s32(sh[g][q], hi, xh[g], L);
            }
        }
    }

    // The 16 rows' scales of sub-block j as int32, 4 per quad.
    static void scales(const block_q4_K_r16& p, int j, int32x4_t sc[4]) {
        const uint8x16_t b = vld1q_u8(p.sc[j]);
        const uint16x8_t h[2] = {vmovl_u8(vget_low_u8(b)), vmovl_high_u8(b)};
        for (int q = 0; q < 4; q++)
            sc[q] = vreinterpretq_s32_u32(q % 2 ? vmovl_high_u16(h[q / 2]) : vmovl_u16(vget_low_u16(h[q / 2])));
    }

    // Super-block s of the 16 rows at p for G tokens: acc[16 g + r] += its share of row r's dot with token g.
    template <int G, Prefetch PF>
    static void superblock(const block_q4_K_r16& p, int64_t s, const block_q8_K* const* xs, const int32_t* const* bsp,
                           float* acc) {
        for (int k = 0; k < 5; k++) prefetch<PF>((const char*)&p + 64 * k);
        int32x4_t sq[G][4];  // sum over sub-blocks of scale x dot, per row
        for (int g = 0; g < G; g++)
            for (int q = 0; q < 4; q++) sq[g][q] = vdupq_n_s32(0);
        for (int c = 0; c < 4; c++) {
            int32x4_t sl[G][4], sh[G][4];
            for (int g = 0; g < G; g++)
                for (int q = 0; q < 4; q++) sl[g][q] = sh[g][q] = vdupq_n_s32(0);
            for (int u = 0; u < 2; u++) {  // words 4u .. 4u + 3: one activation vector per token and nibble
                int8x16_t xl[G], xh[G];
                for (int g = 0; g < G; g++) {
                    xl[g] = vld1q_s8(xs[g][s].qs + 64 * c + 16 * u);
                    xh[g] = vld1q_s8(xs[g][s].qs + 64 * c + 32 + 16 * u);
                }
                word<G, 0, PF>(p, c, u, xl, xh, sl, sh);
                word<G, 1, PF>(p, c, u, xl, xh, sl, sh);
                word<G, 2, PF>(p, c, u, xl, xh, sl, sh);
                word<G, 3, PF>(p, c, u, xl, xh, sl, sh);
            }
            int32x4_t sc_lo[4], sc_hi[4];
            scales(p, 2 * c, sc_lo);
            scales(p, 2 * c + 1, sc_hi);
            for (int q = 0; q < 4; q++)
                for (int g = 0; g < G; g++)
                    sq[g][q] = vmlaq_s32(vmlaq_s32(sq[g][q], sl[g][q], sc_lo[q]), sh[g][q], sc_hi[q]);
        }
        for (int q = 0; q < 4; q++) {
            // mins: (m_2c, m_2c+1) of 4 rows as int16 against the token's (bsum_2c, bsum_2c+1), pairs added
            int32x4_t mi[G];
            for (int g = 0; g < G; g++) mi[g] = vdupq_n_s32(0);
            for (int c = 0; c < 4; c++) {
                const int16x8_t mn = vreinterpretq_s16_u16(vmovl_u8(vld1_u8((const uint8_t*)p.mn[c] + 8 * q)));
                for (int g = 0; g < G; g++) {
                    const int16x8_t b = vreinterpretq_s16_s32(vdupq_n_s32(bsp[g][4 * s + c]));
                    mi[g] = vaddq_s32(mi[g], vpaddq_s32(vmull_s16(vget_low_s16(mn), vget_low_s16(b)),
                                                        vmull_high_s16(mn, b)));
                }
            }
            // the reference's x.d * (d * sum_q - dmin * sum_m), added to the row's sum
            const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p.d + 4 * q)));
            const float32x4_t dmin = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p.dmin + 4 * q)));
            for (int g = 0; g < G; g++) {
                const float32x4_t v = vsubq_f32(vmulq_f32(d, vcvtq_f32_s32(sq[g][q])),
                                                vmulq_f32(dmin, vcvtq_f32_s32(mi[g])));
                float* a = acc + 16 * g + 4 * q;
                vst1q_f32(a, vaddq_f32(vld1q_f32(a), vmulq_n_f32(v, xs[g][s].d)));
            }
        }
    }
};
#endif

const Kernels NEON = {
    "neon",
    "neon",
    gemm_tiled<TileF32, 4, 2>,
    gemm_tiled<TileF16, 4, 2>,
    gemm_tiled<TileBF16, 4, 2>,
    gemm_tiled<TileQ8_0, 4, 2>,
    gemm_tiled<TileQ4_0, 4, 2>,
    gemm_tiled<TileQ4_K, 4, 2>,
    gemm_tiled<TileQ5_K, 4, 2>,
    gemm_tiled<TileQ6_K, 4, 2>,
#if defined(CLOVER_NEON_DOTPROD)
    gemm_r16<TileR16>,
#else
    gemm_q4_K_r16_ref,  // (without sdot the loader does not repack)
#endif
};

}  // namespace

#if defined(CLOVER_NEON_DOTPROD)
const Kernels* kernels_neon_dotprod() { return &NEON; }
#else
const Kernels* kernels_neon_plain() { return &NEON; }

// Chosen once; both tables are named "neon" (system_info's cpu_features.dotprod says which one runs).
const Kernels* kernels_neon() {
    static const Kernels* const chosen = cpu_features().dotprod ? kernels_neon_dotprod() : &NEON;
    return chosen;
}
#endif

}  // namespace clover
