#include "ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include "model_ops.h"
#include "quants.h"
#include "scratch.h"
#include "threadpool.h"

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#define CLOVER_HAVE_MINCORE 1
#endif

namespace clover {

namespace {

constexpr int64_t ROW_TILE = 16;   // task sizes are multiples of this many weight rows
constexpr int64_t TOKEN_PANEL = 64;  // tokens per kernel call: a panel of activations stays in L2
// Below this many multiply-adds a product runs on the calling thread: waking the pool costs more
// (tens of microseconds, far more on a loaded machine) than the work.
constexpr int64_t MIN_PARALLEL_MACS = 1 << 21;

// Rows per task: about 4 tasks per thread so dynamic scheduling can balance, at least one tile, at
// most max_rows. A single-token product (GEMV) is bound by memory, not by the cores: one contiguous
// task per thread streams better (512x2048 q4_K on a 2-core x86 VM: 29-34 GB/s against 25-27 with 4 tasks
// per thread), up to 1024 rows per task (a one-token forward of the twin 5% faster than with 256,
// 1% slower uncapped: a noisy VM needs some balancing; bench/NOTES.md change 29).
constexpr int64_t MAX_TASK_ROWS = 1024;
int64_t rows_per_task(int64_t rows, int n_threads, int64_t n_groups = 1, int64_t M = 2,
                      int64_t max_rows = MAX_TASK_ROWS) {
    const int64_t per_thread = M == 1 ? 1 : 4;
    const int64_t want_tasks = std::max<int64_t>(1, per_thread * n_threads / std::max<int64_t>(1, n_groups));
    int64_t r = (rows + want_tasks - 1) / want_tasks;
    r = (r + ROW_TILE - 1) / ROW_TILE * ROW_TILE;
    return std::max<int64_t>(ROW_TILE, std::min<int64_t>(r, max_rows));
}

// Run the kernel over rows [n0, n1) of W for M activation rows, in token panels.
void gemm_rows(gemm_fn fn, const WeightView& W, const uint8_t* Xq, size_t xrb, int64_t M, float* Y, int64_t ldy,
               int64_t n0, int64_t n1) {
    for (int64_t m0 = 0; m0 < M; m0 += TOKEN_PANEL) {
        const int mc = (int)std::min<int64_t>(TOKEN_PANEL, M - m0);
        fn(W.data, W.row_bytes, Xq + m0 * xrb, xrb, W.k, mc, Y + m0 * ldy, ldy, n0, n1);
    }
}

// Whether the product of W with M tokens runs on AMX tiles: the table has them (Kernels::amx), and from
// amx->min_tokens(W.type) tokens they beat the int8 products.
bool use_amx(const Kernels& kr, const WeightView& W, int64_t M) {
    if (!kr.amx || W.k % 32 != 0) return false;
    const int from = kr.amx->min_tokens(W.type);
    return from > 0 && M >= from;
}

// Rows rounded up to whole tiles of 16 (AmxOps::to_bf16's layout).
int64_t amx_tile_rows(int64_t M) { return (M + 15) / 16 * 16; }

// Rows M .. M rounded up to 16 of Xb (AmxOps::to_bf16's layout) set to zero: a tile reads 16 rows. (Those
// rows feed only results that are never stored; zero, a buffer's reused bytes are never read.)
void amx_zero_pad(const Kernels& kr, int64_t M, int64_t K, uint16_t* Xb) {
    thread_local std::vector<float> zeros;
    zeros.resize(K);  // (never written: zeros)
    for (int64_t m = M; m < amx_tile_rows(M); m++) kr.amx->to_bf16(zeros.data(), 1, K, Xb, m);
}

// X (M x K) as the AMX products' bf16 activations in xb: whole tiles, the rows past M zero.
void amx_acts(const Kernels& kr, const float* X, int64_t M, int64_t K, std::vector<uint16_t>& xb) {
    xb.resize((size_t)amx_tile_rows(M) * K);
    kr.amx->to_bf16(X, M, K, xb.data(), 0);
    amx_zero_pad(kr, M, K, xb.data());
}

void amx_rows(const Kernels& kr, const WeightView& W, const uint16_t* Xb, int64_t M, float* Y, int64_t ldy,
              int64_t n0, int64_t n1) {
    kr.amx->gemm(W.type, W.data, W.row_bytes, W.rows, W.k, Xb, M, Y, ldy, n0, n1);
}

std::atomic<int64_t> g_experts_prefetched{0};

#if CLOVER_HAVE_MINCORE
size_t page_size() {
    static const size_t n = (size_t)sysconf(_SC_PAGESIZE);
    return n;
}

// Whether the page holding p is in memory (an address mincore refuses counts as in memory).
bool in_memory(const void* p) {
    const uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page_size() - 1);
#if defined(__APPLE__)
    char v = 0;
#else
    unsigned char v = 0;
#endif
    return mincore((void*)a, 1, &v) != 0 || (v & 1);
}

// Ask the kernel to start reading [p, p + n) of a mapped file now (it returns before the reads finish).
void will_need(const void* p, size_t n) {
    const uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page_size() - 1);
    madvise((void*)a, (uintptr_t)p + n - a, MADV_WILLNEED);
}
#else
bool in_memory(const void*) { return true; }
void will_need(const void*, size_t) {}
#endif

// Request the experts of `used` that are not wholly in memory (the first or last page of one of their
// three slices is not), and move them after the others (keeping the order within each group), so the
// cores work on resident experts while the disk reads. A page fault reads one readahead window around
// the page, one fault at a time per thread; here every missing expert's slices are in flight at once
// (600 KB ranges of a cold file on a 2-core x86 VM: 0.10 -> 0.9-1.1 GB/s).
void prefetch_experts(std::vector<int64_t>& used, const ExpertsView& gate, const ExpertsView& up,
                      const ExpertsView& down) {
    std::vector<int64_t> warm, cold;
    for (const int64_t e : used) {
        bool resident = true;
        for (const ExpertsView* x : {&gate, &up, &down}) {
            const uint8_t* p = x->expert(e).data;
            resident = resident && in_memory(p) && in_memory(p + (size_t)x->w.rows * x->w.row_bytes - 1);
        }
        (resident ? warm : cold).push_back(e);
        if (!resident)
            for (const ExpertsView* x : {&gate, &up, &down})
                will_need(x->expert(e).data, (size_t)x->w.rows * x->w.row_bytes);
    }
    if (cold.empty()) return;
    warm.insert(warm.end(), cold.begin(), cold.end());
    used.swap(warm);
    g_experts_prefetched.fetch_add((int64_t)cold.size());
}

}  // namespace

void quantize_acts(Type t, const float* X, int64_t M, int64_t K, uint8_t* out) {
    if (M * K < (1 << 16)) {
        quantize_act_rows(t, X, 0, M, K, out);
    } else {
        pool()->run(M, [&](int64_t m, int) { quantize_act_rows(t, X, m, m + 1, K, out); });
    }
}

void matmul(const Kernels& kr, const WeightView& W, const float* X, int64_t M, float* Y) {
    auto p = pool();
    if (use_amx(kr, W, M)) {
        thread_local std::vector<uint16_t> xb;
        amx_acts(kr, X, M, W.k, xb);
        const uint16_t* Xb = xb.data();  // (the workers' own thread_local xb is another vector)
        const int64_t chunk = rows_per_task(W.rows, p->size(), 1, M);
        p->run((W.rows + chunk - 1) / chunk, [&](int64_t task, int) {
            const int64_t n0 = task * chunk;
            amx_rows(kr, W, Xb, M, Y, W.rows, n0, std::min(W.rows, n0 + chunk));
        });
        return;
    }
    const size_t xrb = act_row_bytes(W.type, W.k);
    thread_local std::vector<uint8_t> xq;
    xq.resize(xrb * M);
    quantize_acts(W.type, X, M, W.k, xq.data());
    const uint8_t* Xq = xq.data();

    // (a GEMV is bandwidth-bound: more than a few pages of weights are worth both cores)
    const bool small = W.rows * M * W.k < MIN_PARALLEL_MACS && W.rows * (int64_t)W.row_bytes < (64 << 10);
    const int64_t chunk = small ? W.rows : rows_per_task(W.rows, p->size(), 1, M);
    const int64_t n_tasks = (W.rows + chunk - 1) / chunk;
    const gemm_fn fn = kr.gemm(W.type);
    p->run(n_tasks, [&](int64_t task, int) {
        const int64_t n0 = task * chunk, n1 = std::min(W.rows, n0 + chunk);
        gemm_rows(fn, W, Xq, xrb, M, Y, W.rows, n0, n1);
    });
}

void matmul_many(const Kernels& kr, const WeightView* Ws, size_t n, const float* X, int64_t M, float* const* Ys) {
    // one quantized copy of X per activation format (fp32 / q8_a / q8_K), in per-thread buffers as matmul's
    thread_local std::vector<uint8_t> xq[3];
    thread_local std::vector<uint16_t> xb;  // the AMX products' bf16 activations
    bool done[3] = {false, false, false}, done_b = false;
    std::vector<const uint8_t*> xs(n);
    std::vector<size_t> xrbs(n);
    int64_t macs = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        macs += Ws[i].rows * M * Ws[i].k;
        bytes += Ws[i].rows * (int64_t)Ws[i].row_bytes;
        if (use_amx(kr, Ws[i], M)) {
            if (!done_b) amx_acts(kr, X, M, Ws[i].k, xb);
            done_b = true;
            xs[i] = nullptr;
            continue;
        }
        const int f = (int)act_format(Ws[i].type);
        xrbs[i] = act_row_bytes(Ws[i].type, Ws[i].k);
        if (!done[f]) {
            xq[f].resize(xrbs[i] * M);
            quantize_acts(Ws[i].type, X, M, Ws[i].k, xq[f].data());
            done[f] = true;
        }
        xs[i] = xq[f].data();
    }
    // tasks: (matrix, row chunk), chunks sized as matmul's for the matrices' total
    auto p = pool();
    const bool small = macs < MIN_PARALLEL_MACS && bytes < (64 << 10);
    struct Task {
        size_t i;
        int64_t n0, n1;
    };
    std::vector<Task> tasks;
    for (size_t i = 0; i < n; i++) {
        const int64_t rows = Ws[i].rows;
        const int64_t chunk = small ? rows : rows_per_task(rows, p->size(), (int64_t)n, M);
        for (int64_t n0 = 0; n0 < rows; n0 += chunk) tasks.push_back({i, n0, std::min(rows, n0 + chunk)});
    }
    const uint16_t* Xb = xb.data();  // (not xb in the lambda: the workers' thread_local xb is another vector)
    auto run_task = [&](int64_t t, int) {
        const Task& tk = tasks[t];
        const WeightView& W = Ws[tk.i];
        if (use_amx(kr, W, M)) {
            amx_rows(kr, W, Xb, M, Ys[tk.i], W.rows, tk.n0, tk.n1);
        } else {
            gemm_rows(kr.gemm(W.type), W, xs[tk.i], xrbs[tk.i], M, Ys[tk.i], W.rows, tk.n0, tk.n1);
        }
    };
    if (small) {
        for (size_t t = 0; t < tasks.size(); t++) run_task((int64_t)t, 0);
    } else {
        p->run((int64_t)tasks.size(), run_task);
    }
}

int moe_block(const Kernels& kr, const float* X, int64_t M, const WeightView& router, int top_k,
              const ExpertsView& gate, const ExpertsView& up, const ExpertsView& down, const WeightView& gate_sh,
              const WeightView& up_sh, const WeightView& down_sh, const WeightView& shexp_gate, float* out,
              bool prefetch) {
    const int64_t E = router.rows, I = gate_sh.rows, H = down_sh.rows;
    const Scratch<float, 0> logits_buf(M * E);
    float* const logits = logits_buf.get();
    const Scratch<float, 1> g_buf(M * I);
    float* const g = g_buf.get();
    const Scratch<float, 2> u_buf(M * I);
    float* const u = u_buf.get();
    const Scratch<float, 3> sg_buf(M);
    float* const sg = sg_buf.get();
    const WeightView first[4] = {router, gate_sh, up_sh, shexp_gate};
    float* const ys[4] = {logits, g, u, sg};
    matmul_many(kr, first, 4, X, M, ys);
    std::vector<int32_t> ids(M * top_k);
    std::vector<float> w(M * top_k);
    router_topk(logits, M, E, top_k, ids.data(), w.data());
    const int n_used = moe(kr, X, M, ids.data(), w.data(), top_k, gate, up, down, out, prefetch);
    const ModelKernels& mk = model_kernels_of(kr);
    swiglu(mk, g, u, M * I, g);
    const Scratch<float, 4> shared_buf(M * H);
    float* const shared = shared_buf.get();
    matmul(kr, down_sh, g, M, shared);
    for (int64_t t = 0; t < M; t++) {
        const float s = 1.f / (1.f + std::exp(-sg[t]));
        float* o = out + t * H;
        const float* sh = shared + t * H;
        for (int64_t n = 0; n < H; n++) o[n] += s * sh[n];
    }
    return n_used;
}

int64_t experts_prefetched() { return g_experts_prefetched.load(); }

int moe(const Kernels& kr, const float* X, int64_t M, const int32_t* ids, const float* weights, int top_k,
        const ExpertsView& gate, const ExpertsView& up, const ExpertsView& down, float* out, bool prefetch) {
    const int64_t E = gate.n_expert;
    const int64_t H = gate.w.k, I = gate.w.rows;
    const int64_t n_slots = M * top_k;

    // Group the (token, slot) pairs by expert: slots sorted by expert, stable in token order.
    std::vector<int64_t> count(E + 1, 0), offset(E + 1, 0);
    for (int64_t s = 0; s < n_slots; s++) count[ids[s]]++;
    for (int64_t e = 0; e < E; e++) offset[e + 1] = offset[e] + count[e];
    std::vector<int64_t> slot_pos(n_slots), pos_token(n_slots);
    {
        std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
        for (int64_t s = 0; s < n_slots; s++) {
            const int64_t p = fill[ids[s]]++;
            slot_pos[s] = p;
            pos_token[p] = s / top_k;
        }
    }
    std::vector<int64_t> used;
    for (int64_t e = 0; e < E; e++)
        if (count[e] > 0) used.push_back(e);
    // Busiest experts first, so the long tasks start early.
    std::stable_sort(used.begin(), used.end(), [&](int64_t a, int64_t b) { return count[a] > count[b]; });
    if (prefetch) prefetch_experts(used, gate, up, down);

    // Which experts' products take AMX tiles (use_amx, by each expert's own token count: where the table has
    // them); the others take the int8 activations.
    const bool any_amx = kr.amx && H % 32 == 0 && I % 32 == 0 &&
                         (use_amx(kr, gate.w, n_slots) || use_amx(kr, up.w, n_slots) || use_amx(kr, down.w, n_slots));
    auto gate_amx = [&](int64_t e) { return any_amx && use_amx(kr, gate.w, count[e]); };
    auto up_amx = [&](int64_t e) { return any_amx && use_amx(kr, up.w, count[e]); };
    auto down_amx = [&](int64_t e) { return any_amx && use_amx(kr, down.w, count[e]); };
    bool need_xq = false, need_hq = false;
    for (const int64_t e : used) {
        need_xq = need_xq || !gate_amx(e) || !up_amx(e);
        need_hq = need_hq || !down_amx(e);
    }

    // Activations quantized once, then gathered in expert order (where an expert needs them).
    const size_t xrb = act_row_bytes(gate.w.type, H);
    const Scratch<uint8_t, 10> xq_buf(need_xq ? xrb * M : 0);
    uint8_t* const xq = xq_buf.get();
    const Scratch<uint8_t, 11> xg_buf(need_xq ? xrb * n_slots : 0);
    uint8_t* const xg = xg_buf.get();
    if (need_xq) {
        quantize_acts(gate.w.type, X, M, H, xq);
        for (int64_t p = 0; p < n_slots; p++) std::memcpy(&xg[p * xrb], &xq[pos_token[p] * xrb], xrb);
    }
    // For the tiles: the tokens' rows as bf16 (xb) and the hidden rows after the gate (hb), in the tiles'
    // layout, each expert's from a tile of its own (tile_off[e] rows in), the rows past its count zero.
    std::vector<int64_t> tile_off(E + 1, 0);
    if (any_amx)
        for (int64_t e = 0; e < E; e++) tile_off[e + 1] = tile_off[e] + amx_tile_rows(count[e]);
    const Scratch<uint16_t, 16> xb_buf(any_amx ? (size_t)tile_off[E] * H : 0);
    uint16_t* const xb = xb_buf.get();
    const Scratch<uint16_t, 17> hb_buf(any_amx ? (size_t)tile_off[E] * I : 0);
    uint16_t* const hb = hb_buf.get();
    for (const int64_t e : used) {
        if (gate_amx(e) || up_amx(e)) {
            for (int64_t p = offset[e]; p < offset[e] + count[e]; p++)
                kr.amx->to_bf16(X + pos_token[p] * H, 1, H, xb + tile_off[e] * H, p - offset[e]);
            amx_zero_pad(kr, count[e], H, xb + tile_off[e] * H);
        }
        if (down_amx(e)) amx_zero_pad(kr, count[e], I, hb + tile_off[e] * I);
    }

    auto pl = pool();
    // small problems: one task per phase, on the calling thread
    const int n_threads = n_slots * I * H * 3 < MIN_PARALLEL_MACS ? 0 : pl->size();
    const int64_t n_used = (int64_t)used.size();

    // Phase 1: h = silu(gate(x)) * up(x) for every (expert, row chunk); phase 2: the down projections,
    // written per slot. Tasks are whole experts when there are at least 4 experts per thread
    // (rows_per_task's rule, uncapped: one stream per matrix, the activations reordered once; against
    // 256-row tasks the twin's MoE ran 7-8% faster at 8 and 32 tokens, 9% at one); then one task runs
    // an expert's both phases, without a barrier between them. Fewer experts: row chunks, two phases.
    const ModelKernels& mk = model_kernels_of(kr);
    const Scratch<float, 12> g_buf((size_t)n_slots * I);
    float* const g = g_buf.get();
    const Scratch<float, 13> u_buf((size_t)n_slots * I);
    float* const u = u_buf.get();
    const gemm_fn gate_fn = kr.gemm(gate.w.type), up_fn = kr.gemm(up.w.type), down_fn = kr.gemm(down.w.type);
    const int64_t chunk1 = n_threads ? rows_per_task(I, n_threads, n_used, 2, I) : I;
    const int64_t chunk2 = n_threads ? rows_per_task(H, n_threads, n_used, 2, H) : H;
    const int64_t per1 = (I + chunk1 - 1) / chunk1, per2 = (H + chunk2 - 1) / chunk2;
    const size_t hrb = act_row_bytes(down.w.type, I);
    const Scratch<uint8_t, 14> hq_buf(need_hq ? hrb * n_slots : 0);
    uint8_t* const hq = hq_buf.get();
    const Scratch<float, 15> d_buf((size_t)n_slots * H);
    float* const d = d_buf.get();
    auto run = [&](int64_t n, const std::function<void(int64_t, int)>& fn) {
        if (n_threads) {
            pl->run(n, fn);
        } else {
            for (int64_t t = 0; t < n; t++) fn(t, 0);
        }
    };
    auto up_rows = [&](int64_t e, int64_t n0, int64_t n1) {
        const int64_t o = offset[e], ne = count[e];
        const WeightView ge = gate.expert(e), ue = up.expert(e);
        if (gate_amx(e)) {
            amx_rows(kr, ge, &xb[tile_off[e] * H], ne, &g[o * I], I, n0, n1);
        } else {
            gemm_rows(gate_fn, ge, &xg[o * xrb], xrb, ne, &g[o * I], I, n0, n1);
        }
        if (up_amx(e)) {
            amx_rows(kr, ue, &xb[tile_off[e] * H], ne, &u[o * I], I, n0, n1);
        } else {
            gemm_rows(up_fn, ue, &xg[o * xrb], xrb, ne, &u[o * I], I, n0, n1);
        }
        for (int64_t t = o; t < o + ne; t++)  // (the SIMD silu: scalar expf was ~2% of a 32-token MoE)
            mk.swiglu(&g[t * I + n0], &u[t * I + n0], n1 - n0, &g[t * I + n0]);
    };
    auto down_rows = [&](int64_t e, int64_t n0, int64_t n1) {
        if (down_amx(e)) {
            amx_rows(kr, down.expert(e), &hb[tile_off[e] * I], count[e], &d[offset[e] * H], H, n0, n1);
        } else {
            gemm_rows(down_fn, down.expert(e), &hq[offset[e] * hrb], hrb, count[e], &d[offset[e] * H], H, n0, n1);
        }
    };
    if (per1 == 1 && per2 == 1) {
        run(n_used, [&](int64_t task, int) {
            const int64_t e = used[task];
            up_rows(e, 0, I);
            if (down_amx(e)) {
                kr.amx->to_bf16(&g[offset[e] * I], count[e], I, &hb[tile_off[e] * I], 0);
            } else {
                quantize_act_rows(down.w.type, g, offset[e], offset[e] + count[e], I, hq);
            }
            down_rows(e, 0, H);
        });
    } else {
        run(n_used * per1, [&](int64_t task, int) {
            const int64_t n0 = (task % per1) * chunk1;
            up_rows(used[task / per1], n0, std::min(I, n0 + chunk1));
        });
        if (need_hq) quantize_acts(down.w.type, g, n_slots, I, hq);
        for (const int64_t e : used)
            if (down_amx(e)) kr.amx->to_bf16(&g[offset[e] * I], count[e], I, &hb[tile_off[e] * I], 0);
        run(n_used * per2, [&](int64_t task, int) {
            const int64_t n0 = (task % per2) * chunk2;
            down_rows(used[task / per2], n0, std::min(H, n0 + chunk2));
        });
    }

    // Phase 3: weighted sum over each token's slots, in slot order (independent of threads), 64 outputs
    // at a time in a local buffer: the slots' rows come from the other threads' caches, and summing each
    // into the whole output row re-read and re-wrote it once per slot (32 tokens of the twin, perf:
    // 1.5% of the samples -> 0.7-0.9).
    auto combine = [&](int64_t t, int) {
        constexpr int64_t NC = 64;
        float* o = out + t * H;
        for (int64_t n0 = 0; n0 < H; n0 += NC) {
            const int64_t nc = std::min(NC, H - n0);
            float acc[NC] = {};
            for (int j = 0; j < top_k; j++) {
                const float w = weights[t * top_k + j];
                const float* src = &d[slot_pos[t * top_k + j] * H + n0];
                for (int64_t i = 0; i < nc; i++) acc[i] += w * src[i];
            }
            std::memcpy(o + n0, acc, nc * sizeof(float));
        }
    };
    if (M * H < (1 << 15)) {
        for (int64_t t = 0; t < M; t++) combine(t, 0);
    } else {
        pl->run(M, combine);
    }
    return (int)n_used;
}

}  // namespace clover
