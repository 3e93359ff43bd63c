// The ISA-independent scaffolding of the matrix-product kernel files (kernels_avx2.cpp,
// kernels_avx512.cpp, kernels_neon.cpp): the argument block, the walk over register tiles, the
// software prefetch of the weight stream and the k-quant scale header. Everything here is in an
// anonymous namespace on purpose: each ISA file gets its own copy compiled with its own target flags
// (one shared inline copy could be picked by the linker for every file and run one ISA's code on a CPU
// that lacks it).
#pragma once

#include <cstdint>
#include <cstring>

#include "formats.h"

namespace clover {
namespace {

struct Args {
    const uint8_t* W;
    size_t wrb;
    const uint8_t* X;
    size_t xrb;
    int64_t K;
    float* Y;
    int64_t ldy;
};

// Tiles over the output: RM weight rows x RN <= 4 tokens.
template <int RM, template <int, int> class T>
void tokens(const Args& a, int64_t n, int M) {
    int m = 0;
    for (; m + 4 <= M; m += 4) T<RM, 4>::run(a, n, m);
    switch (M - m) {
        case 3: T<RM, 3>::run(a, n, m); break;
        case 2: T<RM, 2>::run(a, n, m); break;
        case 1: T<RM, 1>::run(a, n, m); break;
    }
}

// Weight rows [n0, n1) for M tokens: RM_GEMV rows per tile for one token; from RM_GEMM_FROM tokens on,
// RM_GEMM rows x up to 4 tokens; one row otherwise and for the remaining rows.
template <template <int, int> class T, int RM_GEMV, int RM_GEMM, int RM_GEMM_FROM = 2>
void gemm_tiled(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y, int64_t ldy,
                int64_t n0, int64_t n1) {
    const Args a{W, wrb, X, xrb, K, Y, ldy};
    int64_t n = n0;
    if (M == 1) {
        for (; n + RM_GEMV <= n1; n += RM_GEMV) T<RM_GEMV, 1>::run(a, n, 0);
    } else if (M >= RM_GEMM_FROM) {
        for (; n + RM_GEMM <= n1; n += RM_GEMM) tokens<RM_GEMM, T>(a, n, M);
    }
    for (; n < n1; n++) tokens<1, T>(a, n, M);
}

// Software prefetch of the weight stream: without it, out-of-cache GEMV ran at a third of the
// in-L2 speed on x86 here (the kernels consume too slowly for the hardware prefetcher to run ahead).
constexpr int PREFETCH_BYTES = 1536;
inline void prefetch_block(const void* p, int bytes) {
    for (int off = 0; off < bytes; off += 64) __builtin_prefetch((const char*)p + PREFETCH_BYTES + off);
}

// The 12-byte q4_K/q5_K scale header to 8 scales (bytes 0..7) and 8 mins (bytes 8..15).
inline void decode_k4_header(const uint8_t* s12, uint32_t out[4]) {
    constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t u[3];
    std::memcpy(u, s12, 12);
    out[0] = u[0] & kmask1;
    out[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    out[2] = u[1] & kmask1;
    out[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
}

}  // namespace
}  // namespace clover
