#include "layers.h"

#include "model_ops.h"
#include "scratch.h"

namespace clover {

namespace {
void add_into(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}
}  // namespace

void gdn_residual(const Kernels& kr, const GdnWeights& w, float eps, float* x, int64_t T, int64_t H,
                  float* conv_state, float* ssm_state, int64_t commit) {
    const ModelKernels& mk = model_kernels_of(kr);
    const int64_t Hv = w.n_v_heads, Hk = w.n_k_heads, dk = w.dk, dv = w.dv;
    const int64_t C = w.qkv.rows, key_dim = Hk * dk, value_dim = Hv * dv;
    // (one tag per buffer: a tag is one per-thread buffer)
    const Scratch<float, 0> h(T * H);
    const Scratch<float, 1> qkv(T * C);
    const Scratch<float, 2> z(T * value_dim);
    const Scratch<float, 3> a(T * Hv);
    const Scratch<float, 4> b(T * Hv);
    const Scratch<float, 5> g(T * Hv);
    const Scratch<float, 6> beta(T * Hv);
    const Scratch<float, 7> y(T * C);
    const Scratch<float, 8> o(T * value_dim);
    const Scratch<float, 9> on(T * value_dim);
    const Scratch<float, 10> out(T * H);
    rms_norm(mk, x, w.norm, T, H, eps, h.get());
    const WeightView ws[4] = {w.qkv, w.z, w.alpha, w.beta};
    float* const ys[4] = {qkv.get(), z.get(), a.get(), b.get()};
    matmul_many(kr, ws, 4, h.get(), T, ys);
    gdn_gates(a.get(), b.get(), w.dt_bias, w.ssm_a, T, Hv, g.get(), beta.get());
    // the committed tokens [0, commit) update the states; [commit, T) run on from them without writing
    struct Span {
        int64_t t0, t1;
        bool update;
    };
    const Span spans[2] = {{0, commit, true}, {commit, T, false}};
    for (const Span& s : spans)
        if (s.t1 > s.t0)
            conv1d_silu(mk, qkv.get() + s.t0 * C, w.conv, conv_state, s.t1 - s.t0, C, w.conv_k, s.update,
                        y.get() + s.t0 * C);
    for (const Span& s : spans) {
        if (s.t1 <= s.t0) continue;
        const float* row = y.get() + s.t0 * C;  // [q | k | v] of token t0, read in place
        gated_delta_rule(mk, GdnMode::Auto, row, row + key_dim, row + 2 * key_dim, g.get() + s.t0 * Hv,
                         beta.get() + s.t0 * Hv, ssm_state, s.t1 - s.t0, Hk, Hv, dk, dv, s.update,
                         o.get() + s.t0 * value_dim, C, C);
    }
    gated_rms_norm(mk, o.get(), z.get(), w.ssm_norm, T * Hv, dv, eps, on.get());
    matmul(kr, w.out, on.get(), T, out.get());
    add_into(x, out.get(), T * H);
}

int moe_residual(const Kernels& kr, const MoeWeights& w, float eps, float* x, int64_t T, int64_t H, bool prefetch) {
    const Scratch<float, 11> h(T * H);
    const Scratch<float, 12> out(T * H);
    rms_norm(model_kernels_of(kr), x, w.norm, T, H, eps, h.get());
    const int n_used = moe_block(kr, h.get(), T, w.router, w.top_k, w.gate, w.up, w.down, w.gate_sh, w.up_sh,
                                 w.down_sh, w.shexp_gate, out.get(), prefetch);
    add_into(x, out.get(), T * H);
    return n_used;
}

}  // namespace clover
