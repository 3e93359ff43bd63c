// NEON model operators for AArch64: model_ops_simd.inc (the AVX2 file's algorithms, tiles and
// summation orders) over V8 = two 128-bit NEON registers per 8 floats (AArch64 has 32 of them, so the
// register tiles fit). Advanced SIMD and fp16 conversion are part of base AArch64: no -march flag.
#include <arm_neon.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats.h"
#include "model_ops.h"

namespace clover {

namespace {

struct V8 {
    float32x4_t lo, hi;
};

inline V8 zero8() { return {vdupq_n_f32(0.f), vdupq_n_f32(0.f)}; }
inline V8 set8(float x) { return {vdupq_n_f32(x), vdupq_n_f32(x)}; }
inline V8 load8(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }
inline void store8(float* p, V8 v) {
    vst1q_f32(p, v.lo);
    vst1q_f32(p + 4, v.hi);
}
inline V8 add8(V8 a, V8 b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
inline V8 sub8(V8 a, V8 b) { return {vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)}; }
inline V8 mul8(V8 a, V8 b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
inline V8 div8(V8 a, V8 b) { return {vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)}; }
inline V8 max8(V8 a, V8 b) { return {vmaxq_f32(a.lo, b.lo), vmaxq_f32(a.hi, b.hi)}; }
inline V8 min8(V8 a, V8 b) { return {vminq_f32(a.lo, b.lo), vminq_f32(a.hi, b.hi)}; }
inline V8 fma8(V8 a, V8 b, V8 c) { return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)}; }  // a b + c
inline V8 fnma8(V8 a, V8 b, V8 c) { return {vfmsq_f32(c.lo, a.lo, b.lo), vfmsq_f32(c.hi, a.hi, b.hi)}; }  // c - a b
// 8 groups of 4 floats (p[4l + j]) -> out[j] lane l = p[4l + j]: the conv's taps of 8 channels
inline void transpose4x8(const float* p, V8 out[4]) {
    const float32x4x4_t a = vld4q_f32(p), b = vld4q_f32(p + 16);
    for (int j = 0; j < 4; j++) out[j] = {a.val[j], b.val[j]};
}
inline V8 lt_select8(V8 a, V8 b, V8 x, V8 y) {  // a < b ? x : y
    return {vbslq_f32(vcltq_f32(a.lo, b.lo), x.lo, y.lo), vbslq_f32(vcltq_f32(a.hi, b.hi), x.hi, y.hi)};
}

// The AVX2 file's horizontal reductions pair the halves first, then within a half: the same here.
inline float hsum(V8 v) { return vaddvq_f32(vaddq_f32(v.lo, v.hi)); }
inline float hmax(V8 v) { return vmaxvq_f32(vmaxq_f32(v.lo, v.hi)); }

inline V8 f16x8_to_8(const uint16_t* p) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(p));
    return {vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
}
inline V8 i8x8_to_8(const int8_t* p) {
    const int16x8_t w = vmovl_s8(vld1_s8(p));
    return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vcvtq_f32_s32(vmovl_high_s16(w))};
}

// e^x as in model_ops_avx2.cpp (model_ops.h's ExpConsts: the method, its accuracy and range)
inline float32x4_t exp4(float32x4_t x) {
    using E = ExpConsts;
    const float32x4_t xc = vminq_f32(vmaxq_f32(x, vdupq_n_f32(E::X_MIN)), vdupq_n_f32(E::X_MAX));
    float32x4_t n = vrndnq_f32(vmulq_f32(xc, vdupq_n_f32(E::LOG2E)));
    n = vminq_f32(n, vdupq_n_f32(127.f));
    float32x4_t r = vfmsq_f32(xc, n, vdupq_n_f32(E::LN2_HI));
    r = vfmsq_f32(r, n, vdupq_n_f32(E::LN2_LO));
    float32x4_t p = vdupq_n_f32(E::P0);
    for (const float c : {E::P1, E::P2, E::P3, E::P4, E::P5}) p = vfmaq_f32(vdupq_n_f32(c), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
    float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    y = vbslq_f32(vcgtq_f32(x, vdupq_n_f32(E::INF_ABOVE)), vdupq_n_f32(INFINITY), y);
    y = vbslq_f32(vcltq_f32(x, vdupq_n_f32(E::ZERO_BELOW)), vdupq_n_f32(0.f), y);
    return vbslq_f32(vceqq_f32(x, x), y, x);  // NaN lanes keep x
}
inline V8 exp8(V8 x) { return {exp4(x.lo), exp4(x.hi)}; }

// Not measured on Arm hardware (only qemu here): the AVX2 table's choice for the same loop structure,
// where the recurrent form was 2x faster at T=1 and equal at T=8-32 on Clover heads
#define CLOVER_SIMD_ISA "neon"
#define CLOVER_SIMD_GDN_CHUNKED_FROM INT64_MAX
#include "model_ops_simd.inc"

}  // namespace

const ModelKernels* model_kernels_neon() { return &TABLE; }

}  // namespace clover
