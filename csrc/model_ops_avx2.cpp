// AVX2 + FMA + F16C model operators (the only model-ops file compiled with those flags).
// Elementwise ops vectorise over the row; attention tiles the cache by KEY_TILE rows shared by all
// query rows of a task (online softmax); the recurrent gated delta rule walks S by column blocks
// that stay in L1 for every token (columns of S evolve independently); matmul is a 4x16 register tile.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats.h"
#include "model_ops.h"

namespace clover {

namespace {

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// e^x: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two, Cody-Waite), e^r = 1 + r + r^2 P(r) with
// Cephes expf's degree-5 minimax P, 2^n from the exponent bits. About 1 ulp; 0 below -87.34 (no
// subnormal results), inf above 88.72, NaN stays NaN.
inline __m256 exp256(__m256 x) {
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.34f)), _mm256_set1_ps(88.72f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    n = _mm256_min_ps(n, _mm256_set1_ps(127.f));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(88.7228f), _CMP_GT_OQ));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365f), _CMP_LT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

inline __m256 sigmoid256(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.f);
    return _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}
inline __m256 silu256(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.f);
    return _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}
inline float sigmoid1(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float silu1(float x) { return x / (1.f + std::exp(-x)); }

float sum_sq(const float* x, int64_t d) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(x0, x0, a0);
        a1 = _mm256_fmadd_ps(x1, x1, a1);
    }
    for (; i + 8 <= d; i += 8) {
        const __m256 x0 = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(x0, x0, a0);
    }
    float s = hsum(_mm256_add_ps(a0, a1));
    for (; i < d; i++) s += x[i] * x[i];
    return s;
}

// ---- norms and elementwise ----

void rms_norm_avx2(const float* x, const float* w, int64_t d, float eps, float* y) {
    const float inv = 1.f / std::sqrt(sum_sq(x, d) / (float)d + eps);
    const __m256 vi = _mm256_set1_ps(inv);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi), _mm256_loadu_ps(w + i)));
    for (; i < d; i++) y[i] = x[i] * inv * w[i];
}

void gated_rms_norm_avx2(const float* o, const float* z, const float* w, int64_t d, float eps, float* y) {
    const float inv = 1.f / std::sqrt(sum_sq(o, d) / (float)d + eps);
    const __m256 vi = _mm256_set1_ps(inv);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
        const __m256 n = _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(o + i), vi));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(n, silu256(_mm256_loadu_ps(z + i))));
    }
    for (; i < d; i++) y[i] = w[i] * (o[i] * inv) * silu1(z[i]);
}

void l2_norm_avx2(const float* x, int64_t d, float scale, float* y) {
    const float inv = 1.f / std::sqrt(sum_sq(x, d) + 1e-6f);
    const __m256 vi = _mm256_set1_ps(inv), vs = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi), vs));
    for (; i < d; i++) y[i] = x[i] * inv * scale;
}

void swiglu_avx2(const float* gate, const float* up, int64_t n, float* y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu256(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
    for (; i < n; i++) y[i] = silu1(gate[i]) * up[i];
}

void sigmoid_mul_avx2(const float* x, const float* gate, int64_t n, float* y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sigmoid256(_mm256_loadu_ps(gate + i))));
    for (; i < n; i++) y[i] = x[i] * sigmoid1(gate[i]);
}

// ---- causal depthwise conv: 8 channels per vector, taps transposed once per channel group ----

void conv1d_silu_avx2(const float* x, const float* w, const float* state, int64_t T, int64_t C, int64_t K, int64_t c0,
                      int64_t c1, float* y) {
    thread_local std::vector<float> wt;
    wt.resize(K * 8);
    auto row = [&](int64_t r) { return r < K - 1 ? state + r * C : x + (r - (K - 1)) * C; };
    int64_t c = c0;
    for (; c + 8 <= c1; c += 8) {
        for (int64_t j = 0; j < K; j++)
            for (int l = 0; l < 8; l++) wt[j * 8 + l] = w[(c + l) * K + j];
        for (int64_t t = 0; t < T; t++) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t j = 0; j < K; j++)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(&wt[j * 8]), _mm256_loadu_ps(row(t + j) + c), acc);
            _mm256_storeu_ps(y + t * C + c, silu256(acc));
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
    auto finish = [&](int r, int64_t j, __m256 acc) {
        float s = hsum(acc);
        const float* k = K + j * ld;
        for (int64_t d = D8; d < D; d++) s += q[r][d] * k[d];
        out[r][j] = s;
    };
    int64_t j = j0;
    for (; j + KB <= j1; j += KB) {
        __m256 acc[R][KB];
        for (int r = 0; r < R; r++)
            for (int u = 0; u < KB; u++) acc[r][u] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D8; d += 8) {
            __m256 kv[KB];
            for (int u = 0; u < KB; u++) kv[u] = _mm256_loadu_ps(K + (j + u) * ld + d);
            for (int r = 0; r < R; r++) {
                const __m256 qv = _mm256_loadu_ps(q[r] + d);
                for (int u = 0; u < KB; u++) acc[r][u] = _mm256_fmadd_ps(qv, kv[u], acc[r][u]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int u = 0; u < KB; u++) finish(r, j + u, acc[r][u]);
    }
    for (; j < j1; j++) {
        __m256 acc[R];
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D8; d += 8) {
            const __m256 kv = _mm256_loadu_ps(K + j * ld + d);
            for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + d), kv, acc[r]);
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
        __m256 o[R][NV];
        for (int r = 0; r < R; r++) {
            const __m256 c = _mm256_set1_ps(corr[r]);
            for (int u = 0; u < NV; u++) o[r][u] = _mm256_mul_ps(_mm256_loadu_ps(acc[r] + d + 8 * u), c);
        }
        for (int64_t j = j0; j < j1; j++) {
            __m256 v[NV];
            for (int u = 0; u < NV; u++) v[u] = _mm256_loadu_ps(V + j * ld + d + 8 * u);
            for (int r = 0; r < R; r++) {
                const __m256 pj = _mm256_set1_ps(p[r][j]);
                for (int u = 0; u < NV; u++) o[r][u] = _mm256_fmadd_ps(pj, v[u], o[r][u]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int u = 0; u < NV; u++) _mm256_storeu_ps(acc[r] + d + 8 * u, o[r][u]);
    }
    for (; d + 8 <= D; d += 8) {
        __m256 o[R];
        for (int r = 0; r < R; r++) o[r] = _mm256_mul_ps(_mm256_loadu_ps(acc[r] + d), _mm256_set1_ps(corr[r]));
        for (int64_t j = j0; j < j1; j++) {
            const __m256 v = _mm256_loadu_ps(V + j * ld + d);
            for (int r = 0; r < R; r++) o[r] = _mm256_fmadd_ps(_mm256_set1_ps(p[r][j]), v, o[r]);
        }
        for (int r = 0; r < R; r++) _mm256_storeu_ps(acc[r] + d, o[r]);
    }
    for (; d < D; d++)
        for (int r = 0; r < R; r++) {
            float s = acc[r][d] * corr[r];
            for (int64_t j = j0; j < j1; j++) s = std::fma(p[r][j], V[j * ld + d], s);
            acc[r][d] = s;
        }
}

// One task of attention_avx2: online softmax (flash-attention style) over key tiles. Query rows
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
        const __m256 vs = _mm256_set1_ps(a.scale);
        __m256 vm = _mm256_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
            const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), vs);
            _mm256_storeu_ps(s + j, x);
            vm = _mm256_max_ps(vm, x);
        }
        float mt = hmax(vm);
        for (; j < n; j++) {
            s[j] *= a.scale;
            mt = std::max(mt, s[j]);
        }
        const float m_new = std::max(m[r], mt);
        const float corr = m[r] == m_new ? 1.f : std::exp(m[r] - m_new);
        const __m256 vmn = _mm256_set1_ps(m_new);
        __m256 vsum = _mm256_setzero_ps();
        for (j = 0; j + 8 <= n; j += 8) {
            const __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmn));
            _mm256_storeu_ps(s + j, p);
            vsum = _mm256_add_ps(vsum, p);
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
            if (ahead && b % 2 == 0) _mm_prefetch((const char*)(blk + ahead), _MM_HINT_T0);
            uint16_t dh;
            std::memcpy(&dh, blk, 2);
            const __m256 sc = _mm256_set1_ps(_cvtsh_ss(dh));
            for (int u = 0; u < 4; u++) {
                const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 2 + 8 * u)));
                _mm256_storeu_ps(dst + b * KV_Q8_BLOCK + 8 * u, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(q)));
            }
        }
    }
}

template <KvType KV>
void attention_avx2(const AttnArgs& a, int64_t g, int64_t h0, int64_t h1, int64_t t0, int64_t t1) {
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
                        _mm_prefetch((const char*)(kr + KEY_TILE * kv_stride + d), _MM_HINT_T0);
                        _mm_prefetch((const char*)(vr + KEY_TILE * kv_stride + d), _MM_HINT_T0);
                    }
                    _mm256_storeu_ps(kt + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(kr + d))));
                    _mm256_storeu_ps(vt + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(vr + d))));
                }
                for (; d < D; d++) {
                    kt[d] = _cvtsh_ss(kr[d]);
                    vt[d] = _cvtsh_ss(vr[d]);
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
                    _mm_prefetch((const char*)(K + (KEY_TILE + j) * ld + d), _MM_HINT_T0);
                    _mm_prefetch((const char*)(V + (KEY_TILE + j) * ld + d), _MM_HINT_T0);
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
        const __m256 vi = _mm256_set1_ps(inv);
        int64_t d = 0;
        for (; d + 8 <= D; d += 8) {
            __m256 y = _mm256_mul_ps(_mm256_loadu_ps(src + d), vi);
            if (gt) y = _mm256_mul_ps(y, sigmoid256(_mm256_loadu_ps(gt + d)));
            _mm256_storeu_ps(o + d, y);
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
        __m256 sk[NV], sq[NV];
        for (int u = 0; u < NV; u++) sk[u] = sq[u] = _mm256_setzero_ps();
        for (int64_t i = 0; i < dk; i++) {
            const __m256 ki = _mm256_set1_ps(k[i]), qi = _mm256_set1_ps(q[i]);
            for (int u = 0; u < NV; u++) {
                const __m256 s = _mm256_loadu_ps(S + i * dv + 8 * u);
                sk[u] = _mm256_fmadd_ps(s, ki, sk[u]);
                sq[u] = _mm256_fmadd_ps(s, qi, sq[u]);
            }
        }
        const __m256 vd = _mm256_set1_ps(decay[t]), vb = _mm256_set1_ps(a.beta[t * a.gb_stride]);
        const __m256 vkq = _mm256_set1_ps(kq[t]);
        const float* v = a.v + t * a.v_stride + j0;
        float* o = a.o + t * a.o_stride + j0;
        __m256 vn[NV];
        for (int u = 0; u < NV; u++) {
            vn[u] = _mm256_mul_ps(vb, _mm256_fnmadd_ps(vd, sk[u], _mm256_loadu_ps(v + 8 * u)));
            _mm256_storeu_ps(o + 8 * u, _mm256_fmadd_ps(vd, sq[u], _mm256_mul_ps(vn[u], vkq)));
        }
        for (int64_t i = 0; i < dk; i++) {
            const __m256 ki = _mm256_set1_ps(k[i]);
            for (int u = 0; u < NV; u++) {
                float* p = S + i * dv + 8 * u;
                _mm256_storeu_ps(p, _mm256_fmadd_ps(ki, vn[u], _mm256_mul_ps(vd, _mm256_loadu_ps(p))));
            }
        }
    }
}

void gdn_recurrent_avx2(const GdnHeadArgs& a) {
    const int64_t dk = a.dk, dv = a.dv;
    thread_local std::vector<float> tmp;
    tmp.resize(2 * a.T);
    float* decay = tmp.data();
    float* kq = decay + a.T;
    for (int64_t t = 0; t < a.T; t++) {
        decay[t] = std::exp(a.g[t * a.gb_stride]);
        const float* q = a.q + t * a.q_stride;
        const float* k = a.k + t * a.k_stride;
        __m256 acc = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= dk; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(k + i), _mm256_loadu_ps(q + i), acc);
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
    __m256 acc[RM][NV];
    for (int r = 0; r < RM; r++)
        for (int u = 0; u < NV; u++) acc[r][u] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        __m256 b[NV];
        for (int u = 0; u < NV; u++) b[u] = _mm256_loadu_ps(B + kk * ldb + 8 * u);
        for (int r = 0; r < RM; r++) {
            const __m256 ar = _mm256_set1_ps(A[r * lda + kk]);
            for (int u = 0; u < NV; u++) acc[r][u] = _mm256_fmadd_ps(ar, b[u], acc[r][u]);
        }
    }
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    for (int r = 0; r < RM; r++)
        for (int u = 0; u < NV; u++) {
            float* c = C + r * ldc + 8 * u;
            const __m256 x = _mm256_mul_ps(va, acc[r][u]);
            _mm256_storeu_ps(c, beta == 0.f ? x : _mm256_fmadd_ps(vb, _mm256_loadu_ps(c), x));
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

void matmul_avx2(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                 int64_t ldc, float alpha, float beta) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) matmul_rows<4>(n, k, A + i * lda, lda, B, ldb, C + i * ldc, ldc, alpha, beta);
    for (; i < m; i++) matmul_rows<1>(n, k, A + i * lda, lda, B, ldb, C + i * ldc, ldc, alpha, beta);
}

const ModelKernels AVX2 = {
    "avx2",
    rms_norm_avx2,
    gated_rms_norm_avx2,
    l2_norm_avx2,
    swiglu_avx2,
    sigmoid_mul_avx2,
    conv1d_silu_avx2,
    attention_avx2<KvType::F32>,
    attention_avx2<KvType::F16>,
    attention_avx2<KvType::Q8_0>,
    gdn_recurrent_avx2,
    matmul_avx2,
    // Clover heads, one thread: recurrent 2x faster at T=1, equal at T=8-32, ~10% faster at T=128-512
    INT64_MAX,
};

}  // namespace

const ModelKernels* model_kernels_avx2() { return &AVX2; }

}  // namespace clover
