// Scalar reference kernels of the model operators (plain loops, the twin every SIMD path is checked
// against), the ISA table lookup, and the drivers: threading, masks, chunking, state handling.
#include "model_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dispatch.h"
#include "formats.h"
#include "scratch.h"
#include "threadpool.h"

namespace clover {

namespace {

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float silu(float x) { return x / (1.f + std::exp(-x)); }

// ---- scalar kernels ----

void rms_norm_ref(const float* x, const float* w, int64_t d, float eps, float* y) {
    float ss = 0.f;
    for (int64_t i = 0; i < d; i++) ss += x[i] * x[i];
    const float inv = 1.f / std::sqrt(ss / (float)d + eps);
    for (int64_t i = 0; i < d; i++) y[i] = x[i] * inv * w[i];
}

void gated_rms_norm_ref(const float* o, const float* z, const float* w, int64_t d, float eps, float* y) {
    float ss = 0.f;
    for (int64_t i = 0; i < d; i++) ss += o[i] * o[i];
    const float inv = 1.f / std::sqrt(ss / (float)d + eps);
    for (int64_t i = 0; i < d; i++) y[i] = w[i] * (o[i] * inv) * silu(z[i]);
}

void l2_norm_ref(const float* x, int64_t d, float scale, float* y) {
    float ss = 0.f;
    for (int64_t i = 0; i < d; i++) ss += x[i] * x[i];
    const float inv = 1.f / std::sqrt(ss + 1e-6f);
    for (int64_t i = 0; i < d; i++) y[i] = x[i] * inv * scale;
}

void swiglu_ref(const float* gate, const float* up, int64_t n, float* y) {
    for (int64_t i = 0; i < n; i++) y[i] = silu(gate[i]) * up[i];
}

void sigmoid_mul_ref(const float* x, const float* gate, int64_t n, float* y) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * sigmoid(gate[i]);
}

void conv1d_silu_ref(const float* x, const float* w, const float* state, int64_t T, int64_t C, int64_t K, int64_t c0,
                     int64_t c1, float* y) {
    for (int64_t c = c0; c < c1; c++)
        for (int64_t t = 0; t < T; t++) {
            float acc = 0.f;
            for (int64_t j = 0; j < K; j++) {
                const int64_t r = t + j;  // row of concat(state, x)
                const float xv = r < K - 1 ? state[r * C + c] : x[(r - (K - 1)) * C + c];
                acc += w[c * K + j] * xv;
            }
            y[t * C + c] = silu(acc);
        }
}

// Two passes per query row: scores, then exact max-subtracted softmax and the weighted sum.
template <KvType KV>
void attention_ref(const AttnArgs& a, int64_t g, int64_t h0, int64_t h1, int64_t t0, int64_t t1) {
    const int64_t D = a.D, kv_stride = a.n_head_kv * D;
    const int64_t head_bytes = kv_head_bytes(KV, D);
    auto load = [&](const void* base, int64_t s, int64_t d) -> float {
        const int64_t i = s * kv_stride + g * D + d;
        if (KV == KvType::F32) return ((const float*)base)[i];
        if (KV == KvType::F16) return fp16_to_f32(((const uint16_t*)base)[i]);
        const uint8_t* blk = (const uint8_t*)base + (s * a.n_head_kv + g) * head_bytes +
                             d / KV_Q8_BLOCK * KV_Q8_BLOCK_BYTES;
        uint16_t dh;
        std::memcpy(&dh, blk, 2);
        return fp16_to_f32(dh) * (float)(int8_t)blk[2 + d % KV_Q8_BLOCK];
    };
    std::vector<float> p;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t h = h0; h < h1; h++) {
            const float* q = a.q + (t * a.n_head + h) * D;
            float* o = a.o + (t * a.n_head + h) * D;
            const int64_t L = a.limit[t];
            std::fill(o, o + D, 0.f);
            if (L > 0) {
                p.resize(L);
                float m = -INFINITY;
                for (int64_t s = 0; s < L; s++) {
                    float dot = 0.f;
                    for (int64_t d = 0; d < D; d++) dot += q[d] * load(a.k, s, d);
                    p[s] = dot * a.scale;
                    m = std::max(m, p[s]);
                }
                float sum = 0.f;
                for (int64_t s = 0; s < L; s++) {
                    p[s] = std::exp(p[s] - m);
                    sum += p[s];
                }
                for (int64_t s = 0; s < L; s++)
                    for (int64_t d = 0; d < D; d++) o[d] += p[s] * load(a.v, s, d);
                for (int64_t d = 0; d < D; d++) o[d] /= sum;
            }
            if (a.gate) {
                const float* gt = a.gate + (t * a.n_head + h) * D;
                for (int64_t d = 0; d < D; d++) o[d] *= sigmoid(gt[d]);
            }
        }
}

// Reference 4.5 in its exact order: decay, S^T k, delta, rank-1 update, o = S^T q.
void gdn_recurrent_ref(const GdnHeadArgs& a) {
    const int64_t dk = a.dk, dv = a.dv;
    std::vector<float> kv(dv), delta(dv);
    float* S = a.S;
    for (int64_t t = 0; t < a.T; t++) {
        const float* q = a.q + t * a.q_stride;
        const float* k = a.k + t * a.k_stride;
        const float* v = a.v + t * a.v_stride;
        float* o = a.o + t * a.o_stride;
        const float decay = std::exp(a.g[t * a.gb_stride]), beta = a.beta[t * a.gb_stride];
        // sums over i in ascending order, rows of S walked contiguously
        for (int64_t i = 0; i < dk * dv; i++) S[i] *= decay;
        std::fill(kv.begin(), kv.end(), 0.f);
        for (int64_t i = 0; i < dk; i++)
            for (int64_t j = 0; j < dv; j++) kv[j] += S[i * dv + j] * k[i];
        for (int64_t j = 0; j < dv; j++) delta[j] = (v[j] - kv[j]) * beta;
        for (int64_t i = 0; i < dk; i++)
            for (int64_t j = 0; j < dv; j++) S[i * dv + j] += k[i] * delta[j];
        std::fill(o, o + dv, 0.f);
        for (int64_t i = 0; i < dk; i++)
            for (int64_t j = 0; j < dv; j++) o[j] += S[i * dv + j] * q[i];
    }
}

// Clover heads, one thread, x86-64 baseline build: chunked 1.2-1.9x faster than recurrent at every T
// tried (T=1: 0.3 vs 0.5 ms, T=32: 6.1 vs 7.2 ms, T=128: 30 vs 30-37 ms).
constexpr int64_t GDN_CHUNKED_FROM_REF = 1;

void matmul_ref(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                int64_t ldc, float alpha, float beta) {
    std::vector<float> acc(n);
    for (int64_t i = 0; i < m; i++) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t kk = 0; kk < k; kk++) {
            const float aik = A[i * lda + kk];
            for (int64_t j = 0; j < n; j++) acc[j] += aik * B[kk * ldb + j];
        }
        float* c = C + i * ldc;
        for (int64_t j = 0; j < n; j++) c[j] = beta == 0.f ? alpha * acc[j] : beta * c[j] + alpha * acc[j];
    }
}

const ModelKernels REF = {
    "ref",
    rms_norm_ref,
    gated_rms_norm_ref,
    l2_norm_ref,
    swiglu_ref,
    sigmoid_mul_ref,
    conv1d_silu_ref,
    attention_ref<KvType::F32>,
    attention_ref<KvType::F16>,
    attention_ref<KvType::Q8_0>,
    gdn_recurrent_ref,
    matmul_ref,
    GDN_CHUNKED_FROM_REF,
};

// Run fn(i0, i1) over [0, n) in fixed pieces of `grain`: inline when there is only one piece.
template <typename F>
void parallel_ranges(int64_t n, int64_t grain, F fn) {
    grain = std::max<int64_t>(1, grain);
    const int64_t n_tasks = (n + grain - 1) / grain;
    if (n_tasks <= 1) {
        if (n > 0) fn(int64_t(0), n);
        return;
    }
    pool()->run(n_tasks, [&](int64_t task, int) { fn(task * grain, std::min(n, (task + 1) * grain)); });
}

constexpr int64_t GRAIN_FLOATS = 1 << 14;  // elementwise work per task

}  // namespace

#if !defined(CLOVER_HAVE_AVX2)
const ModelKernels* model_kernels_avx2() { return nullptr; }
#endif
#if !defined(CLOVER_HAVE_NEON)
const ModelKernels* model_kernels_neon() { return nullptr; }
#endif
#if !defined(CLOVER_HAVE_AVX512)
const ModelKernels* model_kernels_avx512() { return nullptr; }
#endif

const ModelKernels& model_kernels_ref() { return REF; }

const ModelKernels& model_kernels_of(const Kernels& kr) {
    const ModelKernels* t = (std::strcmp(kr.isa, "avx512") == 0 || std::strcmp(kr.isa, "amx") == 0) && model_kernels_avx512() ? model_kernels_avx512()
                            : std::strcmp(kr.family, "avx2") == 0   ? model_kernels_avx2()
                            : std::strcmp(kr.family, "neon") == 0 ? model_kernels_neon()
                                                                  : nullptr;
    return t ? *t : REF;
}

// (kernels_for throws std::invalid_argument when the ISA is not available)
const ModelKernels& model_kernels_for(const std::string& isa) { return model_kernels_of(kernels_for(isa)); }

const ModelKernels& active_model_kernels() { return model_kernels_of(active_kernels()); }

// ---- drivers ----

void rms_norm(const ModelKernels& kr, const float* x, const float* w, int64_t rows, int64_t d, float eps, float* y) {
    parallel_ranges(rows, GRAIN_FLOATS / std::max<int64_t>(1, d), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) kr.rms_norm(x + r * d, w, d, eps, y + r * d);
    });
}

void gated_rms_norm(const ModelKernels& kr, const float* o, const float* z, const float* w, int64_t rows, int64_t d,
                    float eps, float* y) {
    parallel_ranges(rows, GRAIN_FLOATS / std::max<int64_t>(1, d), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) kr.gated_rms_norm(o + r * d, z + r * d, w, d, eps, y + r * d);
    });
}

void rope_neox(float* x, const int32_t* pos, int64_t T, int64_t H, int64_t D, int64_t n_rot, double theta) {
    const int64_t half = n_rot / 2;
    if (half == 0) return;
    std::vector<double> inv_freq(half);
    for (int64_t i = 0; i < half; i++) inv_freq[i] = std::pow(theta, -2.0 * (double)i / (double)n_rot);
    // float32 angles are off by up to ulp(pos)/2 ~ 4e-3 rad at pos 131072: angles and sin/cos in double.
    parallel_ranges(T, std::max<int64_t>(1, GRAIN_FLOATS / std::max<int64_t>(1, H * n_rot)), [&](int64_t t0, int64_t t1) {
        std::vector<float> cs(half), sn(half);
        for (int64_t t = t0; t < t1; t++) {
            for (int64_t i = 0; i < half; i++) {
                const double angle = (double)pos[t] * inv_freq[i];
                cs[i] = (float)std::cos(angle);
                sn[i] = (float)std::sin(angle);
            }
            for (int64_t h = 0; h < H; h++) {
                float* r = x + (t * H + h) * D;
                for (int64_t i = 0; i < half; i++) {
                    const float x0 = r[i], x1 = r[i + half];
                    r[i] = x0 * cs[i] - x1 * sn[i];
                    r[i + half] = x1 * cs[i] + x0 * sn[i];
                }
            }
        }
    });
}

void attention(const ModelKernels& kr, const float* q, const void* k, const void* v, KvType kv,
               const int32_t* q_pos, const float* gate, int64_t T, int64_t n_head, int64_t n_head_kv, int64_t D,
               int64_t n_kv, AttnMask mask, int64_t block_length, float scale, float* o) {
    std::vector<int32_t> limit(T);
    for (int64_t t = 0; t < T; t++) {
        const int64_t p = q_pos[t];
        const int64_t end = mask == AttnMask::Causal ? p + 1 : (p / block_length + 1) * block_length;
        limit[t] = (int32_t)std::min(end, n_kv);
    }
    const AttnArgs a{q, k, v, limit.data(), gate, o, n_head, n_head_kv, D, scale};
    const int64_t group = n_head / n_head_kv, n_threads = pool()->size();
    // Rows in lanes where the ISA has it and the call has the rows to fill them: the choice depends on
    // the call alone, never on the thread count.
    const attention_fn lanes = kv == KvType::F16    ? kr.attention_lanes_f16
                               : kv == KvType::Q8_0 ? kr.attention_lanes_q8_0
                                                    : kr.attention_lanes_f32;
    // (the 8-lane kernels compare key indices as floats, exact below 2^24; the AVX-512 one compares
    // integers, but one bound for all keeps the choice simple: no model here comes near 16M positions)
    const bool use_lanes = lanes && T * group >= ATTN_LANE_ROWS && n_kv < (int64_t(1) << 24);
    const attention_fn fn = use_lanes          ? lanes
                            : kv == KvType::F16  ? kr.attention_f16
                            : kv == KvType::Q8_0 ? kr.attention_q8_0
                                                 : kr.attention_f32;

    // A task is (kv head, a divisor of its query heads, a token chunk): the cache is read once per
    // task for all its query rows. Token chunks shrink towards ~4 tasks per thread; heads are split
    // only while some thread would have no task (each split reads the cache once more). Each row's
    // arithmetic does not depend on how rows are grouped, so the split may follow the thread count.
    // Lane tasks start at 128 rows and shrink below 64 only while a thread would have no task (each
    // task converts the cache tiles once for its rows), never below ATTN_LANE_ROWS tokens' worth.
    auto n_chunks = [&](int64_t tc) { return (T + tc - 1) / tc; };
    const int64_t min_tc = use_lanes ? (ATTN_LANE_ROWS + group - 1) / group : 1;
    int64_t tc = std::min<int64_t>(T, std::max<int64_t>(min_tc, (use_lanes ? 128 : 64) / group));
    auto shrink = [&](int64_t tc) {
        const int64_t tasks = n_head_kv * n_chunks(tc);
        return tc > min_tc && tasks < 4 * n_threads && (!use_lanes || tc * group > 64 || tasks < n_threads);
    };
    while (shrink(tc)) tc = std::max(min_tc, (tc + 1) / 2);
    int64_t hs = group;
    while (hs > 1 && n_head_kv * (group / hs) * n_chunks(tc) < n_threads) {
        int64_t d = hs - 1;
        while (group % d) d--;  // the next smaller divisor of the group
        hs = d;
    }
    const int64_t per_kv = group / hs, n_tc = n_chunks(tc);
    pool()->run(n_head_kv * per_kv * n_tc, [&](int64_t task, int) {
        const int64_t g = task / (per_kv * n_tc), rest = task % (per_kv * n_tc);
        const int64_t h0 = g * group + (rest / n_tc) * hs, t0 = (rest % n_tc) * tc;
        fn(a, g, h0, h0 + hs, t0, std::min(T, t0 + tc));
    });
}

void conv1d_silu(const ModelKernels& kr, const float* x, const float* w, float* state, int64_t T, int64_t C,
                 int64_t K, bool update_state, float* y) {
    // state <- rows [T, T + K - 1) of concat(state, x) for channels [c0, c1); ascending rows read only rows
    // not yet written
    auto keep_state = [&](int64_t c0, int64_t c1) {
        for (int64_t r = 0; r < K - 1; r++) {
            const int64_t src = T + r;
            const float* from = src < K - 1 ? state + src * C : x + (src - (K - 1)) * C;
            std::memcpy(state + r * C + c0, from + c0, (c1 - c0) * sizeof(float));
        }
    };
    // A prompt's rows by ranges of tokens over every channel: each task reads whole rows, in order. (By
    // ranges of 64 channels, as for a few tokens, each task read 256 bytes of each of T rows a row apart:
    // 512 x 8192, 2 threads, 1.1-1.3 ns per element.) A range after the first reads its K - 1 rows before
    // from x, as the first reads them from the state.
    constexpr int64_t TOKENS_PER_TASK = 16;
    if (T >= 4 * TOKENS_PER_TASK && K - 1 <= TOKENS_PER_TASK) {
        parallel_ranges(T, TOKENS_PER_TASK, [&](int64_t t0, int64_t t1) {
            const float* before = t0 == 0 ? state : x + (t0 - (K - 1)) * C;
            kr.conv1d_silu(x + t0 * C, w, before, t1 - t0, C, K, 0, C, y + t0 * C);
        });
        if (update_state) keep_state(0, C);
        return;
    }
    const int64_t grain = std::max<int64_t>(64, (GRAIN_FLOATS / std::max<int64_t>(1, T * K) + 7) / 8 * 8);
    parallel_ranges(C, grain, [&](int64_t c0, int64_t c1) {
        if (T > 0) kr.conv1d_silu(x, w, state, T, C, K, c0, c1, y);
        if (update_state) keep_state(c0, c1);
    });
}

namespace {

// Reference 4.6 for one value head, chunk by chunk (no padding: a short last chunk is exact).
// Per chunk of c tokens, G = cumsum(g), D[r, s] = exp(G_r - G_s):
//   A = strict_lower(beta_r k_r.k_s D),  U = (I + A)^-1 (beta V),  W = (I + A)^-1 (beta e^G K)
//   V_new = U - W S,  O = (e^G Q) S + lower(Q K^T D) V_new,  S = e^G_last S + (e^(G_last - G) K)^T V_new
void gdn_chunked_head(const ModelKernels& kr, const GdnHeadArgs& a) {
    const int64_t dk = a.dk, dv = a.dv, C = GDN_CHUNK;
    thread_local std::vector<float> buf;
    // cumsum of g in double: in float32, G ~ -1e4 (strong decay) would leave G_r - G_s off by ~1e-3
    thread_local std::vector<double> G;
    G.resize(C);
    float* Q = aligned_floats(buf, C * (3 * dk + 2 * dv) + 2 * C * C + C);  // [C, dk]
    float* K = Q + C * dk;   // [C, dk]; then W
    float* KT = K + C * dk;  // [dk, C]
    float* U = KT + dk * C;  // [C, dv]: beta V, then U, then V_new
    float* O = U + C * dv;   // [C, dv]
    float* A = O + C * dv;   // [C, C]
    float* M = A + C * C;    // [C, C]
    float* bt = M + C * C;   // [C]
    float* S = a.S;
    for (int64_t n0 = 0; n0 < a.T; n0 += C) {
        const int64_t c = std::min(C, a.T - n0);
        double cum = 0.0;
        for (int64_t r = 0; r < c; r++) {
            const int64_t t = n0 + r;
            std::memcpy(Q + r * dk, a.q + t * a.q_stride, dk * sizeof(float));
            std::memcpy(K + r * dk, a.k + t * a.k_stride, dk * sizeof(float));
            cum += a.g[t * a.gb_stride];
            G[r] = cum;
            bt[r] = a.beta[t * a.gb_stride];
            const float* v = a.v + t * a.v_stride;
            for (int64_t j = 0; j < dv; j++) U[r * dv + j] = bt[r] * v[j];
        }
        for (int64_t r = 0; r < c; r++)
            for (int64_t i = 0; i < dk; i++) KT[i * c + r] = K[r * dk + i];
        kr.matmul(c, c, dk, K, dk, KT, c, A, c, 1.f, 0.f);  // K K^T
        kr.matmul(c, c, dk, Q, dk, KT, c, M, c, 1.f, 0.f);  // Q K^T
        for (int64_t r = 0; r < c; r++)
            for (int64_t s = 0; s < c; s++) {
                const float dec = s <= r ? (float)std::exp(G[r] - G[s]) : 0.f;
                A[r * c + s] = s < r ? bt[r] * A[r * c + s] * dec : 0.f;
                M[r * c + s] = s <= r ? M[r * c + s] * dec : 0.f;
            }
        // forward substitution, row by row: X_r = rhs_r - A[r, :r] X[:r]; K becomes W
        for (int64_t r = 0; r < c; r++) {
            const float eg = bt[r] * (float)std::exp(G[r]);
            for (int64_t i = 0; i < dk; i++) K[r * dk + i] *= eg;
            if (r > 0) {
                kr.matmul(1, dv, r, A + r * c, c, U, dv, U + r * dv, dv, -1.f, 1.f);
                kr.matmul(1, dk, r, A + r * c, c, K, dk, K + r * dk, dk, -1.f, 1.f);
            }
        }
        kr.matmul(c, dv, dk, K, dk, S, dv, U, dv, -1.f, 1.f);  // V_new = U - W S
        for (int64_t r = 0; r < c; r++) {
            const float eg = (float)std::exp(G[r]);
            for (int64_t i = 0; i < dk; i++) Q[r * dk + i] *= eg;
        }
        kr.matmul(c, dv, dk, Q, dk, S, dv, O, dv, 1.f, 0.f);  // inter-chunk
        kr.matmul(c, dv, c, M, c, U, dv, O, dv, 1.f, 1.f);    // intra-chunk
        const double g_last = G[c - 1];
        for (int64_t r = 0; r < c; r++) bt[r] = (float)std::exp(g_last - G[r]);  // beta no longer needed
        for (int64_t i = 0; i < dk; i++)
            for (int64_t r = 0; r < c; r++) KT[i * c + r] *= bt[r];
        kr.matmul(dk, dv, c, KT, c, U, dv, S, dv, 1.f, (float)std::exp(g_last));
        for (int64_t r = 0; r < c; r++) std::memcpy(a.o + (n0 + r) * a.o_stride, O + r * dv, dv * sizeof(float));
    }
}

}  // namespace

void gated_delta_rule(const ModelKernels& kr, GdnMode mode, const float* q, const float* k, const float* v,
                      const float* g, const float* beta, float* state, int64_t T, int64_t Hk, int64_t Hv, int64_t dk,
                      int64_t dv, bool update_state, float* o, int64_t qk_stride, int64_t v_stride) {
    if (qk_stride == 0) qk_stride = Hk * dk;
    if (v_stride == 0) v_stride = Hv * dv;
    // q, k normalised once per key head (a key head serves Hv / Hk value heads), packed (per-thread
    // buffers kept between calls: a fresh vector zero-filled 2 x T x 8 KB at the twin's shape per layer)
    const Scratch<float, 0> qn_buf(T * Hk * dk);
    const Scratch<float, 1> kn_buf(T * Hk * dk);
    float *const qn = qn_buf.get(), *const kn = kn_buf.get();
    const float q_scale = 1.f / std::sqrt((float)dk);
    parallel_ranges(T * Hk, GRAIN_FLOATS / std::max<int64_t>(1, dk), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) {
            const int64_t in = (r / Hk) * qk_stride + (r % Hk) * dk;
            kr.l2_norm(q + in, dk, q_scale, qn + r * dk);
            kr.l2_norm(k + in, dk, 1.f, kn + r * dk);
        }
    });
    const bool recurrent = mode == GdnMode::Recurrent || (mode == GdnMode::Auto && T < kr.gdn_chunked_from);
    pool()->run(Hv, [&](int64_t h, int) {
        const int64_t kh = h % Hk;
        float* const S_h = state + h * dk * dv;
        // A speculative run works on a copy; so does a run on a state not 64-byte aligned (column blocks
        // of S would straddle an extra cache line: ~20% slower here).
        const bool in_place = update_state && (uintptr_t)S_h % 64 == 0 && dv % 16 == 0;
        thread_local std::vector<float> copy;
        float* S = S_h;
        if (!in_place) {
            S = aligned_floats(copy, dk * dv);
            std::memcpy(S, S_h, dk * dv * sizeof(float));
        }
        const GdnHeadArgs a{qn + kh * dk, kn + kh * dk, v + h * dv, g + h, beta + h, S, o + h * dv,
                            T, dk, dv, Hk * dk, Hk * dk, v_stride, Hv, Hv * dv};
        if (recurrent)
            kr.gdn_recurrent(a);
        else
            gdn_chunked_head(kr, a);
        if (update_state && !in_place) std::memcpy(S_h, S, dk * dv * sizeof(float));
    });
}

void router_topk(const float* logits, int64_t T, int64_t E, int64_t k, int32_t* ids, float* weights) {
    parallel_ranges(T, std::max<int64_t>(1, GRAIN_FLOATS / std::max<int64_t>(1, E * k)), [&](int64_t t0, int64_t t1) {
        std::vector<float> p(E);
        std::vector<char> taken(E);
        for (int64_t t = t0; t < t1; t++) {
            const float* l = logits + t * E;
            float m = -INFINITY;
            for (int64_t e = 0; e < E; e++) m = std::max(m, l[e]);
            float sum = 0.f;
            for (int64_t e = 0; e < E; e++) {
                p[e] = std::exp(l[e] - m);
                sum += p[e];
            }
            for (int64_t e = 0; e < E; e++) p[e] /= sum;
            // k selection passes; strict > keeps the lower index on ties
            std::fill(taken.begin(), taken.end(), 0);
            float top_sum = 0.f;
            for (int64_t j = 0; j < k; j++) {
                int64_t best = -1;
                for (int64_t e = 0; e < E; e++)
                    if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
                taken[best] = 1;
                ids[t * k + j] = (int32_t)best;
                weights[t * k + j] = p[best];
                top_sum += p[best];
            }
            for (int64_t j = 0; j < k; j++) weights[t * k + j] /= top_sum;
        }
    });
}

void swiglu(const ModelKernels& kr, const float* gate, const float* up, int64_t n, float* y) {
    parallel_ranges(n, GRAIN_FLOATS, [&](int64_t i0, int64_t i1) { kr.swiglu(gate + i0, up + i0, i1 - i0, y + i0); });
}

void sigmoid_mul(const ModelKernels& kr, const float* x, const float* gate, int64_t n, float* y) {
    parallel_ranges(n, GRAIN_FLOATS,
                    [&](int64_t i0, int64_t i1) { kr.sigmoid_mul(x + i0, gate + i0, i1 - i0, y + i0); });
}

void gdn_gates(const float* a, const float* b, const float* dt_bias, const float* ssm_a, int64_t T, int64_t Hv,
               float* g, float* beta) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < Hv; h++) {
            const int64_t i = t * Hv + h;
            const float x = a[i] + dt_bias[h];
            const float softplus = x > 20.f ? x : std::log1p(std::exp(x));  // torch's threshold
            g[i] = ssm_a[h] * softplus;
            beta[i] = sigmoid(b[i]);
        }
}

}  // namespace clover
