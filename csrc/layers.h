// Whole sub-layers of the forward pass in one call each, so a one-token forward does not pay ~300
// Python round trips (argument checks, small numpy arrays, pool wake-ups between them). Each is the
// sequence of operators the Python layer code runs (clover_cpu/model.py), with the same functions in
// the same order: results equal the separate calls bit for bit.
#pragma once

#include <cstdint>

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

// x[T, H] += moe_block(rms_norm(x)); returns the number of distinct routed experts used.
int moe_residual(const Kernels& kr, const MoeWeights& w, float eps, float* x, int64_t T, int64_t H, bool prefetch);

}  // namespace clover
