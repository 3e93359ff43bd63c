// The ISA-independent scaffolding of the matrix-product kernel files (kernels_avx2.cpp,
// kernels_avx512.cpp, kernels_avxvnni.cpp, kernels_neon.cpp): the argument block, the walk over register
// tiles, the software prefetch of the weight stream, the k-quant scale header, the driver of the
// k-quant lane-layout tiles and (x86) two SSE/AVX2 helpers. Everything here is in an anonymous
// namespace on purpose: each ISA file gets its own copy compiled with its own target flags (one shared
// inline copy could be picked by the linker for every file and run one ISA's code on a CPU that lacks
// it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "formats.h"

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif
#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif

#if defined(__AVX2__)
#include <immintrin.h>
#endif

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
// The distance, set by alternating values within one process (bench/NOTES.md change 29): 4096 bytes
// against 1536, the twin's 40 MoE layers at 32 tokens 5-6% faster, at one token 4-5%; 0 costs 26%.
constexpr int PREFETCH_BYTES = 4096;
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

#if defined(__AVX2__)  // (the AVX2-compiled files only)
// the sum of 4 int32
inline int32_t hsum_i32(__m128i v) {
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(v);
}

// the sum of 8 floats
inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// The 12-byte q4_K scale header as 16 bytes: the 6-bit scales (bytes 0-7) and mins (8-15); what
// decode_k4_header computes with scalar words, here by 32-bit lanes: two byte shuffles and a few shifts.
inline __m128i k4_header(const uint8_t* s12) {
    const __m128i h = _mm_loadu_si128((const __m128i*)s12);  // (+ 4 bytes of the block's nibbles, unused)
    const __m128i lo = _mm_and_si128(
        _mm_srlv_epi32(_mm_shuffle_epi8(h, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11)),
                       _mm_setr_epi32(0, 0, 0, 4)),
        _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_slli_epi32(
        _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi8(h, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5,
                                                                           6, 7)), 6),
                      _mm_set1_epi32(0x03030303)),
        4);
    return _mm_or_si128(lo, hi);
}
#endif

// ---- lane-layout tiles, two or more tokens: the k-quants (kernels_avx512.cpp, kernel_lanes256.h), and
// Q8_0 / Q4_0 over super-blocks of 8 blocks (kernels_avx512.cpp) ----

// How a tile gets a weight row: unpacked from the file's blocks (RAW), from a row unpacked earlier
// (LOAD), or from the blocks while storing the unpacked form for the next token groups (STORE).
enum class Rows { RAW, LOAD, STORE };

// The part of K a tile call covers: nb super-blocks of the row (w, u and x point at the first), one
// token's (entry's) activations `stride` entries after the previous one's. `first`: the row's sums start
// at zero, else from part, where the call for the previous K block left them; `last`: the row's sums are
// complete (in the order finish reads).
struct KSpan {
    int64_t stride;
    bool first, last;
};

// Kind::tile<rn, R> for 1 <= rn <= Kind::GROUP (only those sizes are instantiated).
template <class Kind, Rows R, int RN = Kind::GROUP>
void tile_tokens(int rn, const uint8_t* w, typename Kind::U* u, const typename Kind::X* x, int64_t nb,
                 typename Kind::Part* part, const KSpan& ks) {
    if constexpr (RN >= 1) {
        if (rn == RN)
            Kind::template tile<RN, R>(w, u, x, nb, part, ks);
        else
            tile_tokens<Kind, R, RN - 1>(rn, w, u, x, nb, part, ks);
    }
}

// Rows [n0, n1) x M tokens. Loop order for the caches: a group of tokens' activations (for one K block,
// where K is cut: k_block) stays in L1 while a chunk of weight rows (at most ~192 KB, L2-resident)
// streams past it. A tile leaves its row's partial sums per token, as SLOTS vectors (Kind::Part; slot s
// of row r at part[s * ROWS + r]), and Kind::finish reduces ROWS rows at once and stores each token's
// results as one vector: per row, one horizontal sum and one store cost as much as a super-block's
// products where K is 512 (the experts' down projections). Each row's sums reduce the same way whatever
// its place in a group, and a K block continues the sums of the one before in the same order, so
// results do not depend on how rows are split into tasks and chunks, nor K into blocks.
// What a kind's super-block is: QK_K weights against one block_q8_K (the k-quants), unless the kind
// names its own activation block XB and super-block size SB (in weights; K must be a multiple).
template <class Kind, class = void>
struct SuperBlock {
    using XB = block_q8_K;
    static constexpr int64_t VALUES = QK_K, XBLOCKS = 1;
};
template <class Kind>
struct SuperBlock<Kind, std::void_t<typename Kind::XB>> {
    using XB = typename Kind::XB;
    static constexpr int64_t VALUES = Kind::SB, XBLOCKS = Kind::SB / Kind::XB_VALUES;
};

// Tokens per group: Kind::GROUP, fewer where the group's activations would take more than 3/4 of the
// L1 data cache (the weights stream through it too). In cache, 32 tokens on Zen 4 (32 KB L1d), groups of
// 12 / 8 / 4 tokens: q4_K K=512 240 / 233 / 192 GFLOP/s, K=2048 187 / 213 / 179, K=4096 146 / 144 / 198;
// q6_K (8 / 6 / 4) K=2048 219 / 212 / 192, K=4096 124 / 138 / 186. The rule gives those best sizes
// there (q4_K 12 / 8 / 4, q6_K 8 / 4); with Zen 5's 48 KB it keeps the 12 tokens its K=2048 products
// were tuned with (bench/NOTES.md change 36). Up to 1.5x that many tokens (at most Kind::GROUP) stay one
// group: a split would leave a second group of at most half a group, for which the first group's pass
// would store every row unpacked (change 40).
inline int64_t l1d_bytes() {
    static const int64_t n = [] {
        long v = 0;
#if defined(_SC_LEVEL1_DCACHE_SIZE)
        v = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#elif defined(__APPLE__)
        int64_t b = 0;
        size_t len = sizeof(b);
        if (sysctlbyname("hw.l1dcachesize", &b, &len, nullptr, 0) == 0) v = (long)b;
#endif
        return v >= (8 << 10) && v <= (1 << 20) ? (int64_t)v : (int64_t)(32 << 10);
    }();
    return n;
}
template <class Kind>
int group_tokens(int64_t K, int M) {
    constexpr int TPE = Kind::TOKENS_PER_ENTRY;
    const int64_t per_entry = (int64_t)sizeof(typename Kind::X) * std::max<int64_t>(1, K / SuperBlock<Kind>::VALUES);
    const int64_t fit = l1d_bytes() * 3 / 4 / per_entry * TPE;
    const int G = (int)std::max<int64_t>(TPE, std::min<int64_t>(Kind::GROUP, fit));
    return M <= Kind::GROUP && 2 * M <= 3 * G ? Kind::GROUP : G;
}

// Super-blocks per K block (the last block may be shorter). Where K is so long that the L1-sized group
// would be at most half of Kind::GROUP, and more tokens than that group come, K is cut into as few
// blocks as leave each short enough for a whole group's activations to fit the same 3/4 of the L1 data
// cache: a group's pass covers one K block of a chunk's rows at a time, and each row's partial sums
// wait in memory for the next block. In cache, one thread on Zen 4 (32 KB L1d), q4_K 512 x 4096 (blocks
// of 6, 6 and 4 super-blocks, groups of 4 -> 12 tokens): 8 tokens 172-176 -> 219-229 GFLOP/s, 12
// tokens 182 -> 238-239, 32 tokens 180-196 -> 229-238; at K = 2048 (groups of 8) cutting lost 3-6% at
// 8-16 tokens (bench/NOTES.md change 42).
template <class Kind>
int64_t k_block(int64_t nb, int M) {
    constexpr int TPE = Kind::TOKENS_PER_ENTRY;
    const int G = group_tokens<Kind>(nb * SuperBlock<Kind>::VALUES, M);
    if (2 * G > Kind::GROUP || M <= G) return nb;
    const int64_t group_bytes = (int64_t)sizeof(typename Kind::X) * (Kind::GROUP / TPE);
    const int64_t fit = std::max<int64_t>(1, l1d_bytes() * 3 / 4 / group_bytes);
    if (fit >= nb) return nb;
    const int64_t blocks = (nb + fit - 1) / fit;
    return (nb + blocks - 1) / blocks;
}

template <class Kind>
void gemm_kquant_tiles(const uint8_t* W, size_t wrb, const uint8_t* X, size_t xrb, int64_t K, int M, float* Y,
                       int64_t ldy, int64_t n0, int64_t n1) {
    using XT = typename Kind::X;
    using SBK = SuperBlock<Kind>;
    using XB = typename SBK::XB;
    constexpr int TPE = Kind::TOKENS_PER_ENTRY, ROWS = Kind::ROWS;
    static_assert(Kind::GROUP % TPE == 0 && 8 % TPE == 0, "token groups start on an entry");
    const int64_t nb = K / SBK::VALUES;
    // (per-thread buffers, their addresses taken once: a thread_local named in the loops below costs a
    // __tls_get_addr call per row in this shared library, ~1% of a 32-token forward)
    thread_local std::vector<XT> xt_buf;
    xt_buf.resize((size_t)(M + TPE - 1) / TPE * nb);
    XT* const xt = xt_buf.data();
    for (int t = 0; t < M; t += TPE)
        for (int64_t b = 0; b < nb; b++) {
            const XB* src[TPE];
            for (int i = 0; i < TPE; i++)
                src[i] = t + i < M ? (const XB*)(X + (t + i) * xrb) + b * SBK::XBLOCKS : nullptr;
            Kind::reorder(src, &xt[t / TPE * nb + b]);
        }
    const int64_t chunk = std::max<int64_t>(1, (192 << 10) / (int64_t)wrb);
    // K blocks (k_block): one, unless K is long; the groups are sized for a block's activations, then
    // evened out: as many groups, of equal size (to an entry), so that no group is a short remainder
    // (q6_K 8192 x 512 in cache, one thread: 9 tokens as 8 + 1 142 GFLOP/s, as 5 + 4 167; 10: 168 ->
    // 176; the others within 0-5%: bench/NOTES.md change 45).
    const int64_t kb = k_block<Kind>(nb, M);
    int G = group_tokens<Kind>(kb * SBK::VALUES, M);
    if (M > G) {
        const int groups = (M + G - 1) / G;
        G = ((M + groups - 1) / groups + TPE - 1) / TPE * TPE;
    }
    // Several token groups: the first unpacks each row of a chunk while it computes (the weight stream
    // overlaps the products) and stores it; the others load it.
    const bool pre = M > G;
    thread_local std::vector<typename Kind::U> ut_buf;
    if (pre) ut_buf.resize((size_t)std::min(chunk, n1 - n0) * nb);
    typename Kind::U* const ut = pre ? ut_buf.data() : nullptr;
    // The rows' partial sums: one ROWS-row group's at a time, or, with several K blocks, every row
    // group's of the chunk (they carry over from one block to the next).
    // (a local type: a std::vector of a vector register type would be a weak symbol, compiled for this
    // file's ISA, that the linker may pick for any other file: test_isa_objects)
    struct RowGroupParts {
        typename Kind::Part v[Kind::SLOTS * ROWS];
    };
    RowGroupParts part_local;
    thread_local std::vector<RowGroupParts> part_buf;
    if (kb < nb) part_buf.resize((size_t)(std::min(chunk, n1 - n0) + ROWS - 1) / ROWS);
    RowGroupParts* const parts = kb < nb ? part_buf.data() : &part_local;
    const size_t wsb = wrb / (size_t)nb;  // a super-block's bytes in a row (rows hold whole super-blocks)
    for (int64_t c0 = n0; c0 < n1; c0 += chunk) {
        const int64_t c1 = std::min(n1, c0 + chunk);
        for (int m = 0; m < M; m += G) {
            const XT* x = xt + m / TPE * nb;
            const int rn = std::min(G, M - m);
            for (int64_t b0 = 0; b0 < nb; b0 += kb) {
                const int64_t b1 = std::min(nb, b0 + kb);
                const KSpan ks{nb, b0 == 0, b1 == nb};
                for (int64_t n = c0; n < c1; n += ROWS) {
                    const int rows = (int)std::min<int64_t>(ROWS, c1 - n);
                    typename Kind::Part* const part = parts[kb < nb ? (n - c0) / ROWS : 0].v;
                    for (int r = 0; r < rows; r++) {
                        const uint8_t* w = W + (n + r) * wrb + b0 * wsb;
                        typename Kind::U* u = pre ? ut + (n + r - c0) * nb + b0 : nullptr;
                        if (!pre)
                            tile_tokens<Kind, Rows::RAW>(rn, w, u, x + b0, b1 - b0, part + r, ks);
                        else if (m == 0)
                            tile_tokens<Kind, Rows::STORE>(rn, w, u, x + b0, b1 - b0, part + r, ks);
                        else
                            tile_tokens<Kind, Rows::LOAD>(rn, w, u, x + b0, b1 - b0, part + r, ks);
                    }
                    if (!ks.last) continue;
                    for (int r = rows; r < ROWS; r++)  // (a short last group: its unused rows reduce zeros)
                        for (int s = 0; s < Kind::SLOTS; s++) part[s * ROWS + r] = typename Kind::Part{};
                    Kind::finish(part, rn, rows, Y + m * ldy + n, ldy);
                }
            }
        }
    }
}

}  // namespace
}  // namespace clover
