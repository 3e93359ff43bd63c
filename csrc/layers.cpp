#include "layers.h"

#include <cmath>
#include <cstring>

#include "formats.h"
#include "model_ops.h"
#include "quants.h"
#include "scratch.h"

namespace clover {

// Buffers: a Scratch tag is one per-thread buffer kept between calls. The three sub-layers never run
// inside one another, so each numbers its buffers from 0 and they share that memory (the largest use
// of each tag).
namespace {
void add_into(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}
}  // namespace

void gdn_residual(const Kernels& kr, const GdnWeights& w, float eps, float* x, int64_t T, int64_t H,
                  float* conv_state, float* ssm_state, int64_t commit) {
    const GdnSeg seg{0, T, conv_state, ssm_state, commit};
    gdn_residual_segs(kr, w, eps, x, T, H, &seg, 1);
}

void gdn_residual_segs(const Kernels& kr, const GdnWeights& w, float eps, float* x, int64_t T, int64_t H,
                       const GdnSeg* segs, int64_t n_segs) {
    const ModelKernels& mk = model_kernels_of(kr);
    const int64_t Hv = w.n_v_heads, Hk = w.n_k_heads, dk = w.dk, dv = w.dv;
    const int64_t C = w.qkv.rows, key_dim = Hk * dk, value_dim = Hv * dv;
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
    // per segment: its committed tokens [t0, t0 + commit) update its states; the rest run on from them
    // without writing
    struct Span {
        int64_t t0, t1;
        bool update;
    };
    for (int64_t si = 0; si < n_segs; si++) {
        const GdnSeg& sg = segs[si];
        const Span spans[2] = {{sg.t0, sg.t0 + sg.commit, true}, {sg.t0 + sg.commit, sg.t1, false}};
        for (const Span& s : spans)
            if (s.t1 > s.t0)
                conv1d_silu(mk, qkv.get() + s.t0 * C, w.conv, sg.conv_state, s.t1 - s.t0, C, w.conv_k, s.update,
                            y.get() + s.t0 * C);
        for (const Span& s : spans) {
            if (s.t1 <= s.t0) continue;
            const float* row = y.get() + s.t0 * C;  // [q | k | v] of token t0, read in place
            gated_delta_rule(mk, GdnMode::Auto, row, row + key_dim, row + 2 * key_dim, g.get() + s.t0 * Hv,
                             beta.get() + s.t0 * Hv, sg.ssm_state, s.t1 - s.t0, Hk, Hv, dk, dv, s.update,
                             o.get() + s.t0 * value_dim, C, C);
        }
    }
    gated_rms_norm(mk, o.get(), z.get(), w.ssm_norm, T * Hv, dv, eps, on.get());
    matmul(kr, w.out, on.get(), T, out.get());
    add_into(x, out.get(), T * H);
}

void attn_residual(const Kernels& kr, const AttnWeights& w, float eps, float* x, int64_t T, int64_t H, KvType kv,
                   void* k_cache, void* v_cache, int64_t n0, AttnMask mask, int64_t block_length,
                   const int64_t* out_rows, int64_t n_out) {
    const AttnSeg seg{0, T, k_cache, v_cache, n0, mask, block_length};
    attn_residual_segs(kr, w, eps, x, T, H, kv, &seg, 1, out_rows, n_out);
}

void attn_residual_segs(const Kernels& kr, const AttnWeights& w, float eps, float* x, int64_t T, int64_t H, KvType kv,
                        const AttnSeg* segs, int64_t n_segs, const int64_t* out_rows, int64_t n_out) {
    const ModelKernels& mk = model_kernels_of(kr);
    const int64_t Hq = w.n_head, Hkv = w.n_head_kv, D = w.D, QD = Hq * D, KD = Hkv * D;
    const bool all = out_rows == nullptr;
    const int64_t Q = all ? T : n_out;  // query rows
    const Scratch<float, 0> h(T * H);
    const Scratch<float, 1> qg(Q * 2 * QD);
    const Scratch<float, 2> kx(T * KD);
    const Scratch<float, 3> vr(T * KD);
    const Scratch<float, 4> q(Q * QD);
    const Scratch<float, 5> gate(Q * QD);
    const Scratch<float, 6> kn(T * KD);
    const Scratch<float, 7> o(Q * QD);
    const Scratch<float, 8> qn(Q * QD);
    const Scratch<float, 9> out(Q * H);
    const Scratch<float, 10> hq(all ? 0 : Q * H);
    const Scratch<int32_t, 0> pos(T);
    const Scratch<int32_t, 1> qpos(Q);
    rms_norm(mk, x, w.norm, T, H, eps, h.get());
    if (all) {
        const WeightView ws[3] = {w.q, w.k, w.v};
        float* const ys[3] = {qg.get(), kx.get(), vr.get()};
        matmul_many(kr, ws, 3, h.get(), T, ys);
    } else {
        const WeightView ws[2] = {w.k, w.v};
        float* const ys[2] = {kx.get(), vr.get()};
        matmul_many(kr, ws, 2, h.get(), T, ys);
        for (int64_t j = 0; j < Q; j++) std::memcpy(hq.get() + j * H, h.get() + out_rows[j] * H, H * sizeof(float));
        if (Q) matmul(kr, w.q, hq.get(), Q, qg.get());
    }
    for (int64_t r = 0; r < Q * Hq; r++) {  // per head: [query | gate]
        std::memcpy(q.get() + r * D, qg.get() + r * 2 * D, D * sizeof(float));
        std::memcpy(gate.get() + r * D, qg.get() + r * 2 * D + D, D * sizeof(float));
    }
    for (int64_t si = 0; si < n_segs; si++)
        for (int64_t t = segs[si].t0; t < segs[si].t1; t++) pos.get()[t] = (int32_t)(segs[si].n0 + t - segs[si].t0);
    for (int64_t j = 0; j < Q; j++) qpos.get()[j] = pos.get()[all ? j : out_rows[j]];
    rms_norm(mk, q.get(), w.q_norm, Q * Hq, D, eps, qn.get());
    rope_neox(qn.get(), qpos.get(), Q, Hq, D, w.n_rot, w.theta);
    rms_norm(mk, kx.get(), w.k_norm, T * Hkv, D, eps, kn.get());
    rope_neox(kn.get(), pos.get(), T, Hkv, D, w.n_rot, w.theta);
    const int64_t row = Hkv * kv_head_bytes(kv, D);
    int64_t qa = 0;  // (out rows: the first one not yet given to a segment)
    for (int64_t si = 0; si < n_segs; si++) {
        const AttnSeg& sg = segs[si];
        const int64_t t0 = sg.t0, n = sg.t1 - sg.t0;
        if (n <= 0) continue;
        // the segment's keys and values into its cache rows [n0, n0 + n)
        uint8_t* const K = (uint8_t*)sg.k_cache + sg.n0 * row;
        uint8_t* const V = (uint8_t*)sg.v_cache + sg.n0 * row;
        for (const auto& [src, dst] :
             {std::pair<const float*, uint8_t*>{kn.get() + t0 * KD, K}, {vr.get() + t0 * KD, V}}) {
            if (kv == KvType::F32) {
                std::memcpy(dst, src, n * KD * sizeof(float));
            } else if (kv == KvType::F16) {
                for (int64_t i = 0; i < n * KD; i++) ((uint16_t*)dst)[i] = f32_to_fp16(src[i]);
            } else {
                quantize_rows(Type::Q8_0, src, dst, n * Hkv, D);
            }
        }
        // its query rows [a, b): all of its own, or the out rows inside it
        int64_t a = t0, b = sg.t1;
        if (!all) {
            while (qa < Q && out_rows[qa] < t0) qa++;
            for (a = b = qa; b < Q && out_rows[b] < sg.t1;) b++;
            qa = b;
        }
        if (b > a)
            attention(mk, qn.get() + a * QD, sg.k_cache, sg.v_cache, kv, qpos.get() + a, gate.get() + a * QD, b - a, Hq,
                      Hkv, D, sg.n0 + n, sg.mask, sg.block_length, 1.f / std::sqrt((float)D), o.get() + a * QD);
    }
    if (Q == 0) return;
    matmul(kr, w.o, o.get(), Q, out.get());
    if (all) {
        add_into(x, out.get(), T * H);
    } else {
        for (int64_t j = 0; j < Q; j++) add_into(x + out_rows[j] * H, out.get() + j * H, H);
    }
}

int moe_residual(const Kernels& kr, const MoeWeights& w, float eps, float* x, int64_t T, int64_t H, bool prefetch) {
    const Scratch<float, 0> h(T * H);
    const Scratch<float, 1> out(T * H);
    rms_norm(model_kernels_of(kr), x, w.norm, T, H, eps, h.get());
    const int n_used = moe_block(kr, h.get(), T, w.router, w.top_k, w.gate, w.up, w.down, w.gate_sh, w.up_sh,
                                 w.down_sh, w.shexp_gate, out.get(), prefetch);
    add_into(x, out.get(), T * H);
    return n_used;
}

}  // namespace clover
