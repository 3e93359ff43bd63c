// AVX2 + AVX-VNNI (256-bit vpdpbusd without AVX-512: Intel client CPUs from Alder Lake on; AMD Zen 5
// has it too): q4_K and q6_K products for two or more tokens in the lane layout (kernel_lanes256.h),
// one vpdpbusd per 4 products. Every other entry is the AVX2 table's (kernels_avxvnni() is that table
// with gemm_q4_K and gemm_q6_K replaced), and one token still runs the AVX2 GEMVs.
#include <immintrin.h>

#include "kernel_lanes256.h"
#include "kernels.h"

namespace clover {

namespace {

// vpdpbusd: the int32 lanes are the chain, any length.
struct DotVnni {
    using Sum = __m256i;
    static constexpr int CHAIN6 = 4;
    static __m256i zero() { return _mm256_setzero_si256(); }
    static __m256i dot(__m256i s, __m256i q, __m256i x) { return _mm256_dpbusd_avx_epi32(s, q, x); }
    static __m256i widen(__m256i s) { return s; }
    static __m256i start(__m256i v) { return v; }
    static __m256i end(__m256i, __m256i s) { return s; }
};

gemm_fn g_gemv_q4k = nullptr, g_gemv_q6k = nullptr;  // the AVX2 table's kernels, for one token

void gemm_q4k_vnni(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y,
                   int64_t ldy, int64_t n0, int64_t n1) {
    if (M == 1) return g_gemv_q4k(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
    gemm_kquant_tiles<KindQ4KV<DotVnni>>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
}

void gemm_q6k_vnni(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y,
                   int64_t ldy, int64_t n0, int64_t n1) {
    if (M == 1) return g_gemv_q6k(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
    gemm_kquant_tiles<KindQ6KV<DotVnni>>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
}

Kernels make_table() {
    Kernels k = *kernels_avx2();
    k.isa = "avxvnni";  // (family "avx2": the model operators and the rest of the table are AVX2's)
    g_gemv_q4k = k.gemm_q4_K;
    g_gemv_q6k = k.gemm_q6_K;
    k.gemm_q4_K = gemm_q4k_vnni;
    k.gemm_q6_K = gemm_q6k_vnni;
    return k;
}

}  // namespace

const Kernels* kernels_avxvnni() {
    static const Kernels table = make_table();
    return &table;
}

}  // namespace clover
