// One q4_K product of the NEON dot-product table, REPS times: the file's layout (layout "q4_k") or the
// weights repacked by 16 rows ("q4_k_r16"), ROWS x K weights against M tokens; or the product of another
// format by name (raw random blocks with small scales; "iq3_xxs_r16" and the like: repacked as the loader
// does), by the NEON dot-product table ("iq3_xxs") or the scalar reference ("ref:iq3_xxs"). icount_aarch64.sh runs it under qemu and counts the instructions
// executed in the kernel objects.
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
        std::fprintf(stderr, "usage: %s q4_k|q4_k_r16|FORMAT|ref:FORMAT ROWS K M REPS\n", argv[0]);
        return 2;
    }
    const std::string layout = argv[1];
    const int64_t N = std::atoll(argv[2]), K = std::atoll(argv[3]);
    const int M = std::atoi(argv[4]), reps = std::atoi(argv[5]);
    if (N < 16 || N % 16 || K < QK_K || K % QK_K || M < 1 || reps < 1) {
        std::fprintf(stderr, "%s: bad arguments (ROWS a multiple of 16, K of 256)\n", argv[0]);
        return 2;
    }
    std::mt19937 rng(1);
    if (layout != "q4_k" && layout != "q4_k_r16") {
        const bool ref = layout.rfind("ref:", 0) == 0;
        const TypeInfo* ti = type_info_by_name(layout.c_str() + (ref ? 4 : 0));
        if (!ti) {
            std::fprintf(stderr, "%s: unknown format %s\n", argv[0], layout.c_str());
            return 2;
        }
        // a repacked layout (iq3_xxs_r16, ...): raw blocks of the file's type, repacked as the loader does
        const R16Format* rf = r16_format_of(ti->type);
        const R16Format* pack = rf && rf->to == ti->type ? rf : nullptr;
        const TypeInfo* packed_ti = ti;
        if (pack) ti = type_info((int32_t)pack->from);
        const Type t = ti->type;
        std::vector<uint8_t> wq(row_bytes(*ti, K) * N);
        std::uniform_int_distribution<int> byte(0, 255);
        for (auto& b : wq) b = (uint8_t)byte(rng);
        // every format's fp16 scale d (q2_K / q3_K: at the block's end; the rest: first; mxfp4: an exponent)
        const size_t bb = ti->block_bytes, nblk = wq.size() / bb;
        const size_t d_at = t == Type::Q2_K ? bb - 4 : t == Type::Q3_K ? bb - 2 : 0;
        for (size_t i = 0; i < nblk; i++) {
            uint8_t* blk = wq.data() + i * bb;
            if (t == Type::MXFP4) {
                blk[0] = 120;
            } else {
                const uint16_t h = f32_to_fp16(0.01f);
                std::memcpy(blk + d_at, &h, 2);
                if (t == Type::Q2_K || t == Type::Q4_1 || t == Type::Q5_1) std::memcpy(blk + d_at + 2, &h, 2);
            }
        }
        std::vector<float> x((size_t)(M * K));
        std::normal_distribution<float> nd;
        for (auto& v : x) v = nd(rng);
        const size_t xrb = act_row_bytes(t, K);
        std::vector<uint8_t> xq(xrb * M);
        quantize_acts(t, x.data(), M, K, xq.data());
        std::vector<float> y((size_t)(M * N));
        const Kernels& k = ref ? kernels_ref() : *kernels_neon_dotprod();
        if (pack) {
            std::vector<uint8_t> wr(row_bytes(*packed_ti, K) * N);
            pack->repack(wq.data(), row_bytes(*ti, K), 0, N / R16, K, wr.data());
            for (int i = 0; i < reps; i++)
                k.gemm(pack->to)(wr.data(), row_bytes(*packed_ti, K), xq.data(), xrb, K, M, y.data(), N, 0, N);
        } else {
            for (int i = 0; i < reps; i++) k.gemm(t)(wq.data(), row_bytes(*ti, K), xq.data(), xrb, K, M, y.data(), N, 0, N);
        }
        std::printf("%s y[0] = %g\n", layout.c_str(), y[0]);
        return 0;
    }
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
