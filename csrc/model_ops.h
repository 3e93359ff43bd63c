// Operators of the Clover forward pass: RMSNorm variants, partial NeoX RoPE, block-causal gated
// attention over an F16/F32 KV cache, causal depthwise conv, the gated delta rule (recurrent and
// chunked WY forms), router top-k, SwiGLU and the GDN gates. Sources: /work/shared/reference/
// qwen35moe-forward.md sections 3-6. Per-ISA row kernels sit in a table (model_ops.cpp: scalar,
// model_ops_avx2.cpp: AVX2, model_ops_neon.cpp: NEON); the drivers below own threading, masks and chunking.
// All arrays are float32, C-contiguous and token-major ([T, ...]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace clover {

struct Kernels;  // kernels.h

// Element type of the attention KV cache. Q8_0: each kv head's D values are D/32 blocks of ggml's
// block_q8_0 (fp16 scale d, then 32 int8 q; value = d * q), 34 bytes per 32 values, so a cache row
// [n_head_kv, D] takes n_head_kv * D / 32 * 34 bytes. D must be a multiple of 32.
enum class KvType { F32, F16, Q8_0 };
constexpr int64_t KV_Q8_BLOCK = 32, KV_Q8_BLOCK_BYTES = 34;
// Bytes of one kv head's D values in a cache of type t.
inline int64_t kv_head_bytes(KvType t, int64_t D) {
    return t == KvType::F32 ? 4 * D : t == KvType::F16 ? 2 * D : D / KV_Q8_BLOCK * KV_Q8_BLOCK_BYTES;
}

// One attention job: queries of heads [h0, h1) x tokens [t0, t1), all served by kv head g.
struct AttnArgs {
    const float* q;        // [T, n_head, D]
    const void* k;         // [S, n_head_kv, D] fp32, fp16 bits or Q8_0 blocks (KvType)
    const void* v;         // [S, n_head_kv, D]
    const int32_t* limit;  // [T]: token t attends to cache rows [0, limit[t])
    const float* gate;     // [T, n_head, D] or null: o *= sigmoid(gate)
    float* o;              // [T, n_head, D]
    int64_t n_head, n_head_kv, D;
    float scale;
};
using attention_fn = void (*)(const AttnArgs& a, int64_t g, int64_t h0, int64_t h1, int64_t t0, int64_t t1);
// Cache rows per attention tile, every kernel: fp32 K and V tiles of D=256 take 32 KB each.
constexpr int64_t ATTN_KEY_TILE = 32;
// Cache rows [s0, s0 + ns) of kv head g as fp32 for one attention tile (the next tile's rows, up to
// L_max, prefetched): *K and *V point into the cache (F32; rows *ld floats apart) or into tiles (other
// types, converted: K [ATTN_KEY_TILE, D], then V; *ld = D).
using kv_tile_fn = void (*)(const AttnArgs& a, KvType kv, int64_t g, int64_t s0, int64_t ns, int64_t L_max,
                            float* tiles, const float** K, const float** V, int64_t* ld);

// One value head of the recurrent gated delta rule, over T tokens. q, k are already L2-normalised
// (q also scaled by 1/sqrt(dk)); rows of token t start at t * *_stride floats.
struct GdnHeadArgs {
    const float* q;  // [T, dk] with q_stride
    const float* k;  // [T, dk] with k_stride
    const float* v;  // [T, dv] with v_stride
    const float* g;  // [T] with gb_stride: log decay
    const float* beta;
    float* S;  // [dk, dv] fp32, updated in place
    float* o;  // [T, dv] with o_stride
    int64_t T, dk, dv;
    int64_t q_stride, k_stride, v_stride, gb_stride, o_stride;
};

struct ModelKernels {
    const char* isa;
    // y[d] = x / sqrt(mean(x^2) + eps) * w
    void (*rms_norm)(const float* x, const float* w, int64_t d, float eps, float* y);
    // y[d] = w * (o / sqrt(mean(o^2) + eps)) * silu(z)
    void (*gated_rms_norm)(const float* o, const float* z, const float* w, int64_t d, float eps, float* y);
    // y[d] = x * rsqrt(sum(x^2) + 1e-6) * scale
    void (*l2_norm)(const float* x, int64_t d, float scale, float* y);
    void (*swiglu)(const float* gate, const float* up, int64_t n, float* y);  // silu(gate) * up
    void (*sigmoid_mul)(const float* x, const float* gate, int64_t n, float* y);
    // y[t, c] = silu(sum_j w[c, j] * xx[t + j, c]) for c in [c0, c1), xx = concat(state[K-1, C], x[T, C])
    void (*conv1d_silu)(const float* x, const float* w, const float* state, int64_t T, int64_t C, int64_t K,
                        int64_t c0, int64_t c1, float* y);
    attention_fn attention_f32;
    attention_fn attention_f16;
    attention_fn attention_q8_0;
    void (*gdn_recurrent)(const GdnHeadArgs& a);
    // C[m, n] = beta * C + alpha * A[m, k] @ B[k, n], row-major with leading dimensions; beta = 0 ignores C.
    void (*matmul)(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                   int64_t ldc, float alpha, float beta);
    int64_t gdn_chunked_from;  // GdnMode::Auto runs the chunked form from this many tokens (measured)
    // Attention with query rows in vector lanes (null where the ISA has none): for calls with at least
    // ATTN_LANE_ROWS query rows per kv head (the driver keeps tasks at that many rows or more unless a
    // thread would have none, or a last token chunk is shorter).
    attention_fn attention_lanes_f32 = nullptr;
    attention_fn attention_lanes_f16 = nullptr;
    attention_fn attention_lanes_q8_0 = nullptr;
    kv_tile_fn attention_kv_tile = nullptr;  // the SIMD tables' tile conversion (the lane kernels share it)
};
constexpr int64_t ATTN_LANE_ROWS = 8;  // at 8 rows (half the lanes) still 1.5x the AVX2 kernel (measured)

// The constants of the SIMD e^x (exp4 / exp8 in model_ops_neon.cpp and model_ops_avx2.cpp, exp16 in
// model_ops_avx512.cpp), one set for every width: x = n ln2 + r with |r| <= ln2/2 (ln2 in two parts,
// Cody-Waite), e^r = 1 + r + r^2 P(r) with Cephes expf's degree-5 minimax P (highest power first),
// 2^n from the exponent bits. About 1 ulp; 0 below ZERO_BELOW, inf above INF_ABOVE, NaN stays NaN.
// No subnormal results, and no subnormal intermediate either: inputs are clamped at X_MIN = ZERO_BELOW,
// where 2^n p is still normal (n = -126, p = e^0.0065). With the clamp a little lower (-87.34), every
// input below it made p 2^n subnormal before the blend replaced it by 0, and a subnormal product costs
// a microcode assist: a 32-token causal conv of the bench twin (large activations) took 297 us instead
// of 137 (bench/NOTES.md change 44).
struct ExpConsts {
    static constexpr float X_MIN = -87.33f, X_MAX = 88.72f;  // the input clamp
    static constexpr float LOG2E = 1.44269504088896341f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
    static constexpr float P0 = 1.9875691500e-4f, P1 = 1.3981999507e-3f, P2 = 8.3334519073e-3f,
                           P3 = 4.1665795894e-2f, P4 = 1.6666665459e-1f, P5 = 5.0000001201e-1f;
    static constexpr float INF_ABOVE = 88.7228f, ZERO_BELOW = X_MIN;  // (e^-87.33: 1.0066 x FLT_MIN)
};

// n floats of scratch in buf starting on a 64-byte boundary: 32-byte vectors never split a cache
// line (a 16-byte aligned state made the recurrent delta rule ~1.6x slower here).
inline float* aligned_floats(std::vector<float>& buf, size_t n) {
    buf.resize(n + 16);
    return (float*)(((uintptr_t)buf.data() + 63) & ~(uintptr_t)63);
}

const ModelKernels& model_kernels_ref();
const ModelKernels* model_kernels_avx2();  // null in builds without the AVX2 file
const ModelKernels* model_kernels_neon();  // null in builds without the NEON file
// AVX2's with an AVX-512 gated delta rule and attention; null without the file
const ModelKernels* model_kernels_avx512();
// The table for an ISA name ("ref", "avx2", "neon"); throws std::invalid_argument
// when the ISA is not available. The active table follows dispatch.h's active ISA.
const ModelKernels& model_kernels_for(const std::string& isa);
// The model-operator table of a kernel table's SIMD family (Kernels::family).
const ModelKernels& model_kernels_of(const Kernels& kr);
const ModelKernels& active_model_kernels();

// ---- drivers (threaded over rows or heads; results do not depend on the thread count) ----

void rms_norm(const ModelKernels& kr, const float* x, const float* w, int64_t rows, int64_t d, float eps, float* y);
void gated_rms_norm(const ModelKernels& kr, const float* o, const float* z, const float* w, int64_t rows, int64_t d,
                    float eps, float* y);

// In place on x[T, H, D]: rotate-half RoPE on dims [0, n_rot) of every head, pairs (i, i + n_rot/2),
// angle pos * theta^(-2i/n_rot) computed in double.
void rope_neox(float* x, const int32_t* pos, int64_t T, int64_t H, int64_t D, int64_t n_rot, double theta);

enum class AttnMask { Causal, BlockCausal };
// o[T, Hq, D] = softmax(scale * q k^T) v over the rows each query may see (the cache row index is the
// absolute position): causal s <= p, block-causal s / B <= p / B; always s < n_kv. A query that sees
// no row gets zeros. gate (or null): o *= sigmoid(gate). kv: the caches' element type.
void attention(const ModelKernels& kr, const float* q, const void* k, const void* v, KvType kv,
               const int32_t* q_pos, const float* gate, int64_t T, int64_t n_head, int64_t n_head_kv, int64_t D,
               int64_t n_kv, AttnMask mask, int64_t block_length, float scale, float* o);

// y[T, C] = silu(causal depthwise conv); w[C, K] (tap K-1 multiplies the current token); state[K-1, C]
// holds the last K-1 raw inputs before x, oldest first, and becomes the last K-1 rows of concat(state, x)
// when update_state.
void conv1d_silu(const ModelKernels& kr, const float* x, const float* w, float* state, int64_t T, int64_t C,
                 int64_t K, bool update_state, float* y);

enum class GdnMode { Recurrent, Chunked, Auto };
constexpr int64_t GDN_CHUNK = 64;
// Gated delta rule (reference 4.5 / 4.6). q, k [T, Hk, dk]; v [T, Hv, dv]; g, beta [T, Hv];
// state [Hv, dk, dv]; o [T, Hv, dv]. Value head h uses key head h % Hk (llama.cpp's tiled order).
// q, k are L2-normalised here, q scaled by 1/sqrt(dk). update_state = false leaves state untouched.
// Auto: the faster form for T tokens on this table (kr.gdn_chunked_from). qk_stride, v_stride: floats
// from one token's q (k) or v row to the next (0: packed, Hk * dk and Hv * dv), so q, k and v can be
// read in place from the rows of the causal conv's output.
void gated_delta_rule(const ModelKernels& kr, GdnMode mode, const float* q, const float* k, const float* v,
                      const float* g, const float* beta, float* state, int64_t T, int64_t Hk, int64_t Hv, int64_t dk,
                      int64_t dv, bool update_state, float* o, int64_t qk_stride = 0, int64_t v_stride = 0);

// Softmax over E (fp32), top-k by probability (ties: the lower expert index first), renormalised.
void router_topk(const float* logits, int64_t T, int64_t E, int64_t k, int32_t* ids, float* weights);

void swiglu(const ModelKernels& kr, const float* gate, const float* up, int64_t n, float* y);
void sigmoid_mul(const ModelKernels& kr, const float* x, const float* gate, int64_t n, float* y);

// g = ssm_a * softplus(a + dt_bias) (softplus threshold 20), beta = sigmoid(b); a, b, g, beta [T, Hv].
void gdn_gates(const float* a, const float* b, const float* dt_bias, const float* ssm_a, int64_t T, int64_t Hv,
               float* g, float* beta);

}  // namespace clover
