// NEON model operators for AArch64: model_ops_avx2.cpp's algorithms, tiles and summation orders with
// each 8-float AVX register held as two 128-bit NEON registers (V8 below; AArch64 has 32 of them, so
// the register tiles of the AVX2 file fit). Elementwise ops vectorise over the row; attention tiles the
// cache by KEY_TILE rows shared by all query rows of a task (online softmax); the recurrent gated delta
// rule walks S by column blocks that stay in L1 for every token; matmul is a 4x16 register tile.
// Advanced SIMD and fp16 conversion are part of base AArch64: this file needs no -march flag.
#include <arm_neon.h>

#include <algorithm>
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

// The AVX2 file's horizontal reductions pair the halves first, then within a half: the same here.
inline float hsum(V8 v) { return vaddvq_f32(vaddq_f32(v.lo, v.hi)); }
inline float hmax(V8 v) { return vmaxvq_f32(vmaxq_f32(v.lo, v.hi)); }

inline V8 f16x8_to_8(const uint16_t* p) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(p));
    return {vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
}
inline V8 int8x8_to_8(int8x8_t q) {
    const int16x8_t w = vmovl_s8(q);
    return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vcvtq_f32_s32(vmovl_high_s16(w))};
}

// e^x as in model_ops_avx2.cpp (Cody-Waite reduction, Cephes expf's degree-5 polynomial, 2^n from the
// exponent bits): about 1 ulp; 0 below -87.34, inf above 88.72, NaN stays NaN.
inline float32x4_t exp4(float32x4_t x) {
    const float32x4_t xc = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.34f)), vdupq_n_f32(88.72f));
    float32x4_t n = vrndnq_f32(vmulq_f32(xc, vdupq_n_f32(1.44269504088896341f)));
    n = vminq_f32(n, vdupq_n_f32(127.f));
    float32x4_t r = vfmsq_f32(xc, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
    float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    y = vbslq_f32(vcgtq_f32(x, vdupq_n_f32(88.7228f)), vdupq_n_f32(INFINITY), y);
    y = vbslq_f32(vcltq_f32(x, vdupq_n_f32(-87.3365f)), vdupq_n_f32(0.f), y);
    return vbslq_f32(vceqq_f32(x, x), y, x);  // NaN lanes keep x
}
inline V8 exp8(V8 x) { return {exp4(x.lo), exp4(x.hi)}; }

inline V8 sigmoid8(V8 x) {
    const V8 one = set8(1.f);
    return div8(one, add8(one, exp8(sub8(zero8(), x))));
}
inline V8 silu8(V8 x) {
    const V8 one = set8(1.f);
    return div8(x, add8(one, exp8(sub8(zero8(), x))));
}
inline float sigmoid1(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float silu1(float x) { return x / (1.f + std::exp(-x)); }

float sum_sq(const float* x, int64_t d) {
    V8 a0 = zero8(), a1 = zero8();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        const V8 x0 = load8(x + i), x1 = load8(x + i + 8);
        a0 = fma8(x0, x0, a0);
        a1 = fma8(x1, x1, a1);
    }
    for (; i + 8 <= d; i += 8) {
        const V8 x0 = load8(x + i);
        a0 = fma8(x0, x0, a0);
    }
    float s = hsum(add8(a0, a1));
    for (; i < d; i++) s += x[i] * x[i];
    return s;
}

// ---- norms and elementwise ----

void rms_norm_neon(const float* x, const float* w, int64_t d, float eps, float* y) {
    const float inv = 1.f / std::sqrt(sum_sq(x, d) / (float)d + eps);
    const V8 vi = set8(inv);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
        store8(y + i, mul8(mul8(load8(x + i), vi), load8(w + i)));
    for (; i < d; i++) y[i] = x[i] * inv * w[i];
}

void gated_rms_norm_neon(const float* o, const float* z, const float* w, int64_t d, float eps, float* y) {
    const float inv = 1.f / std::sqrt(sum_sq(o, d) / (float)d + eps);
    const V8 vi = set8(inv);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
        const V8 n = mul8(load8(w + i), mul8(load8(o + i), vi));
        store8(y + i, mul8(n, silu8(load8(z + i))));
    }
    for (; i < d; i++) y[i] = w[i] * (o[i] * inv) * silu1(z[i]);
}

void l2_norm_neon(const float* x, int64_t d, float scale, float* y) {
    const float inv = 1.f / std::sqrt(sum_sq(x, d) + 1e-6f);
    const V8 vi = set8(inv), vs = set8(scale);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) store8(y + i, mul8(mul8(load8(x + i), vi), vs));
    for (; i < d; i++) y[i] = x[i] * inv * scale;
}

void swiglu_neon(const float* gate, const float* up, int64_t n, float* y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8(y + i, mul8(silu8(load8(gate + i)), load8(up + i)));
    for (; i < n; i++) y[i] = silu1(gate[i]) * up[i];
}

void sigmoid_mul_neon(const float* x, const float* gate, int64_t n, float* y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8(y + i, mul8(load8(x + i), sigmoid8(load8(gate + i))));
    for (; i < n; i++) y[i] = x[i] * sigmoid1(gate[i]);
}

// ---- causal depthwise conv: 8 channels per vector, taps transposed once per channel group ----

void conv1d_silu_neon(const float* x, const float* w, const float* state, int64_t T, int64_t C, int64_t K, int64_t c0,
                      int64_t c1, float* y) {
    thread_local std::vector<float> wt;
    wt.resize(K * 8);
    auto row = [&](int64_t r) { return r < K - 1 ? state + r * C : x + (r - (K - 1)) * C; };
    int64_t c = c0;
    for (; c + 8 <= c1; c += 8) {
        for (int64_t j = 0; j < K; j++)
            for (int l = 0; l < 8; l++) wt[j * 8 + l] = w[(c + l) * K + j];
        for (int64_t t = 0; t < T; t++) {
            V8 acc = zero8();
            for (int64_t j = 0; j < K; j++)
                acc = fma8(load8(&wt[j * 8]), load8(row(t + j) + c), acc);
            store8(y + t * C + c, silu8(acc));
        }
    }
    for (; c < c1; c++)
        for (int64_t t = 0; t < T; t++) {
            float acc = 0.f;
            for (int64_t j = 0; j < K; j++) acc += w[c * K + j] * row(t + j)[c];
            y[t * C + c] = silu1(acc);
        }
}

// ---- attention ----

constexpr int64_t KEY_TILE = 32;  // cache rows per tile: fp32 K and V tiles of D=256 take 32 KB each
constexpr int MAX_GROUP = 4;      // query rows sharing each loaded key and value vector

// out[r][j] = dot(q[r], K row j) for j in [j0, j1), R query rows x KB keys per register tile; one
// accumulator per (row, key) over D in 8-wide steps, then the scalar tail: every value is computed
// the same way whatever R, KB and the grouping (results do not depend on how rows are grouped).
template <int R, int KB>
void qk_dots(const float* const* q, const float* K, int64_t ld, int64_t j0, int64_t j1, int64_t D, float* const* out) {
    const int64_t D8 = D & ~int64_t(7);
    auto finish = [&](int r, int64_t j, V8 acc) {
        float s = hsum(acc);
        const float* k = K + j * ld;
        for (int64_t d = D8; d < D; d++) s += q[r][d] * k[d];
        out[r][j] = s;
    };
    int64_t j = j0;
    for (; j + KB <= j1; j += KB) {
        V8 acc[R][KB];
        for (int r = 0; r < R; r++)
            for (int u = 0; u < KB; u++) acc[r][u] = zero8();
        for (int64_t d = 0; d < D8; d += 8) {
            V8 kv[KB];
            for (int u = 0; u < KB; u++) kv[u] = load8(K + (j + u) * ld + d);
            for (int r = 0; r < R; r++) {
                const V8 qv = load8(q[r] + d);
                for (int u = 0; u < KB; u++) acc[r][u] = fma8(qv, kv[u], acc[r][u]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int u = 0; u < KB; u++) finish(r, j + u, acc[r][u]);
    }
    for (; j < j1; j++) {
        V8 acc[R];
        for (int r = 0; r < R; r++) acc[r] = zero8();
        for (int64_t d = 0; d < D8; d += 8) {
            const V8 kv = load8(K + j * ld + d);
            for (int r = 0; r < R; r++) acc[r] = fma8(load8(q[r] + d), kv, acc[r]);
        }
        for (int r = 0; r < R; r++) finish(r, j, acc[r]);
    }
}

// acc[r] = acc[r] * corr[r] + sum_{j in [j0, j1)} p[r][j] * V row j for R rows, 8 NV columns at a
// time; keys in order, so every value is computed the same way whatever R and NV.
template <int R, int NV>
void pv_accumulate(float* const* acc, const float* corr, const float* const* p, const float* V, int64_t ld, int64_t j0,
                   int64_t j1, int64_t D) {
    int64_t d = 0;
    for (; d + 8 * NV <= D; d += 8 * NV) {
        V8 o[R][NV];
        for (int r = 0; r < R; r++) {
            const V8 c = set8(corr[r]);
            for (int u = 0; u < NV; u++) o[r][u] = mul8(load8(acc[r] + d + 8 * u), c);
        }
        for (int64_t j = j0; j < j1; j++) {
            V8 v[NV];
            for (int u = 0; u < NV; u++) v[u] = load8(V + j * ld + d + 8 * u);
            for (int r = 0; r < R; r++) {
                const V8 pj = set8(p[r][j]);
                for (int u = 0; u < NV; u++) o[r][u] = fma8(pj, v[u], o[r][u]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int u = 0; u < NV; u++) store8(acc[r] + d + 8 * u, o[r][u]);
    }
    for (; d + 8 <= D; d += 8) {
        V8 o[R];
        for (int r = 0; r < R; r++) o[r] = mul8(load8(acc[r] + d), set8(corr[r]));
        for (int64_t j = j0; j < j1; j++) {
            const V8 v = load8(V + j * ld + d);
            for (int r = 0; r < R; r++) o[r] = fma8(set8(p[r][j]), v, o[r]);
        }
        for (int r = 0; r < R; r++) store8(acc[r] + d, o[r]);
    }
    for (; d < D; d++)
        for (int r = 0; r < R; r++) {
            float s = acc[r][d] * corr[r];
            for (int64_t j = j0; j < j1; j++) s = std::fma(p[r][j], V[j * ld + d], s);
            acc[r][d] = s;
        }
}

// One task of attention_neon: online softmax (flash-attention style) over key tiles. Query rows
// r = (token, head), token-major, in groups of up to MAX_GROUP rows that share every loaded key
// and value vector; each row keeps its running max m, sum l and unnormalised output acc.
struct AttnTile {
    const AttnArgs& a;
    int64_t nh, h0, t0;
    float *acc, *m, *l, *sc;  // acc [nr, D]; m, l [nr]; sc [MAX_GROUP, KEY_TILE] scores then weights

    const float* q_row(int64_t r) const { return a.q + ((t0 + r / nh) * a.n_head + h0 + r % nh) * a.D; }

    // Scale one row's scores, update its max and sum; s becomes exp(score - m_new). Returns the
    // factor exp(m_old - m_new) that rescales the row's accumulated output.
    float softmax_step(int64_t r, float* s, int64_t n) {
        const V8 vs = set8(a.scale);
        V8 vm = set8(-INFINITY);
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
            const V8 x = mul8(load8(s + j), vs);
            store8(s + j, x);
            vm = max8(vm, x);
        }
        float mt = hmax(vm);
        for (; j < n; j++) {
            s[j] *= a.scale;
            mt = std::max(mt, s[j]);
        }
        const float m_new = std::max(m[r], mt);
        const float corr = m[r] == m_new ? 1.f : std::exp(m[r] - m_new);
        const V8 vmn = set8(m_new);
        V8 vsum = zero8();
        for (j = 0; j + 8 <= n; j += 8) {
            const V8 p = exp8(sub8(load8(s + j), vmn));
            store8(s + j, p);
            vsum = add8(vsum, p);
        }
        float sum = hsum(vsum);
        for (; j < n; j++) {
            s[j] = std::exp(s[j] - m_new);
            sum += s[j];
        }
        m[r] = m_new;
        l[r] = l[r] * corr + sum;
        return corr;
    }

    // Rows rows[0..R) see keys [0, n[i]) of the tile K, V: shared loads over the keys all of them
    // see, then each longer row alone.
    template <int R>
    void group(const int64_t* rows, const int64_t* n, const float* K, const float* V, int64_t ld) {
        constexpr int KB = R >= 3 ? 3 : 4;  // R x KB score accumulators
        constexpr int NV = R >= 3 ? 2 : 4;  // R x NV output accumulators
        const float* qs[R];
        float* ss[R];
        float* accs[R];
        float corr[R];
        int64_t lo = KEY_TILE;
        for (int i = 0; i < R; i++) {
            qs[i] = q_row(rows[i]);
            ss[i] = sc + i * KEY_TILE;
            accs[i] = acc + rows[i] * a.D;
            lo = std::min(lo, n[i]);
        }
        qk_dots<R, KB>(qs, K, ld, 0, lo, a.D, ss);
        for (int i = 0; i < R; i++)
            if (n[i] > lo) qk_dots<1, 4>(qs + i, K, ld, lo, n[i], a.D, ss + i);
        for (int i = 0; i < R; i++) corr[i] = softmax_step(rows[i], ss[i], n[i]);
        const float* ps[R];
        for (int i = 0; i < R; i++) ps[i] = ss[i];
        pv_accumulate<R, NV>(accs, corr, ps, V, ld, 0, lo, a.D);
        const float one = 1.f;
        for (int i = 0; i < R; i++)
            if (n[i] > lo) pv_accumulate<1, 4>(accs + i, &one, ps + i, V, ld, lo, n[i], a.D);
    }
};

// Q8_0 cache rows to fp32: n rows of D values (D / 32 blocks of 34 bytes each, rows `stride` bytes
// apart), prefetching the same rows `ahead` bytes further on when asked.
void q8_0_rows_to_f32(const uint8_t* src, int64_t stride, int64_t n, int64_t D, float* dst, int64_t ahead) {
    for (int64_t j = 0; j < n; j++, src += stride, dst += D) {
        for (int64_t b = 0; b < D / KV_Q8_BLOCK; b++) {
            const uint8_t* blk = src + b * KV_Q8_BLOCK_BYTES;
            if (ahead && b % 2 == 0) __builtin_prefetch(blk + ahead);
            uint16_t dh;
            std::memcpy(&dh, blk, 2);
            const V8 sc = set8(fp16_to_f32(dh));
            for (int u = 0; u < 4; u++)
                store8(dst + b * KV_Q8_BLOCK + 8 * u, mul8(sc, int8x8_to_8(vld1_s8((const int8_t*)(blk + 2 + 8 * u)))));
        }
    }
}

template <KvType KV>
void attention_neon(const AttnArgs& a, int64_t g, int64_t h0, int64_t h1, int64_t t0, int64_t t1) {
    constexpr bool F16 = KV == KvType::F16, CONVERT = KV != KvType::F32;
    const int64_t D = a.D, nh = h1 - h0, nr = nh * (t1 - t0), kv_stride = a.n_head_kv * D;
    thread_local std::vector<float> buf;
    // K then V tile, [KEY_TILE, D] each (converted caches only); then acc [nr, D], m, l [nr], scores
    // [MAX_GROUP, KEY_TILE]
    float* tiles = aligned_floats(buf, (CONVERT ? 2 * KEY_TILE * D : 0) + nr * D + 2 * nr + MAX_GROUP * KEY_TILE);
    float* acc = tiles + (CONVERT ? 2 * KEY_TILE * D : 0);
    AttnTile tile{a, nh, h0, t0, acc, acc + nr * D, acc + nr * D + nr, acc + nr * D + 2 * nr};
    std::fill(acc, acc + nr * D, 0.f);
    std::fill(tile.m, tile.m + nr, -INFINITY);
    std::fill(tile.l, tile.l + nr, 0.f);
    int64_t L_max = 0;
    for (int64_t t = t0; t < t1; t++) L_max = std::max<int64_t>(L_max, a.limit[t]);

    for (int64_t s0 = 0; s0 < L_max; s0 += KEY_TILE) {
        const int64_t ns = std::min(KEY_TILE, L_max - s0);
        const float *K, *V;
        int64_t ld;
        if (F16) {
            const uint16_t* kc = (const uint16_t*)a.k + s0 * kv_stride + g * D;
            const uint16_t* vc = (const uint16_t*)a.v + s0 * kv_stride + g * D;
            for (int64_t j = 0; j < ns; j++) {
                float* kt = tiles + j * D;
                float* vt = tiles + (KEY_TILE + j) * D;
                const uint16_t* kr = kc + j * kv_stride;
                const uint16_t* vr = vc + j * kv_stride;
                int64_t d = 0;
                for (; d + 8 <= D; d += 8) {
                    if (d % 32 == 0 && s0 + KEY_TILE + j < L_max) {  // the same row of the next tile
                        __builtin_prefetch(kr + KEY_TILE * kv_stride + d);
                        __builtin_prefetch(vr + KEY_TILE * kv_stride + d);
                    }
                    store8(kt + d, f16x8_to_8(kr + d));
                    store8(vt + d, f16x8_to_8(vr + d));
                }
                for (; d < D; d++) {
                    kt[d] = fp16_to_f32(kr[d]);
                    vt[d] = fp16_to_f32(vr[d]);
                }
            }
            K = tiles;
            V = tiles + KEY_TILE * D;
            ld = D;
        } else if (KV == KvType::Q8_0) {
            const int64_t hb = kv_head_bytes(KV, D), row = a.n_head_kv * hb;
            const int64_t ahead = s0 + KEY_TILE < L_max ? KEY_TILE * row : 0;  // the same rows of the next tile
            q8_0_rows_to_f32((const uint8_t*)a.k + s0 * row + g * hb, row, ns, D, tiles, ahead);
            q8_0_rows_to_f32((const uint8_t*)a.v + s0 * row + g * hb, row, ns, D, tiles + KEY_TILE * D, ahead);
            K = tiles;
            V = tiles + KEY_TILE * D;
            ld = D;
        } else {
            K = (const float*)a.k + s0 * kv_stride + g * D;
            V = (const float*)a.v + s0 * kv_stride + g * D;
            ld = kv_stride;
            const int64_t n_next = std::min(KEY_TILE, L_max - s0 - KEY_TILE);  // rows of the next tile
            for (int64_t j = 0; j < n_next; j++)
                for (int64_t d = 0; d < D; d += 16) {
                    __builtin_prefetch(K + (KEY_TILE + j) * ld + d);
                    __builtin_prefetch(V + (KEY_TILE + j) * ld + d);
                }
        }
        int64_t rows[MAX_GROUP], n[MAX_GROUP];
        for (int64_t r = 0; r < nr;) {
            int R = 0;
            for (; r < nr && R < MAX_GROUP; r++) {
                const int64_t nv = std::clamp<int64_t>(a.limit[t0 + r / nh] - s0, 0, ns);
                if (nv > 0) {
                    rows[R] = r;
                    n[R++] = nv;
                }
            }
            switch (R) {
                case 4: tile.group<4>(rows, n, K, V, ld); break;
                case 3: tile.group<3>(rows, n, K, V, ld); break;
                case 2: tile.group<2>(rows, n, K, V, ld); break;
                case 1: tile.group<1>(rows, n, K, V, ld); break;
            }
        }
    }

    for (int64_t r = 0; r < nr; r++) {
        const int64_t t = t0 + r / nh, h = h0 + r % nh;
        float* o = a.o + (t * a.n_head + h) * D;
        const float* src = acc + r * D;
        const float inv = tile.l[r] > 0.f ? 1.f / tile.l[r] : 0.f;  // no visible row: zeros
        const float* gt = a.gate ? a.gate + (t * a.n_head + h) * D : nullptr;
        const V8 vi = set8(inv);
        int64_t d = 0;
        for (; d + 8 <= D; d += 8) {
            V8 y = mul8(load8(src + d), vi);
            if (gt) y = mul8(y, sigmoid8(load8(gt + d)));
            store8(o + d, y);
        }
        for (; d < D; d++) o[d] = src[d] * inv * (gt ? sigmoid1(gt[d]) : 1.f);
    }
}

// ---- gated delta rule, recurrent ----

// Columns [j0, j0 + 8 NV) of S for every token: one sweep gives S^T k and S^T q of the old state, then
// v_new = beta (v - a S^T k), o = a S^T q + v_new (k.q), S = a S + k v_new^T. The 128 x 8NV block stays in L1.
template <int NV>
void gdn_columns(const GdnHeadArgs& a, int64_t j0, const float* decay, const float* kq) {
    const int64_t dk = a.dk, dv = a.dv;
    float* S = a.S + j0;
    for (int64_t t = 0; t < a.T; t++) {
        const float* q = a.q + t * a.q_stride;
        const float* k = a.k + t * a.k_stride;
        V8 sk[NV], sq[NV];
        for (int u = 0; u < NV; u++) sk[u] = sq[u] = zero8();
        for (int64_t i = 0; i < dk; i++) {
            const V8 ki = set8(k[i]), qi = set8(q[i]);
            for (int u = 0; u < NV; u++) {
                const V8 s = load8(S + i * dv + 8 * u);
                sk[u] = fma8(s, ki, sk[u]);
                sq[u] = fma8(s, qi, sq[u]);
            }
        }
        const V8 vd = set8(decay[t]), vb = set8(a.beta[t * a.gb_stride]);
        const V8 vkq = set8(kq[t]);
        const float* v = a.v + t * a.v_stride + j0;
        float* o = a.o + t * a.o_stride + j0;
        V8 vn[NV];
        for (int u = 0; u < NV; u++) {
            vn[u] = mul8(vb, fnma8(vd, sk[u], load8(v + 8 * u)));
            store8(o + 8 * u, fma8(vd, sq[u], mul8(vn[u], vkq)));
        }
        for (int64_t i = 0; i < dk; i++) {
            const V8 ki = set8(k[i]);
            for (int u = 0; u < NV; u++) {
                float* p = S + i * dv + 8 * u;
                store8(p, fma8(ki, vn[u], mul8(vd, load8(p))));
            }
        }
    }
}

void gdn_recurrent_neon(const GdnHeadArgs& a) {
    const int64_t dk = a.dk, dv = a.dv;
    thread_local std::vector<float> tmp;
    tmp.resize(2 * a.T);
    float* decay = tmp.data();
    float* kq = decay + a.T;
    for (int64_t t = 0; t < a.T; t++) {
        decay[t] = std::exp(a.g[t * a.gb_stride]);
        const float* q = a.q + t * a.q_stride;
        const float* k = a.k + t * a.k_stride;
        V8 acc = zero8();
        int64_t i = 0;
        for (; i + 8 <= dk; i += 8) acc = fma8(load8(k + i), load8(q + i), acc);
        float s = hsum(acc);
        for (; i < dk; i++) s += k[i] * q[i];
        kq[t] = s;
    }
    int64_t j = 0;
    for (; j + 32 <= dv; j += 32) gdn_columns<4>(a, j, decay, kq);
    for (; j + 8 <= dv; j += 8) gdn_columns<1>(a, j, decay, kq);
    for (; j < dv; j++)  // scalar columns
        for (int64_t t = 0; t < a.T; t++) {
            const float* q = a.q + t * a.q_stride;
            const float* k = a.k + t * a.k_stride;
            float sk = 0.f, sq = 0.f;
            for (int64_t i = 0; i < dk; i++) {
                sk += a.S[i * dv + j] * k[i];
                sq += a.S[i * dv + j] * q[i];
            }
            const float vn = a.beta[t * a.gb_stride] * (a.v[t * a.v_stride + j] - decay[t] * sk);
            a.o[t * a.o_stride + j] = decay[t] * sq + vn * kq[t];
            for (int64_t i = 0; i < dk; i++) a.S[i * dv + j] = decay[t] * a.S[i * dv + j] + k[i] * vn;
        }
}

// ---- small matmul for the chunked delta rule ----

// Rows [i, i + RM) x columns [j, j + 8 NV) of C = beta C + alpha A B.
template <int RM, int NV>
inline void matmul_tile(int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                        float alpha, float beta) {
    V8 acc[RM][NV];
    for (int r = 0; r < RM; r++)
        for (int u = 0; u < NV; u++) acc[r][u] = zero8();
    for (int64_t kk = 0; kk < k; kk++) {
        V8 b[NV];
        for (int u = 0; u < NV; u++) b[u] = load8(B + kk * ldb + 8 * u);
        for (int r = 0; r < RM; r++) {
            const V8 ar = set8(A[r * lda + kk]);
            for (int u = 0; u < NV; u++) acc[r][u] = fma8(ar, b[u], acc[r][u]);
        }
    }
    const V8 va = set8(alpha), vb = set8(beta);
    for (int r = 0; r < RM; r++)
        for (int u = 0; u < NV; u++) {
            float* c = C + r * ldc + 8 * u;
            const V8 x = mul8(va, acc[r][u]);
            store8(c, beta == 0.f ? x : fma8(vb, load8(c), x));
        }
}

template <int RM>
void matmul_rows(int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                 float alpha, float beta) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) matmul_tile<RM, 2>(k, A, lda, B + j, ldb, C + j, ldc, alpha, beta);
    for (; j + 8 <= n; j += 8) matmul_tile<RM, 1>(k, A, lda, B + j, ldb, C + j, ldc, alpha, beta);
    for (; j < n; j++)
        for (int r = 0; r < RM; r++) {
            float s = 0.f;
            for (int64_t kk = 0; kk < k; kk++) s += A[r * lda + kk] * B[kk * ldb + j];
            float* c = C + r * ldc + j;
            *c = beta == 0.f ? alpha * s : beta * *c + alpha * s;
        }
}

void matmul_neon(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                 int64_t ldc, float alpha, float beta) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) matmul_rows<4>(n, k, A + i * lda, lda, B, ldb, C + i * ldc, ldc, alpha, beta);
    for (; i < m; i++) matmul_rows<1>(n, k, A + i * lda, lda, B, ldb, C + i * ldc, ldc, alpha, beta);
}

const ModelKernels NEON = {
    "neon",
    rms_norm_neon,
    gated_rms_norm_neon,
    l2_norm_neon,
    swiglu_neon,
    sigmoid_mul_neon,
    conv1d_silu_neon,
    attention_neon<KvType::F32>,
    attention_neon<KvType::F16>,
    attention_neon<KvType::Q8_0>,
    gdn_recurrent_neon,
    matmul_neon,
    // Not measured on Arm hardware (only qemu here): the AVX2 table's choice for the same loop structure,
    // where the recurrent form was 2x faster at T=1 and equal at T=8-32 on Clover heads
    INT64_MAX,
};

}  // namespace

const ModelKernels* model_kernels_neon() { return &NEON; }

}  // namespace clover
