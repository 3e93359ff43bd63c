// AVX2 + AVX-VNNI (256-bit vpdpbusd without AVX-512: Intel client CPUs from Alder Lake on; AMD Zen 5
// has it too): q4_K, q5_K and q6_K products for two or more tokens in the lane layout (kernel_lanes256.h),
// one vpdpbusd per 4 products. Every other entry is the AVX2 table's (kernels_avxvnni() is that table
// with the k-quant entries replaced), and one token still runs the AVX2 GEMVs. The repacked q4_K
// (q4_k_r16, kernel_r16_256.h) runs vpdpbusd chains here, for every token count.
#include <immintrin.h>

#include "kernel_lanes256.h"
#include "kernel_r16_256.h"
#include "kernels.h"

namespace clover {

namespace {

// vpdpbusd: the int32 lanes are the chain, any length.
struct DotVnni {
    using Sum = __m256i;
    // kernel_r16_256.h's tile: 6 tokens per weight load. Against 4, on a 2-core Xeon with AVX-VNNI, the
    // twin's forwards in alternating processes, median of 10 pairs: 32 tokens +13%, 128 +18% (per-pair
    // ratios 0.92-1.37: that machine's noise is as wide as the effect; bench/NOTES.md, change 49).
    static constexpr int R16_TOKENS = 6;
    static constexpr int chain(int) { return 1 << 20; }
    static __m256i start(__m256i v) { return v; }
    static __m256i dot(__m256i s, __m256i q, __m256i x) { return _mm256_dpbusd_avx_epi32(s, q, x); }
    static __m256i end(__m256i, __m256i s) { return s; }
};

gemm_fn g_gemv[3] = {};  // the AVX2 table's q4_K, q5_K and q6_K kernels, for one token

template <int I, class Kind>
void gemm_vnni(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
               int64_t n0, int64_t n1) {
    if (M == 1) return g_gemv[I](W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
    gemm_kquant_tiles<Kind>(W, wrb, X, xrb, K, M, Y, ldy, n0, n1);
}

Kernels make_table() {
    Kernels k = *kernels_avx2();
    k.isa = "avxvnni";  // (family "avx2": the model operators and the rest of the table are AVX2's)
    g_gemv[0] = k.gemm_q4_K;
    g_gemv[1] = k.gemm_q5_K;
    g_gemv[2] = k.gemm_q6_K;
    k.gemm_q4_K = gemm_vnni<0, KindQ45KV<DotVnni, false>>;
    k.gemm_q5_K = gemm_vnni<1, KindQ45KV<DotVnni, true>>;
    k.gemm_q6_K = gemm_vnni<2, KindQ6KV<DotVnni>>;
    k.gemm_q4_K_r16 = gemm_r16<TileR16<DotVnni>>;
    k.gemm_q5_K_r16 = nullptr;  // (its own vpdpbusd q5_K products; AVX2's repacked tile not measured here)
    k.gemm_q6_K_r16 = nullptr;  // (the vpdpbusd lane tiles from 2 tokens; AVX2's repacked tile not measured here)
    return k;
}

}  // namespace

const Kernels* kernels_avxvnni() {
    static const Kernels table = make_table();
    return &table;
}

}  // namespace clover
