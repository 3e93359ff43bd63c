// One q4_K product of the NEON dot-product table, REPS times: the file's layout (layout "q4_k") or the
// weights repacked by 16 rows ("q4_k_r16"), ROWS x K weights against M tokens. icount_aarch64.sh runs it
// under qemu and counts the instructions executed in the kernel object.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "formats.h"
#include "kernels.h"
#include "ops.h"
#include "quants.h"

namespace clover {
const Kernels* kernels_neon_dotprod();
}
using namespace clover;

int main(int argc, char** argv) {
    if (argc != 6) {
        std::fprintf(stderr, "usage: %s q4_k|q4_k_r16 ROWS K M REPS\n", argv[0]);
        return 2;
    }
    const std::string layout = argv[1];
    const int64_t N = std::atoll(argv[2]), K = std::atoll(argv[3]);
    const int M = std::atoi(argv[4]), reps = std::atoi(argv[5]);
    if ((layout != "q4_k" && layout != "q4_k_r16") || N < 16 || N % 16 || K < QK_K || K % QK_K || M < 1 || reps < 1) {
        std::fprintf(stderr, "%s: bad arguments (ROWS a multiple of 16, K of 256)\n", argv[0]);
        return 2;
    }
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<float> w((size_t)(N * K)), x((size_t)(M * K));
    for (auto& v : w) v = nd(rng);
    for (auto& v : x) v = nd(rng);
    const size_t wrb = row_bytes(*type_info((int32_t)Type::Q4_K), K);
    const size_t rrb = row_bytes(*type_info((int32_t)Type::Q4_K_R16), K);
    const size_t xrb = act_row_bytes(Type::Q4_K, K);
    std::vector<uint8_t> wq(wrb * N), wr(rrb * N), xq(xrb * M);
    quantize_rows(Type::Q4_K, w.data(), wq.data(), N, K);
    repack_q4_K_r16(wq.data(), wrb, 0, N / R16, K, wr.data());
    quantize_acts(Type::Q4_K, x.data(), M, K, xq.data());
    std::vector<float> y((size_t)(M * N));
    const Kernels* k = kernels_neon_dotprod();
    for (int i = 0; i < reps; i++) {
        if (layout == "q4_k")
            k->gemm(Type::Q4_K)(wq.data(), wrb, xq.data(), xrb, K, M, y.data(), N, 0, N);
        else
            k->gemm_q4_K_r16(wr.data(), rrb, xq.data(), xrb, K, M, y.data(), N, 0, N);
    }
    std::printf("%s y[0] = %g\n", layout.c_str(), y[0]);
    return 0;
}
