// The avx512 kernel table's model operators: AVX2's (model_ops_avx2.cpp) with the recurrent gated
// delta rule on 16-float registers. At 8 floats per register its column sweeps were ~7% of a 32- or
// 512-token forward on the bench twin (each element of the state: two multiply-adds to read it, one
// multiply and one multiply-add to update it, per token). Per element the operations are the AVX2
// kernel's, in the same order; only k.q is summed in a different order. And attention with query rows
// in lanes for calls with 8 or more query rows per kv head (prefill, diffusion blocks): no horizontal
// sums, 2-3x the AVX2 kernel's speed (bench/NOTES.md, change 25).
#include <immintrin.h>

#include <algorithm>
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

// Columns [j0, j0 + 16 NV) of S for every token (gdn_columns in model_ops_simd.inc, 16 wide): token
// t's update of S and token t + 1's two reads of it (S k, S q) in one pass, one load and one store per
// element and token (two passes took two loads and a store: T=32, 32 heads, Zen 4, best of 30,
// 0.99-1.15 -> 0.72-0.73 ms). The same operations in the same order per element as two passes, so
// the same results.
template <int NV>
void gdn_columns16(const GdnHeadArgs& a, int64_t j0, const TokenScalars* ts) {
    const int64_t dk = a.dk, dv = a.dv;
    float* S = a.S + j0;
    __m512 sk[NV], sq[NV];
    for (int u = 0; u < NV; u++) sk[u] = sq[u] = _mm512_setzero_ps();
    if (a.T > 0)
        for (int64_t i = 0; i < dk; i++) {  // token 0's reads
            const __m512 ki = _mm512_set1_ps(a.k[i]), qi = _mm512_set1_ps(a.q[i]);
            for (int u = 0; u < NV; u++) {
                const __m512 s = _mm512_loadu_ps(S + i * dv + 16 * u);
                sk[u] = _mm512_fmadd_ps(s, ki, sk[u]);
                sq[u] = _mm512_fmadd_ps(s, qi, sq[u]);
            }
        }
    for (int64_t t = 0; t < a.T; t++) {
        const float* k = a.k + t * a.k_stride;
        const __m512 vd = _mm512_set1_ps(ts[t].decay), vb = _mm512_set1_ps(a.beta[t * a.gb_stride]);
        const __m512 vkq = _mm512_set1_ps(ts[t].kq);
        const float* v = a.v + t * a.v_stride + j0;
        float* o = a.o + t * a.o_stride + j0;
        __m512 vn[NV];
        for (int u = 0; u < NV; u++) {
            vn[u] = _mm512_mul_ps(vb, _mm512_fnmadd_ps(vd, sk[u], _mm512_loadu_ps(v + 16 * u)));
            _mm512_storeu_ps(o + 16 * u, _mm512_fmadd_ps(vd, sq[u], _mm512_mul_ps(vn[u], vkq)));
        }
        if (t + 1 == a.T) {  // the last token: the update alone
            for (int64_t i = 0; i < dk; i++) {
                const __m512 ki = _mm512_set1_ps(k[i]);
                for (int u = 0; u < NV; u++) {
                    float* p = S + i * dv + 16 * u;
                    _mm512_storeu_ps(p, _mm512_fmadd_ps(ki, vn[u], _mm512_mul_ps(vd, _mm512_loadu_ps(p))));
                }
            }
            break;
        }
        const float* k1 = a.k + (t + 1) * a.k_stride;
        const float* q1 = a.q + (t + 1) * a.q_stride;
        for (int u = 0; u < NV; u++) sk[u] = sq[u] = _mm512_setzero_ps();
        for (int64_t i = 0; i < dk; i++) {
            const __m512 ki = _mm512_set1_ps(k[i]), k1i = _mm512_set1_ps(k1[i]), q1i = _mm512_set1_ps(q1[i]);
            for (int u = 0; u < NV; u++) {
                float* p = S + i * dv + 16 * u;
                const __m512 s = _mm512_fmadd_ps(ki, vn[u], _mm512_mul_ps(vd, _mm512_loadu_ps(p)));
                _mm512_storeu_ps(p, s);
                sk[u] = _mm512_fmadd_ps(s, k1i, sk[u]);
                sq[u] = _mm512_fmadd_ps(s, q1i, sq[u]);
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

// ---- attention with query rows in lanes ----
//
// The AVX2 kernel (model_ops_simd.inc) puts the head dimension in the lanes: every (row, key) score
// ends in a horizontal sum, and scores, maxima and sums are scalars. Here a vector holds one value of
// 16 query rows (token, head) instead: the task's queries are transposed once (QT[d] = 16 rows' q[d]),
// a score vector is sum_d K[j][d] * QT[d] with the key's value broadcast from memory, the online
// softmax runs lane-wise over keys, and the output accumulates transposed (OT[d] += V[j][d] * P[j]).
// No horizontal operation anywhere; each row's arithmetic is the same in any lane and any grouping
// (sums over d and over keys in order), so results do not depend on the thread count. Keys a row may
// not see get -inf scores and masked multiply-adds (a NaN or inf value there never reaches the row).

struct alignas(64) Lane16 {
    float f[16];
};
struct alignas(64) Lane16i {
    int32_t i[16];
};

// e^x, 16 lanes: model_ops_avx2.cpp's exp8, the same constants (model_ops.h's ExpConsts) and steps
inline __m512 exp16(__m512 x) {
    using E = ExpConsts;
    const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(E::X_MIN)), _mm512_set1_ps(E::X_MAX));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(E::LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    n = _mm512_min_ps(n, _mm512_set1_ps(127.f));
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(E::LN2_HI), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(E::LN2_LO), r);
    __m512 p = _mm512_set1_ps(E::P0);
    for (const float c : {E::P1, E::P2, E::P3, E::P4, E::P5}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(E::INF_ABOVE), _CMP_GT_OQ), y,
                             _mm512_set1_ps(INFINITY));
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(E::ZERO_BELOW), _CMP_LT_OQ), y, _mm512_setzero_ps());
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

constexpr int64_t LANE_KEYS = ATTN_KEY_TILE;  // cache rows per tile
kv_tile_fn g_kv_tile = nullptr;  // the AVX2 table's tile conversion (set with the table)

// G lane groups at once (their queries QT[g], D lines apart; scores S[g], LANE_KEYS lines apart):
// S[g][u] = scale * sum_d K[u][d] QT[g][d] for KB keys (rows of K `ld` floats apart), -inf where a lane
// may not see key s + u; see[g][u] = the lanes that may. Each key value is broadcast once for all G.
template <int G, int KB>
void lane_scores(const Lane16* QT, int64_t D, const float* K, int64_t ld, __m512 scale, const __m512i* lim, int64_t s,
                 Lane16* S, __mmask16* see) {
    __m512 acc[G][KB];
    for (int g = 0; g < G; g++)
        for (int u = 0; u < KB; u++) acc[g][u] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m512 q[G];
        for (int g = 0; g < G; g++) q[g] = _mm512_load_ps(QT[g * D + d].f);
        for (int u = 0; u < KB; u++) {
            const __m512 k = _mm512_set1_ps(K[u * ld + d]);
            for (int g = 0; g < G; g++) acc[g][u] = _mm512_fmadd_ps(k, q[g], acc[g][u]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int u = 0; u < KB; u++) {
            const __mmask16 m = _mm512_cmpgt_epi32_mask(lim[g], _mm512_set1_epi32((int32_t)(s + u)));
            see[g * LANE_KEYS + u] = m;
            _mm512_store_ps(S[g * LANE_KEYS + u].f,
                            _mm512_mask_blend_ps(m, _mm512_set1_ps(-INFINITY), _mm512_mul_ps(acc[g][u], scale)));
        }
}

template <int G, int KB>
void lane_scores_tail(int64_t n, const Lane16* QT, int64_t D, const float* K, int64_t ld, __m512 scale,
                      const __m512i* lim, int64_t s, Lane16* S, __mmask16* see) {
    if constexpr (KB > 0) {
        if (n == KB) return lane_scores<G, KB>(QT, D, K, ld, scale, lim, s, S, see);
        lane_scores_tail<G, KB - 1>(n, QT, D, K, ld, scale, lim, s, S, see);
    }
}

// For G lane groups (outputs OT[g], D lines apart): OT[g][d0 + u] = OT[g][d0 + u] * corr[g] +
// sum_j P[g][j] V[j][d0 + u] for NV columns, keys in order, each key only in the lanes that see it.
template <int G, int NV>
void lane_values(Lane16* OT, int64_t D, const __m512* corr, const Lane16* P, const __mmask16* see, const float* V,
                 int64_t ld, int64_t ns, int64_t d0) {
    __m512 o[G][NV];
    for (int g = 0; g < G; g++)
        for (int u = 0; u < NV; u++) o[g][u] = _mm512_mul_ps(_mm512_load_ps(OT[g * D + d0 + u].f), corr[g]);
    for (int64_t j = 0; j < ns; j++) {
        __m512 p[G];
        for (int g = 0; g < G; g++) p[g] = _mm512_load_ps(P[g * LANE_KEYS + j].f);
        const float* v = V + j * ld + d0;
        for (int u = 0; u < NV; u++) {
            const __m512 vb = _mm512_set1_ps(v[u]);
            for (int g = 0; g < G; g++) o[g][u] = _mm512_mask3_fmadd_ps(vb, p[g], o[g][u], see[g * LANE_KEYS + j]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int u = 0; u < NV; u++) _mm512_store_ps(OT[g * D + d0 + u].f, o[g][u]);
}

// One key tile [s0, s0 + ns) for G lane groups starting at group gi: scores, the online softmax step
// (lanes that have seen nothing yet subtract 0: exp(-inf - 0) = 0, never -inf - -inf), values.
template <int G>
void lane_tile(Lane16* QT, Lane16* OT, Lane16* M, Lane16* L, const Lane16i* lim, Lane16* S, __mmask16* see,
               int64_t D, const float* K, const float* V, int64_t ld, int64_t s0, int64_t ns, __m512 scale) {
    constexpr int KB = G == 1 ? 8 : 6, NV = 8;
    __m512i lm[G];
    for (int g = 0; g < G; g++) lm[g] = _mm512_load_si512(lim[g].i);
    int64_t j = 0;
    for (; j + KB <= ns; j += KB) lane_scores<G, KB>(QT, D, K + j * ld, ld, scale, lm, s0 + j, S + j, see + j);
    if (j < ns) lane_scores_tail<G, KB - 1>(ns - j, QT, D, K + j * ld, ld, scale, lm, s0 + j, S + j, see + j);
    __m512 corr[G];
    for (int g = 0; g < G; g++) {
        Lane16* sg = S + g * LANE_KEYS;
        __m512 mt = _mm512_load_ps(sg[0].f);
        for (j = 1; j < ns; j++) mt = _mm512_max_ps(mt, _mm512_load_ps(sg[j].f));
        const __m512 m_old = _mm512_load_ps(M[g].f), m_new = _mm512_max_ps(m_old, mt);
        const __m512 m_sub = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m_new, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                                                  m_new, _mm512_setzero_ps());
        corr[g] = exp16(_mm512_sub_ps(m_old, m_sub));
        __m512 sum = _mm512_setzero_ps();
        for (j = 0; j < ns; j++) {
            const __m512 p = exp16(_mm512_sub_ps(_mm512_load_ps(sg[j].f), m_sub));
            _mm512_store_ps(sg[j].f, p);
            sum = _mm512_add_ps(sum, p);
        }
        _mm512_store_ps(M[g].f, m_new);
        _mm512_store_ps(L[g].f, _mm512_fmadd_ps(_mm512_load_ps(L[g].f), corr[g], sum));
    }
    int64_t d = 0;
    for (; d + NV <= D; d += NV) lane_values<G, NV>(OT, D, corr, S, see, V, ld, ns, d);
    for (; d < D; d++) lane_values<G, 1>(OT, D, corr, S, see, V, ld, ns, d);
}

// The scratch of one thread: Lane16 lines, ints too (a std::vector<float> here would emit weak symbols
// compiled for AVX-512 that the linker could pick for every other file).
struct LaneScratch {
    std::vector<Lane16> lines;
    std::vector<Lane16i> ints;
};

template <KvType KV>
void attention_lanes(const AttnArgs& a, int64_t g, int64_t h0, int64_t h1, int64_t t0, int64_t t1) {
    constexpr bool CONVERT = KV != KvType::F32;
    const int64_t D = a.D, nh = h1 - h0, nr = nh * (t1 - t0), ng = (nr + 15) / 16;
    const int64_t tile_lines = CONVERT ? (2 * LANE_KEYS * D + 15) / 16 : 0;
    thread_local LaneScratch scratch;
    // QT [ng][D], OT [ng][D], m, l [ng], scores [2][LANE_KEYS], then the K and V tiles (kv_tile_fn)
    scratch.lines.resize(2 * ng * D + 2 * ng + 2 * LANE_KEYS + tile_lines);
    scratch.ints.resize(ng);
    Lane16 *QT = scratch.lines.data(), *OT = QT + ng * D, *M = OT + ng * D, *L = M + ng, *S = L + ng;
    float* tiles = reinterpret_cast<float*>(S + 2 * LANE_KEYS);  // (past the scores; none for f32 caches)
    Lane16i* lim = scratch.ints.data();
    int64_t L_max = 0;
    for (int64_t gi = 0; gi < ng; gi++) {
        for (int lane = 0; lane < 16; lane++) {
            const int64_t r = gi * 16 + lane;
            if (r < nr) {
                const int64_t t = t0 + r / nh, h = h0 + r % nh;
                const float* q = a.q + (t * a.n_head + h) * D;
                for (int64_t d = 0; d < D; d++) QT[gi * D + d].f[lane] = q[d];
                lim[gi].i[lane] = a.limit[t];
                L_max = std::max<int64_t>(L_max, a.limit[t]);
            } else {
                for (int64_t d = 0; d < D; d++) QT[gi * D + d].f[lane] = 0.f;
                lim[gi].i[lane] = 0;
            }
        }
        _mm512_store_ps(M[gi].f, _mm512_set1_ps(-INFINITY));
        _mm512_store_ps(L[gi].f, _mm512_setzero_ps());
        for (int64_t d = 0; d < D; d++) _mm512_store_ps(OT[gi * D + d].f, _mm512_setzero_ps());
    }
    const __m512 scale = _mm512_set1_ps(a.scale);
    __mmask16 see[2 * LANE_KEYS];

    for (int64_t s0 = 0; s0 < L_max; s0 += LANE_KEYS) {
        const int64_t ns = std::min(LANE_KEYS, L_max - s0);
        const float *K, *V;
        int64_t ld;
        g_kv_tile(a, KV, g, s0, ns, L_max, tiles, &K, &V, &ld);
        // pairs of lane groups share each broadcast key and value; a group no lane of which sees the
        // tile is skipped (computed with its pair it would change nothing: -inf scores, masked values)
        auto active = [&](int64_t gi) { return _mm512_reduce_max_epi32(_mm512_load_si512(lim[gi].i)) > s0; };
        for (int64_t gi = 0; gi < ng;) {
            if (!active(gi)) {
                gi++;
            } else if (gi + 1 < ng && active(gi + 1)) {
                lane_tile<2>(QT + gi * D, OT + gi * D, M + gi, L + gi, lim + gi, S, see, D, K, V, ld, s0, ns, scale);
                gi += 2;
            } else {
                lane_tile<1>(QT + gi * D, OT + gi * D, M + gi, L + gi, lim + gi, S, see, D, K, V, ld, s0, ns, scale);
                gi++;
            }
        }
    }

    for (int64_t r = 0; r < nr; r++) {
        const int64_t gi = r / 16, lane = r % 16, t = t0 + r / nh, h = h0 + r % nh;
        float* o = a.o + (t * a.n_head + h) * D;
        const float l = L[gi].f[lane];
        const float inv = l > 0.f ? 1.f / l : 0.f;  // no visible row: zeros
        const float* gt = a.gate ? a.gate + (t * a.n_head + h) * D : nullptr;
        for (int64_t d = 0; d < D; d++) o[d] = OT[gi * D + d].f[lane] * inv;
        if (gt) {
            int64_t d = 0;
            const __m512 one = _mm512_set1_ps(1.f);
            for (; d + 16 <= D; d += 16) {
                const __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(),
                                                                                             _mm512_loadu_ps(gt + d)))));
                _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), sg));
            }
            for (; d < D; d++) o[d] *= 1.f / (1.f + std::exp(-gt[d]));
        }
    }
}

ModelKernels make_table() {
    ModelKernels k = *model_kernels_avx2();
    k.isa = "avx512";
    k.gdn_recurrent = gdn_recurrent_avx512;
    k.attention_lanes_f32 = attention_lanes<KvType::F32>;
    k.attention_lanes_f16 = attention_lanes<KvType::F16>;
    k.attention_lanes_q8_0 = attention_lanes<KvType::Q8_0>;
    g_kv_tile = k.attention_kv_tile;
    return k;
}

}  // namespace

const ModelKernels* model_kernels_avx512() {
    static const ModelKernels table = make_table();
    return &table;
}

}  // namespace clover
