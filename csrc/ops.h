// Matrix products over GGUF-format weights, and the grouped mixture-of-experts product.
#pragma once

#include "formats.h"
#include "kernels.h"

namespace clover {

// A 2-D weight in GGUF layout: `rows` rows of `k` weights, each row `row_bytes` bytes.
struct WeightView {
    Type type;
    const uint8_t* data;
    int64_t rows;
    int64_t k;
    size_t row_bytes;
};

// Stacked experts [n_expert, rows, k]; expert e starts at data + e * rows * row_bytes.
struct ExpertsView {
    WeightView w;  // one expert's shape
    int64_t n_expert;
    WeightView expert(int64_t e) const {
        WeightView v = w;
        v.data = w.data + (size_t)e * (size_t)w.rows * w.row_bytes;
        return v;
    }
};

// Y[M, W.rows] = X[M, W.k] @ W^T; X float32 row-major. Activations are quantized on the fly.
void matmul(const Kernels& kr, const WeightView& W, const float* X, int64_t M, float* Y);

// Several products of the same activations: Y[i][M, Ws[i].rows] = X @ Ws[i]^T, every matrix taking
// X[M, K] (the same K). X is quantized once per activation format and one pool run covers every row
// of every matrix; each output equals matmul's for the same matrix bit for bit.
void matmul_many(const Kernels& kr, const WeightView* Ws, size_t n, const float* X, int64_t M, float* const* Ys);

// out[M, H] = sum_j weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = ids[t, j].
// gate, up: [E, I, H]; down: [E, H, I]. Returns the number of distinct experts used.
// prefetch: experts whose weights are not in memory (a mapped file larger than the page cache holds, or
// one not read yet) are requested from the disk all at once (MADV_WILLNEED) before any is computed, and
// run after the experts already in memory; the result does not change.
int moe(const Kernels& kr, const float* X, int64_t M, const int32_t* ids, const float* weights, int top_k,
        const ExpertsView& gate, const ExpertsView& up, const ExpertsView& down, float* out, bool prefetch = false);

// How many experts moe() has requested from the disk so far (all threads, since the module loaded).
int64_t experts_prefetched();

// The whole feed-forward of a Clover / Qwen3.5-MoE layer in one call:
//   out = moe(x; top-k of softmax(x @ router^T)) + sigmoid(x @ shexp_gate^T) * down_sh(silu(gate_sh(x)) * up_sh(x))
// router [E, H], shexp_gate [1, H], gate_sh / up_sh [I_sh, H], down_sh [H, I_sh]. The same operators as the
// separate calls (matmul_many, router_topk, moe, swiglu, matmul), in one pass from Python. Returns the
// number of distinct experts used.
int moe_block(const Kernels& kr, const float* X, int64_t M, const WeightView& router, int top_k,
              const ExpertsView& gate, const ExpertsView& up, const ExpertsView& down, const WeightView& gate_sh,
              const WeightView& up_sh, const WeightView& down_sh, const WeightView& shexp_gate, float* out,
              bool prefetch = false);

// Quantize M activation rows of K floats into the format that weight type t multiplies against.
void quantize_acts(Type t, const float* X, int64_t M, int64_t K, uint8_t* out);

}  // namespace clover
