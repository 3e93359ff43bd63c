// The avx512 kernel table's model operators: AVX2's (model_ops_avx2.cpp) with the recurrent gated
// delta rule on 16-float registers. At 8 floats per register its column sweeps were ~7% of a 32- or
// 512-token forward on the bench twin (each element of the state: two multiply-adds to read it, one
// multiply and one multiply-add to update it, per token). Per element the operations are the AVX2
// kernel's, in the same order; only k.q is summed in a different order.
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "model_ops.h"

namespace clover {

namespace {

// Per token: exp(g) and k.q. (A type of this file's own: a std::vector<float> here would emit weak
// symbols compiled for AVX-512 that the linker could pick for every other file.)
struct TokenScalars {
    float decay, kq;
};

// Columns [j0, j0 + 16 NV) of S for every token (gdn_columns in model_ops_simd.inc, 16 wide).
template <int NV>
void gdn_columns16(const GdnHeadArgs& a, int64_t j0, const TokenScalars* ts) {
    const int64_t dk = a.dk, dv = a.dv;
    float* S = a.S + j0;
    for (int64_t t = 0; t < a.T; t++) {
        const float* q = a.q + t * a.q_stride;
        const float* k = a.k + t * a.k_stride;
        __m512 sk[NV], sq[NV];
        for (int u = 0; u < NV; u++) sk[u] = sq[u] = _mm512_setzero_ps();
        for (int64_t i = 0; i < dk; i++) {
            const __m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q[i]);
            for (int u = 0; u < NV; u++) {
                const __m512 s = _mm512_loadu_ps(S + i * dv + 16 * u);
                sk[u] = _mm512_fmadd_ps(s, ki, sk[u]);
                sq[u] = _mm512_fmadd_ps(s, qi, sq[u]);
            }
        }
        const __m512 vd = _mm512_set1_ps(ts[t].decay), vb = _mm512_set1_ps(a.beta[t * a.gb_stride]);
        const __m512 vkq = _mm512_set1_ps(ts[t].kq);
        const float* v = a.v + t * a.v_stride + j0;
        float* o = a.o + t * a.o_stride + j0;
        __m512 vn[NV];
        for (int u = 0; u < NV; u++) {
            vn[u] = _mm512_mul_ps(vb, _mm512_fnmadd_ps(vd, sk[u], _mm512_loadu_ps(v + 16 * u)));
            _mm512_storeu_ps(o + 16 * u, _mm512_fmadd_ps(vd, sq[u], _mm512_mul_ps(vn[u], vkq)));
        }
        for (int64_t i = 0; i < dk; i++) {
            const __m512 ki = _mm512_set1_ps(k[i]);
            for (int u = 0; u < NV; u++) {
                float* p = S + i * dv + 16 * u;
                _mm512_storeu_ps(p, _mm512_fmadd_ps(ki, vn[u], _mm512_mul_ps(vd, _mm512_loadu_ps(p))));
            }
        }
    }
}

void gdn_recurrent_avx512(const GdnHeadArgs& a) {
    const int64_t dk = a.dk, dv = a.dv;
    thread_local std::vector<TokenScalars> tmp;
    tmp.resize(a.T);
    TokenScalars* ts = tmp.data();
    for (int64_t t = 0; t < a.T; t++) {
        ts[t].decay = std::exp(a.g[t * a.gb_stride]);
        const float* q = a.q + t * a.q_stride;
        const float* k = a.k + t * a.k_stride;
        __m512 acc = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= dk; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(k + i), _mm512_loadu_ps(q + i), acc);
        float s = _mm512_reduce_add_ps(acc);
        for (; i < dk; i++) s += k[i] * q[i];
        ts[t].kq = s;
    }
    int64_t j = 0;
    for (; j + 64 <= dv; j += 64) gdn_columns16<4>(a, j, ts);
    for (; j + 16 <= dv; j += 16) gdn_columns16<1>(a, j, ts);
    for (; j < dv; j++)  // scalar columns
        for (int64_t t = 0; t < a.T; t++) {
            const float* q = a.q + t * a.q_stride;
            const float* k = a.k + t * a.k_stride;
            float sk = 0.f, sq = 0.f;
            for (int64_t i = 0; i < dk; i++) {
                sk += a.S[i * dv + j] * k[i];
                sq += a.S[i * dv + j] * q[i];
            }
            const float vn = a.beta[t * a.gb_stride] * (a.v[t * a.v_stride + j] - ts[t].decay * sk);
            a.o[t * a.o_stride + j] = ts[t].decay * sq + vn * ts[t].kq;
            for (int64_t i = 0; i < dk; i++) a.S[i * dv + j] = ts[t].decay * a.S[i * dv + j] + k[i] * vn;
        }
}

ModelKernels make_table() {
    ModelKernels k = *model_kernels_avx2();
    k.isa = "avx512";
    k.gdn_recurrent = gdn_recurrent_avx512;
    return k;
}

}  // namespace

const ModelKernels* model_kernels_avx512() {
    static const ModelKernels table = make_table();
    return &table;
}

}  // namespace clover
