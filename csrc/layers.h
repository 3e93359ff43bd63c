// Whole sub-layers of the forward pass in one call each, so a one-token forward does not pay ~300
// Python round trips (argument checks, small numpy arrays, pool wake-ups between them). Each is the
// sequence of operators the Python layer code runs (clover_cpu/model.py), with the same functions in
// the same order: results equal the separate calls bit for bit.
#pragma once

#include <cstdint>

#include "model_ops.h"
#include "ops.h"

namespace clover {

// A Gated DeltaNet layer's token mixer (reference qwen35moe-forward.md section 4).
struct GdnWeights {
    const float* norm;                // attn_norm [H]
    WeightView qkv, z, alpha, beta;   // [conv_dim | value_dim | Hv | Hv, H]
    WeightView out;                   // ssm_out [H, value_dim]
    const float* conv;                // [conv_dim, conv_k], tap conv_k - 1 on the current token
    int64_t conv_k;
    const float *dt_bias, *ssm_a;     // [Hv]
    const float* ssm_norm;            // [dv]
    int64_t n_k_heads, n_v_heads, dk, dv;
};

// A gated attention layer's token mixer (reference qwen35moe-forward.md section 3).
struct AttnWeights {
    const float* norm;             // attn_norm [H]
    WeightView q, k, v;            // [n_head * 2D (per head: query | gate) | n_head_kv * D | n_head_kv * D, H]
    WeightView o;                  // attn_output [H, n_head * D]
    const float *q_norm, *k_norm;  // [D]
    int64_t n_head, n_head_kv, D, n_rot;
    double theta;
};

// A layer's feed-forward: routed experts plus the gated shared expert (moe_block).
struct MoeWeights {
    const float* norm;  // post_attention_norm [H]
    WeightView router;
    ExpertsView gate, up, down;
    WeightView gate_sh, up_sh, down_sh, shexp_gate;
    int top_k;
};

// x[T, H] += ssm_out(gated_rms_norm(delta_rule(conv(qkv(rms_norm(x)))), z)). The first `commit`
// tokens update conv_state [conv_k - 1, conv_dim] and ssm_state [Hv, dk, dv]; the rest run on from
// there without writing them (a speculative span), as the Python layer's two spans.
void gdn_residual(const Kernels& kr, const GdnWeights& w, float eps, float* x, int64_t T, int64_t H,
                  float* conv_state, float* ssm_state, int64_t commit);

// x[T, H] += o(attention(rope(norm(q)), rope(norm(k)), v) * sigmoid(gate)) of rms_norm(x), the T tokens
// at positions n0 .. n0 + T - 1. Their keys and values are written to cache rows [n0, n0 + T) (kv:
// the caches' element type; rows of n_head_kv heads, kv_head_bytes each), which must exist; the
// queries see rows [0, n0 + T) under `mask` (block_length for the block-causal one).
void attn_residual(const Kernels& kr, const AttnWeights& w, float eps, float* x, int64_t T, int64_t H, KvType kv,
                   void* k_cache, void* v_cache, int64_t n0, AttnMask mask, int64_t block_length,
                   const int64_t* out_rows = nullptr, int64_t n_out = 0);

// Several sequences in one call (continuous batching): x holds their spans one after another, rows
// [t0, t1) for each segment. The projections run once over all T rows (one product per weight); each
// segment's recurrence, or attention over its own cache, runs on its own rows. One segment covering
// all rows is the single-sequence call above, with the same results.
struct GdnSeg {
    int64_t t0, t1;
    float* conv_state;
    float* ssm_state;
    int64_t commit;  // the segment's first `commit` tokens update its states
};
void gdn_residual_segs(const Kernels& kr, const GdnWeights& w, float eps, float* x, int64_t T, int64_t H,
                       const GdnSeg* segs, int64_t n_segs);
struct AttnSeg {
    int64_t t0, t1;
    void* k_cache;
    void* v_cache;
    int64_t n0;  // the segment's rows are positions n0 .. n0 + (t1 - t0) - 1 of its cache
    AttnMask mask;
    int64_t block_length;
};
// out_rows (n_out ascending row indices of x, or nullptr for all T rows): the rows whose outputs are wanted.
// Every row's key and value go to its cache; queries, attention and the output projection run for the out
// rows only, and the other rows of x are left as they were (a last layer whose other rows nobody reads).
void attn_residual_segs(const Kernels& kr, const AttnWeights& w, float eps, float* x, int64_t T, int64_t H, KvType kv,
                        const AttnSeg* segs, int64_t n_segs, const int64_t* out_rows = nullptr, int64_t n_out = 0);
// x[T, H] += moe_block(rms_norm(x)); returns the number of distinct routed experts used.
int moe_residual(const Kernels& kr, const MoeWeights& w, float eps, float* x, int64_t T, int64_t H, bool prefetch);

}  // namespace clover
