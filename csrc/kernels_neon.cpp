// AArch64 NEON kernels. The design of kernels_avx2.cpp: register tiles of RM weight rows x RN tokens,
// each weight block unpacked once per tile and reused for RN tokens. Int8 weights and activations are
// multiplied signed x signed, so q4_0 and q6_K subtract their offsets in int8 and need no zero-point term.
// Built twice: as is for Armv8.0 (int8 products with vmull_s8 + vpadalq_s16), and by
// kernels_neon_dotprod.cpp, the only file compiled with -march=armv8.2-a+dotprod (sdot, vdotq_s32).
// kernels_neon() picks one of the two tables once, from cpu_features().dotprod. Only the dot-product build
// multiplies weights repacked at load (q4_K: block_q4_K_r16, TileR16 below; iq4_xs, and iq3_xxs / iq3_s
// transcoded: TileCodes4R16): the loader repacks for it alone.
// The low-bit and legacy formats (q2_K, q3_K, iq4_xs, the i-quant grids, q4_1, q5_0, q5_1, iq4_nl, mxfp4) run
// on the file's layout in both builds (TileLow256, TileLow32), bit for bit the reference's results.
#include <arm_neon.h>

#include "dispatch.h"
#include "kernel_tiles.h"
#include "kernels.h"
#include "lowbit.h"
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

// ---- the low-bit and legacy formats (lowbit.h): super-blocks of 256 against block_q8_K (q2_K, q3_K, iq4_xs,
// iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m), blocks of 32 against block_q8_a (q4_1, q5_0, q5_1, iq4_nl, mxfp4) ----
// Each weight block is unpacked once per tile into signed int8 vectors of 16 (shifts and masks; vqtbl1q_s8 for
// the 16-value tables; the grids' 8-byte entries by scalar table loads with their signs applied as byte masks),
// multiplied with dot16 and summed per group in int32 (group sums times their int16 scales); the float
// expression per block and the order in which blocks are added are the reference's (kernels_ref.cpp's
// gemm_lowbit256 / gemm_lowbit32), so with -ffp-contract=off the results equal it bit for bit. Not timed on Arm
// hardware (nothing here runs Arm code natively); qemu checks it (tests/native).

// fp16 to fp32 by the conversion instruction (exact, as fp16_to_f32): the shared inline function, called from
// many tiles, may be emitted out of line as a weak symbol, which the +dotprod object must not define
// (tests/native/run_aarch64.sh).
inline float half_f32(uint16_t h) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }

struct LowSuper {
    int8x16_t q[16];   // vector g: weights 16 g .. 16 g + 15, the group of scale sc[g]
    int32_t sc[16];
    int16_t mins[16];  // q2_K: the groups' mins, against the q8_K group sums
    float d, dmin;     // d * the format's factor; q2_K's dmin
};

// Two grid entries of 8 magnitudes (one byte each) with the signs of bits 0..7 of s0 and s1: (g ^ m) - m, the
// mask m = 0xff in the bytes whose bit is set.
inline int8x16_t grid16(uint64_t g0, uint64_t g1, uint8_t s0, uint8_t s1) {
    const uint8x16_t bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const int8x16_t m = vreinterpretq_s8_u8(vtstq_u8(vcombine_u8(vdup_n_u8(s0), vdup_n_u8(s1)), bit));
    const int8x16_t g = vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(g0), vcreate_u64(g1)));
    return vsubq_s8(veorq_s8(g, m), m);
}

// 2 s + 1 from the 16 nibbles of 8 bytes (iq2_xs, iq2_s: one per group of 16)
inline void nibble_scales16(const uint8_t* scales8, int32_t sc[16]) {
    for (int g = 0; g < 16; g++) sc[g] = 2 * ((scales8[g / 2] >> (4 * (g % 2))) & 0xf) + 1;
}

// q2_K: q = (qs[32 c + l] >> 2 sh) & 3 for weight 128 c + 32 sh + l, so vector 8 c + 2 sh + h is 16 bytes of qs
// (at 32 c + 16 h) shifted by 2 sh.
struct LowNQ2K {
    using Block = block_q2_K;
    static constexpr bool MINS = true;
    static void load(const Block& b, LowSuper& s) {
        s.d = half_f32(b.d);
        s.dmin = half_f32(b.dmin);
        const uint8x16_t three = vdupq_n_u8(3);
        for (int c = 0; c < 2; c++)
            for (int h = 0; h < 2; h++) {
                const uint8x16_t q = vld1q_u8(b.qs + 32 * c + 16 * h);
                s.q[8 * c + 0 + h] = vreinterpretq_s8_u8(vandq_u8(q, three));
                s.q[8 * c + 2 + h] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q, 2), three));
                s.q[8 * c + 4 + h] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(q, 4), three));
                s.q[8 * c + 6 + h] = vreinterpretq_s8_u8(vshrq_n_u8(q, 6));
            }
        for (int g = 0; g < 16; g++) {
            s.sc[g] = b.scales[g] & 0xf;
            s.mins[g] = (int16_t)(b.scales[g] >> 4);
        }
    }
};

// q3_K: q2_K's low bits, the high bit of weight 128 c + 32 sh + l in bit 4 c + sh of hmask[l] (set: q as is,
// clear: q - 4).
struct LowNQ3K {
    using Block = block_q3_K;
    static constexpr bool MINS = false;
    static void load(const Block& b, LowSuper& s) {
        s.d = half_f32(b.d);
        const uint8x16_t three = vdupq_n_u8(3), one = vdupq_n_u8(1);
        const uint8x16_t hm[2] = {vld1q_u8(b.hmask), vld1q_u8(b.hmask + 16)};
        for (int c = 0; c < 2; c++)
            for (int h = 0; h < 2; h++) {
                const uint8x16_t q = vld1q_u8(b.qs + 32 * c + 16 * h);
                const uint8x16_t lo[4] = {vandq_u8(q, three), vandq_u8(vshrq_n_u8(q, 2), three),
                                          vandq_u8(vshrq_n_u8(q, 4), three), vshrq_n_u8(q, 6)};
                for (int sh = 0; sh < 4; sh++) {
                    const uint8x16_t hb = vandq_u8(vshlq_u8(hm[h], vdupq_n_s8((int8_t)-(4 * c + sh))), one);
                    const uint8x16_t u = vorrq_u8(lo[sh], vshlq_n_u8(hb, 2));
                    s.q[8 * c + 2 * sh + h] = vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(4));
                }
            }
        int8_t sc[16];
        decode_scales_q3_K(b.scales, sc);
        for (int g = 0; g < 16; g++) s.sc[g] = sc[g];
    }
};

// iq4_xs: kvalues_iq4nl of the nibbles (16 bytes of qs per group of 32: low nibbles first), one 6-bit scale
// minus 32 per group of 32.
struct LowNIQ4XS {
    using Block = block_iq4_xs;
    static constexpr bool MINS = false;
    static void load(const Block& b, LowSuper& s) {
        s.d = half_f32(b.d);
        const int8x16_t table = vld1q_s8(kvalues_iq4nl);
        for (int j = 0; j < 8; j++) {
            const uint8x16_t v = vld1q_u8(b.qs + 16 * j);
            s.q[2 * j] = vqtbl1q_s8(table, vandq_u8(v, vdupq_n_u8(0x0f)));
            s.q[2 * j + 1] = vqtbl1q_s8(table, vshrq_n_u8(v, 4));
        }
        int8_t ls[8];
        decode_scales_iq4_xs(b, ls);
        for (int j = 0; j < 8; j++) s.sc[2 * j] = s.sc[2 * j + 1] = ls[j];
    }
};

// iq2_xxs: per group of 32, 4 grid indices (bytes of aux0) and 4 x 7 sign bits (through ksigns_iq2xs) and the
// 4-bit scale in aux1; weight = d / 8 * (2 s + 1) * q.
struct LowNIQ2XXS {
    using Block = block_iq2_xxs;
    static constexpr bool MINS = false;
    static void load(const Block& b, LowSuper& s) {
        s.d = half_f32(b.d) * 0.125f;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux0, aux1;
            std::memcpy(&aux0, b.qs + 4 * ib, 4);
            std::memcpy(&aux1, b.qs + 4 * ib + 2, 4);
            for (int h = 0; h < 2; h++) {
                const int l = 2 * h;
                s.q[2 * ib + h] = grid16(iq2xxs_grid[(aux0 >> (8 * l)) & 0xff], iq2xxs_grid[(aux0 >> (8 * l + 8)) & 0xff],
                                         ksigns_iq2xs[(aux1 >> (7 * l)) & 127], ksigns_iq2xs[(aux1 >> (7 * l + 7)) & 127]);
            }
            s.sc[2 * ib] = s.sc[2 * ib + 1] = (int32_t)(2 * (aux1 >> 28) + 1);
        }
    }
};

// iq2_xs: 9-bit grid index and 7 sign bits per 8 weights; scales 2 s + 1 per group of 16.
struct LowNIQ2XS {
    using Block = block_iq2_xs;
    static constexpr bool MINS = false;
    static void load(const Block& b, LowSuper& s) {
        s.d = half_f32(b.d) * 0.125f;
        for (int g = 0; g < 16; g++) {
            const uint16_t q0 = b.qs[2 * g], q1 = b.qs[2 * g + 1];
            s.q[g] = grid16(iq2xs_grid[q0 & 511], iq2xs_grid[q1 & 511], ksigns_iq2xs[q0 >> 9], ksigns_iq2xs[q1 >> 9]);
        }
        nibble_scales16(b.scales, s.sc);
    }
};

// iq2_s: 10-bit grid index (qs and 2 bits of qh) and a plain sign byte per 8 weights; scales as iq2_xs.
struct LowNIQ2S {
    using Block = block_iq2_s;
    static constexpr bool MINS = false;
    static int index(const Block& b, int i) { return b.qs[i] | (((b.qh[i / 4] >> (2 * (i % 4))) & 3) << 8); }
    static void load(const Block& b, LowSuper& s) {
        s.d = half_f32(b.d) * 0.125f;
        for (int g = 0; g < 16; g++)
            s.q[g] = grid16(iq2s_grid[index(b, 2 * g)], iq2s_grid[index(b, 2 * g + 1)], b.qs[32 + 2 * g],
                            b.qs[32 + 2 * g + 1]);
        nibble_scales16(b.scales, s.sc);
    }
};

// iq3_xxs: per 8 weights two iq3xxs_grid entries of 4 magnitudes and 7 sign bits (ksigns_iq2xs); per group of
// 32 a 4-bit scale; weight = d / 4 * (2 s + 1) * q.
struct LowNIQ3XXS {
    using Block = block_iq3_xxs;
    static constexpr bool MINS = false;
    static void load(const Block& b, LowSuper& s) {
        s.d = half_f32(b.d) * 0.25f;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux;
            std::memcpy(&aux, b.qs + 64 + 4 * ib, 4);
            const uint8_t* q = b.qs + 8 * ib;
            uint64_t g[4];
            for (int l = 0; l < 4; l++) g[l] = iq3xxs_grid[q[2 * l]] | (uint64_t)iq3xxs_grid[q[2 * l + 1]] << 32;
            for (int h = 0; h < 2; h++)
                s.q[2 * ib + h] = grid16(g[2 * h], g[2 * h + 1], ksigns_iq2xs[(aux >> (14 * h)) & 127],
                                         ksigns_iq2xs[(aux >> (14 * h + 7)) & 127]);
            s.sc[2 * ib] = s.sc[2 * ib + 1] = (int32_t)(2 * (aux >> 28) + 1);
        }
    }
};

// iq3_s: a 9-bit iq3s_grid index (qs and a bit of qh) per 4 weights, one plain sign bit per weight; scales
// 2 s + 1 per group of 32.
struct LowNIQ3S {
    using Block = block_iq3_s;
    static constexpr bool MINS = false;
    static uint32_t grid(const Block& b, int i) { return iq3s_grid[b.qs[i] | (((b.qh[i / 8] >> (i % 8)) & 1) << 8)]; }
    static void load(const Block& b, LowSuper& s) {
        s.d = half_f32(b.d);
        for (int g = 0; g < 16; g++) {
            const uint64_t g0 = grid(b, 4 * g) | (uint64_t)grid(b, 4 * g + 1) << 32;
            const uint64_t g1 = grid(b, 4 * g + 2) | (uint64_t)grid(b, 4 * g + 3) << 32;
            s.q[g] = grid16(g0, g1, b.signs[2 * g], b.signs[2 * g + 1]);
        }
        for (int j = 0; j < 8; j++) s.sc[2 * j] = s.sc[2 * j + 1] = 2 * ((b.scales[j / 2] >> (4 * (j % 2))) & 0xf) + 1;
    }
};

// iq1_s / iq1_m: two iq1s_grid entries (values -1, 0, 1) as q = 8 g + delta, delta +1 or -1 per entry.
inline int8x16_t iq1_16(uint64_t g0, uint64_t g1, int d0, int d1) {
    const int8x16_t g = vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(g0), vcreate_u64(g1)));
    return vaddq_s8(vshlq_n_s8(g, 3), vcombine_s8(vdup_n_s8((int8_t)d0), vdup_n_s8((int8_t)d1)));
}

// iq1_s: per 8 weights an 11-bit index (qs and 3 bits of qh[j]); per group of 32 (qh[j]) the delta's sign and
// 2 s + 1; weight = d / 8 * (2 s + 1) * q.
struct LowNIQ1S {
    using Block = block_iq1_s;
    static constexpr bool MINS = false;
    static void load(const Block& b, LowSuper& s) {
        s.d = half_f32(b.d) * 0.125f;
        for (int ib = 0; ib < 8; ib++) {
            const int h = b.qh[ib], delta = (h & 0x8000) ? -1 : 1;
            for (int k = 0; k < 2; k++) {
                const int l = 2 * k;
                s.q[2 * ib + k] = iq1_16(iq1s_grid[b.qs[4 * ib + l] | (((h >> (3 * l)) & 7) << 8)],
                                         iq1s_grid[b.qs[4 * ib + l + 1] | (((h >> (3 * l + 3)) & 7) << 8)], delta, delta);
            }
            s.sc[2 * ib] = s.sc[2 * ib + 1] = 2 * ((h >> 12) & 7) + 1;
        }
    }
};

// iq1_m: per 8 weights i an 11-bit index and the delta's sign (qs[i], the nibble of qh[i / 2]); 2 s + 1 per group
// of 16 and the fp16 d from the scale words (lowbit.h).
struct LowNIQ1M {
    using Block = block_iq1_m;
    static constexpr bool MINS = false;
    static void load(const Block& b, LowSuper& s) {
        s.d = half_f32(iq1m_d(b)) * 0.125f;
        uint16_t w[4];
        iq1m_words(b, w);
        for (int g = 0; g < 16; g++) {
            const int h = b.qh[g];  // nibbles of entries 2 g, 2 g + 1
            s.q[g] = iq1_16(iq1s_grid[b.qs[2 * g] | ((h & 7) << 8)], iq1s_grid[b.qs[2 * g + 1] | (((h >> 4) & 7) << 8)],
                            (h & 0x08) ? -1 : 1, (h & 0x80) ? -1 : 1);
            s.sc[g] = 2 * ((w[g / 4] >> (3 * (g % 4))) & 7) + 1;
        }
    }
};

template <typename U>
struct TileLow256 {
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            using Block = typename U::Block;
            float acc[RM][RN] = {};
            const int64_t nb = a.K / QK_K;
            LowSuper s[RM];
            for (int64_t b = 0; b < nb; b++) {
                for (int r = 0; r < RM; r++) U::load(((const Block*)(a.W + (n + r) * a.wrb))[b], s[r]);
                for (int t = 0; t < RN; t++) {
                    const block_q8_K& x = ((const block_q8_K*)(a.X + (m + t) * a.xrb))[b];
                    int32x4_t sum[RM];
                    for (int r = 0; r < RM; r++) sum[r] = vdupq_n_s32(0);
                    for (int g = 0; g < 16; g++) {
                        const int8x16_t xv = vld1q_s8(x.qs + 16 * g);
                        for (int r = 0; r < RM; r++)
                            sum[r] = vmlaq_n_s32(sum[r], dot16(vdupq_n_s32(0), s[r].q[g], xv), s[r].sc[g]);
                    }
                    for (int r = 0; r < RM; r++) {
                        // the reference's x.d * d * sum_q (- x.d * dmin * sum_m), added to the row's sum
                        float v = x.d * s[r].d * (float)vaddvq_s32(sum[r]);
                        if constexpr (U::MINS) {
                            const int16x8_t m0 = vld1q_s16(s[r].mins), m1 = vld1q_s16(s[r].mins + 8);
                            const int16x8_t b0 = vld1q_s16(x.bsums), b1 = vld1q_s16(x.bsums + 8);
                            int32x4_t sm = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
                            sm = vmlal_high_s16(sm, m0, b0);
                            sm = vmlal_s16(sm, vget_low_s16(m1), vget_low_s16(b1));
                            sm = vmlal_high_s16(sm, m1, b1);
                            v -= x.d * s[r].dmin * (float)vaddvq_s32(sm);
                        }
                        acc[r][t] += v;
                    }
                }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + r] = acc[r][t];
        }
    };
};

// Blocks of 32 as 2 x 16 int8 (weights 0..15, 16..31: low nibbles, high nibbles) and the block's float factor.
inline void nibbles2(const uint8_t* qs, uint8x16_t q[2]) {
    const uint8x16_t v = vld1q_u8(qs);
    q[0] = vandq_u8(v, vdupq_n_u8(0x0f));
    q[1] = vshrq_n_u8(v, 4);
}
// bit j of qh (4 bytes) as bit 4 of weight j
inline void or_fifth_bits(const uint8_t qh[4], uint8x16_t q[2]) {
    const uint8x16_t bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    for (int h = 0; h < 2; h++) {
        const uint8x16_t set = vtstq_u8(vcombine_u8(vdup_n_u8(qh[2 * h]), vdup_n_u8(qh[2 * h + 1])), bit);
        q[h] = vorrq_u8(q[h], vandq_u8(set, vdupq_n_u8(0x10)));
    }
}

// q4_1, q5_1 (unsigned codes: weight = d q + m; q5_1 with a fifth bit) and q5_0 (q - 16 with the fifth bit)
template <typename B, bool FIFTH, int OFFSET>
struct Low32Bits {
    using Block = B;
    static void load(const Block& b, int8x16_t w[2]) {
        uint8x16_t q[2];
        nibbles2(b.qs, q);
        if constexpr (FIFTH) or_fifth_bits(b.qh, q);
        for (int h = 0; h < 2; h++) {
            w[h] = vreinterpretq_s8_u8(q[h]);
            if constexpr (OFFSET != 0) w[h] = vsubq_s8(w[h], vdupq_n_s8(OFFSET));
        }
    }
    static float d(const Block& b) { return half_f32(b.d); }
};
template <typename B, const int8_t* TABLE>
struct Low32Table {
    using Block = B;
    static void load(const Block& b, int8x16_t w[2]) {
        uint8x16_t q[2];
        nibbles2(b.qs, q);
        const int8x16_t t = vld1q_s8(TABLE);
        w[0] = vqtbl1q_s8(t, q[0]);
        w[1] = vqtbl1q_s8(t, q[1]);
    }
    static float d(const Block& b) {
        if constexpr (std::is_same_v<B, block_mxfp4>)
            return e8m0_to_fp32_half(b.e);
        else
            return half_f32(b.d);
    }
};

template <typename U>
struct TileLow32 {
    template <int RM, int RN>
    struct T {
        static void run(const Args& a, int64_t n, int m) {
            using Block = typename U::Block;
            // q4_1 / q5_1: weight = d q + m, the m part against the block's activation sum
            constexpr bool MIN = std::is_same_v<Block, block_q4_1> || std::is_same_v<Block, block_q5_1>;
            float acc[RM][RN] = {};
            const int64_t nb = a.K / QK;
            for (int64_t b = 0; b < nb; b++) {
                int8x16_t w[RM][2];
                float dw[RM], mw[RM] = {};
                for (int r = 0; r < RM; r++) {
                    const Block& blk = ((const Block*)(a.W + (n + r) * a.wrb))[b];
                    U::load(blk, w[r]);
                    dw[r] = U::d(blk);
                    if constexpr (MIN) mw[r] = half_f32(blk.m);
                }
                for (int t = 0; t < RN; t++) {
                    const block_q8_a& x = ((const block_q8_a*)(a.X + (m + t) * a.xrb))[b];
                    const int8x16_t x0 = vld1q_s8(x.qs), x1 = vld1q_s8(x.qs + 16);
                    int32_t sx = 0;
                    if constexpr (MIN) sx = (int32_t)vaddlvq_s8(x0) + (int32_t)vaddlvq_s8(x1);
                    for (int r = 0; r < RM; r++) {
                        const int32_t s = vaddvq_s32(dot16(dot16(vdupq_n_s32(0), w[r][0], x0), w[r][1], x1));
                        // the reference's d * x.d * s (+ m * x.d * sum x), added to the row's sum
                        float v = dw[r] * x.d * (float)s;
                        if constexpr (MIN) v += mw[r] * x.d * (float)sx;
                        acc[r][t] += v;
                    }
                }
            }
            for (int r = 0; r < RM; r++)
                for (int t = 0; t < RN; t++) a.Y[(m + t) * a.ldy + n + r] = acc[r][t];
        }
    };
};

template <int RM, int RN>
using TileQ2_K = TileLow256<LowNQ2K>::T<RM, RN>;
template <int RM, int RN>
using TileQ3_K = TileLow256<LowNQ3K>::T<RM, RN>;
template <int RM, int RN>
using TileIQ4_XS = TileLow256<LowNIQ4XS>::T<RM, RN>;
template <int RM, int RN>
using TileIQ2_XXS = TileLow256<LowNIQ2XXS>::T<RM, RN>;
template <int RM, int RN>
using TileIQ2_XS = TileLow256<LowNIQ2XS>::T<RM, RN>;
template <int RM, int RN>
using TileIQ2_S = TileLow256<LowNIQ2S>::T<RM, RN>;
template <int RM, int RN>
using TileIQ3_XXS = TileLow256<LowNIQ3XXS>::T<RM, RN>;
template <int RM, int RN>
using TileIQ3_S = TileLow256<LowNIQ3S>::T<RM, RN>;
template <int RM, int RN>
using TileIQ1_S = TileLow256<LowNIQ1S>::T<RM, RN>;
template <int RM, int RN>
using TileIQ1_M = TileLow256<LowNIQ1M>::T<RM, RN>;
template <int RM, int RN>
using TileQ4_1 = TileLow32<Low32Bits<block_q4_1, false, 0>>::T<RM, RN>;
template <int RM, int RN>
using TileQ5_0 = TileLow32<Low32Bits<block_q5_0, true, 16>>::T<RM, RN>;
template <int RM, int RN>
using TileQ5_1 = TileLow32<Low32Bits<block_q5_1, true, 0>>::T<RM, RN>;
template <int RM, int RN>
using TileIQ4_NL = TileLow32<Low32Table<block_iq4_nl, kvalues_iq4nl>>::T<RM, RN>;
template <int RM, int RN>
using TileMXFP4 = TileLow32<Low32Table<block_mxfp4, kvalues_mxfp4>>::T<RM, RN>;

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

// iq4_xs repacked (block_iq4_xs_r16) and iq3_xxs / iq3_s transcoded into its layout (block_iq3_xxs_r16,
// block_iq3_s_r16; kernel_r16.h's Codes*): per group j (32 weights) and word t, each quad of 4 rows' 4
// codes looked up in the format's 16 signed values (vqtbl1q_s8) and multiplied by sdot by element against
// the token's 4 activations of that word, the low nibbles (weights 32 j + 4 t ..) and the high ones (+ 16)
// in two chains; each group's sums times the rows' scales in int32 (|sum| <= 32 x 127 x 127 x 63), then the
// reference's float expression per super-block (x.d x d x factor x sum), so the results equal kernels_ref's
// bit for bit with -ffp-contract=off.
template <class C>
struct TileCodes4R16 : R16SumsInMemory<TileCodes4R16<C>> {
    using Block = typename C::Block;
    static constexpr bool PAIRS = false;
    static constexpr gemm_fn ref = C::REF;
    static constexpr int GMAX = 2;

    template <Prefetch PF>
    static void prefetch(const void* p) {
        prefetch_r16<PF, 2048, 8192>(p);
    }

    // Word t of group j for G tokens: 4 quads x (low, high) x G sdot.
    template <int G, int T, Prefetch PF>
    static void word(const Block& p, int j, int8x16_t values, const int8x16_t* xl, const int8x16_t* xh,
                     int32x4_t (*sl)[4], int32x4_t (*sh)[4]) {
        const uint8_t* w = p.qs[j][T][0];  // the word's 16 rows: 64 bytes
        prefetch<PF>(w);
        for (int q = 0; q < 4; q++) {
            const uint8x16_t v = vld1q_u8(w + 16 * q);
            const int8x16_t lo = vqtbl1q_s8(values, vandq_u8(v, vdupq_n_u8(0x0f)));
            const int8x16_t hi = vqtbl1q_s8(values, vshrq_n_u8(v, 4));
            for (int g = 0; g < G; g++) {
                sl[g][q] = vdotq_laneq_s32(sl[g][q], lo, xl[g], T);
                sh[g][q] = vdotq_laneq_s32(sh[g][q], hi, xh[g], T);
            }
        }
    }

    // Super-block s of the 16 rows at p for G tokens: acc[16 g + r] += its share of row r's dot with token g.
    template <int G, Prefetch PF>
    static void superblock(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const*, float* acc) {
        const int8x16_t values = vld1q_s8(C::VALUES);
        int32x4_t sq[G][4];  // sum over groups of scale x dot, per row
        for (int g = 0; g < G; g++)
            for (int q = 0; q < 4; q++) sq[g][q] = vdupq_n_s32(0);
        for (int j = 0; j < 8; j++) {
            int32x4_t sl[G][4], sh[G][4];
            int8x16_t xl[G], xh[G];
            for (int g = 0; g < G; g++) {
                for (int q = 0; q < 4; q++) sl[g][q] = sh[g][q] = vdupq_n_s32(0);
                xl[g] = vld1q_s8(xs[g][s].qs + 32 * j);
                xh[g] = vld1q_s8(xs[g][s].qs + 32 * j + 16);
            }
            word<G, 0, PF>(p, j, values, xl, xh, sl, sh);
            word<G, 1, PF>(p, j, values, xl, xh, sl, sh);
            word<G, 2, PF>(p, j, values, xl, xh, sl, sh);
            word<G, 3, PF>(p, j, values, xl, xh, sl, sh);
            // the 16 rows' scales of group j as int32, 4 per quad
            const int8x16_t b = vld1q_s8(p.sc[j]);
            const int16x8_t h[2] = {vmovl_s8(vget_low_s8(b)), vmovl_high_s8(b)};
            for (int q = 0; q < 4; q++) {
                const int32x4_t sc = q % 2 ? vmovl_high_s16(h[q / 2]) : vmovl_s16(vget_low_s16(h[q / 2]));
                for (int g = 0; g < G; g++) sq[g][q] = vmlaq_s32(sq[g][q], vaddq_s32(sl[g][q], sh[g][q]), sc);
            }
        }
        for (int q = 0; q < 4; q++) {
            float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p.d + 4 * q)));
            if constexpr (C::FACTOR != 1.f) d = vmulq_n_f32(d, C::FACTOR);
            for (int g = 0; g < G; g++) {
                float* a = acc + 16 * g + 4 * q;
                const float32x4_t v = vmulq_f32(vmulq_n_f32(d, xs[g][s].d), vcvtq_f32_s32(sq[g][q]));
                vst1q_f32(a, vaddq_f32(vld1q_f32(a), v));
            }
        }
    }
};

// iq4_nl and mxfp4 repacked (block_iq4_nl_r16, block_mxfp4_r16; kernel_r16.h's Blocks*): TileCodes4R16's words
// with a float scale per block of 32 and row, and the activations in blocks of 32 with their own scales
// (block_q8_a, as the file layouts' products take them): per block j and quad of 4 rows, the low and high
// nibbles' sdot chains summed, then the reference's float expression per block (d x d_x x sum) added to the
// row's running sum in block order, so the results equal kernels_ref's bit for bit with -ffp-contract=off.
template <class C>
struct TileNL4R16 : R16SumsInMemory<TileNL4R16<C>> {
    using Block = typename C::Block;
    static constexpr bool PAIRS = false;
    static constexpr bool Q8A = true, BLOCK_SUMS = false;
    static constexpr gemm_fn ref = C::REF;
    static constexpr int GMAX = 2;

    // the 4 rows of quad q's scales of block j (fp16 d, or e8m0_to_fp32_half)
    static float32x4_t scales(const Block& p, int j, int q) {
        if constexpr (!C::E8M0) {
            return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p.d[j] + 4 * q)));
        } else {
            float f[4];
            for (int r = 0; r < 4; r++) f[r] = e8m0_to_fp32_half(p.e[j][4 * q + r]);
            return vld1q_f32(f);
        }
    }

    template <int G, Prefetch PF>
    static void superblock(const Block& p, int64_t s, const block_q8_K* const* xs, const int32_t* const*, float* acc) {
        const int8x16_t values = vld1q_s8(C::VALUES);
        float32x4_t sum[G][4];
        for (int g = 0; g < G; g++)
            for (int q = 0; q < 4; q++) sum[g][q] = vld1q_f32(acc + 16 * g + 4 * q);
        for (int j = 0; j < 8; j++) {
            const block_q8_a* x[G];
            int32x4_t sl[G][4], sh[G][4];
            int8x16_t xl[G], xh[G];
            for (int g = 0; g < G; g++) {
                x[g] = (const block_q8_a*)(const void*)xs[g] + 8 * s + j;
                for (int q = 0; q < 4; q++) sl[g][q] = sh[g][q] = vdupq_n_s32(0);
                xl[g] = vld1q_s8(x[g]->qs);
                xh[g] = vld1q_s8(x[g]->qs + 16);
            }
            TileCodes4R16<C>::template word<G, 0, PF>(p, j, values, xl, xh, sl, sh);
            TileCodes4R16<C>::template word<G, 1, PF>(p, j, values, xl, xh, sl, sh);
            TileCodes4R16<C>::template word<G, 2, PF>(p, j, values, xl, xh, sl, sh);
            TileCodes4R16<C>::template word<G, 3, PF>(p, j, values, xl, xh, sl, sh);
            for (int q = 0; q < 4; q++) {
                const float32x4_t d = scales(p, j, q);
                for (int g = 0; g < G; g++) {
                    const float32x4_t v = vmulq_f32(vmulq_n_f32(d, x[g]->d), vcvtq_f32_s32(vaddq_s32(sl[g][q], sh[g][q])));
                    sum[g][q] = vaddq_f32(sum[g][q], v);
                }
            }
        }
        for (int g = 0; g < G; g++)
            for (int q = 0; q < 4; q++) vst1q_f32(acc + 16 * g + 4 * q, sum[g][q]);
    }
};
#endif

Kernels make_neon() {
    Kernels k = {
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
    k.gemm_q4_1 = gemm_tiled<TileQ4_1, 4, 2>;
    k.gemm_q5_0 = gemm_tiled<TileQ5_0, 4, 2>;
    k.gemm_q5_1 = gemm_tiled<TileQ5_1, 4, 2>;
    k.gemm_iq4_nl = gemm_tiled<TileIQ4_NL, 4, 2>;
    k.gemm_mxfp4 = gemm_tiled<TileMXFP4, 4, 2>;
    k.gemm_q2_K = gemm_tiled<TileQ2_K, 4, 2>;
    k.gemm_q3_K = gemm_tiled<TileQ3_K, 4, 2>;
    k.gemm_iq4_xs = gemm_tiled<TileIQ4_XS, 4, 2>;
    k.gemm_iq2_xxs = gemm_tiled<TileIQ2_XXS, 4, 2>;
    k.gemm_iq2_xs = gemm_tiled<TileIQ2_XS, 4, 2>;
    k.gemm_iq2_s = gemm_tiled<TileIQ2_S, 4, 2>;
    k.gemm_iq3_xxs = gemm_tiled<TileIQ3_XXS, 4, 2>;
    k.gemm_iq3_s = gemm_tiled<TileIQ3_S, 4, 2>;
    k.gemm_iq1_s = gemm_tiled<TileIQ1_S, 4, 2>;
    k.gemm_iq1_m = gemm_tiled<TileIQ1_M, 4, 2>;
#if defined(CLOVER_NEON_DOTPROD)
    k.gemm_iq4_xs_r16 = gemm_r16<TileCodes4R16<CodesIQ4XS>>;
    k.gemm_iq3_xxs_r16 = gemm_r16<TileCodes4R16<CodesIQ3XXS>>;
    k.gemm_iq3_s_r16 = gemm_r16<TileCodes4R16<CodesIQ3S>>;
    k.gemm_iq4_nl_r16 = gemm_r16<TileNL4R16<BlocksIQ4NL>>;
    k.gemm_mxfp4_r16 = gemm_r16<TileNL4R16<BlocksMXFP4>>;
#endif
    return k;
}

const Kernels NEON = make_neon();

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
