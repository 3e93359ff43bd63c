// One kernel table's matrix products timed in C++, one thread, no Python and no pool in the loop: the cost of
// a weight super-block (256 weights of one row) at 1..T tokens, with the weights in cache (one matrix, called
// again and again) or streamed from memory (enough copies to exceed the last-level cache). Every product is
// first checked against the scalar reference kernel (--no-check: timing only, for a kernel edited to cost out
// one of its parts). Built by bench/native/build_kbench.sh.
//
//   kbench --type q4_K --rows 512 --k 2048 --isa avx512 --tokens 1,2,3,4,8 [--dram] [--json FILE]
// (--type q4_k_r16 / q3_k_r16 / q2_k_r16 / q5_k_r16 / q6_k_r16 / iq4_xs_r16 / iq3_xxs_r16 / iq3_s_r16: the file
// type's weights repacked as the loader does, checked against the file layout's reference product;
// --range N0:N1: only rows [N0, N1) of each product, as a thread's share would be, the rest of the output
// checked to be left alone)
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dispatch.h"
#include "formats.h"
#include "lowbit.h"
#include "kernels.h"
#include "quants.h"

using namespace clover;

namespace {

[[noreturn]] void usage(const char* msg) {
    std::fprintf(stderr,
                 "kbench: %s\nusage: kbench --type q4_k|q4_k_r16|q5_k|q6_k|q8_0|q4_0|q3_k|q2_k|iq4_xs|iq3_xxs|...|f16|bf16|f32 --rows N --k K [--isa ISA] "
                 "[--tokens 1,2,4,8] [--range N0:N1] [--dram] [--reps 7] [--json FILE] [--no-check]\n",
                 msg);
    std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
    std::string type_name, isa, json;
    int64_t rows = 0, K = 0, n0 = 0, n1 = -1;
    std::vector<int> tokens = {1, 2, 3, 4, 8};
    bool dram = false, check = true;
    int reps = 7;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) usage(("missing value after " + a).c_str());
            return argv[++i];
        };
        if (a == "--type") type_name = next();
        else if (a == "--rows") rows = std::atoll(next().c_str());
        else if (a == "--k") K = std::atoll(next().c_str());
        else if (a == "--isa") isa = next();
        else if (a == "--dram") dram = true;
        else if (a == "--no-check") check = false;
        else if (a == "--reps") reps = std::atoi(next().c_str());
        else if (a == "--json") json = next();
        else if (a == "--range") {
            const std::string s = next();
            const size_t c = s.find(':');
            char* e0 = nullptr;
            char* e1 = nullptr;
            if (c != std::string::npos) {
                n0 = std::strtoll(s.c_str(), &e0, 10);
                n1 = std::strtoll(s.c_str() + c + 1, &e1, 10);
            }
            if (c == std::string::npos || e0 != s.c_str() + c || *e1 != '\0' || c == 0 || c + 1 == s.size())
                usage("--range takes N0:N1");
        }
        else if (a == "--tokens") {
            tokens.clear();
            std::string s = next();
            for (size_t p = 0; p < s.size();) {
                const size_t q = s.find(',', p);
                tokens.push_back(std::atoi(s.substr(p, q - p).c_str()));
                p = q == std::string::npos ? s.size() : q + 1;
            }
        } else usage(("unknown option " + a).c_str());
    }
    for (char& c : type_name) c = (char)std::tolower((unsigned char)c);
    const TypeInfo* ti = type_info_by_name(type_name.c_str());
    if (!ti) usage("--type: unknown type");
    if (rows < 1 || K < 1 || K % QK_K) usage("--rows >= 1 and --k a multiple of 256 are required");
    if (reps < 1) usage("--reps must be >= 1");
    if (n1 < 0) n1 = rows;
    if (n0 < 0 || n0 >= n1 || n1 > rows) usage("--range: 0 <= N0 < N1 <= --rows");
    if (tokens.empty()) usage("--tokens: give at least one count");
    for (int M : tokens)
        if (M < 1 || M > 512) usage("--tokens: each count in 1..512");
    if (isa.empty()) isa = available_isas().back();
    const Kernels* kr = nullptr;
    try {
        kr = &kernels_for(isa);
    } catch (const std::exception& e) {
        usage(("--isa: " + std::string(e.what())).c_str());
    }
    const Type t = ti->type;
    // q4_k_r16: q4_K weights repacked as the loader does (repack_q4_K_r16), checked against q4_K's reference
    const R16Format* rf = r16_format_of(t);
    const bool r16 = rf && rf->to == t;
    const Type tq = r16 ? rf->from : t;
    if (r16 && rows % R16) usage("--type *_r16 takes --rows in multiples of 16");
    const int maxM = *std::max_element(tokens.begin(), tokens.end());
    const size_t qrb = row_bytes(*type_info((int32_t)tq), K), wrb = row_bytes(*ti, K), xrb = act_row_bytes(t, K);

    std::mt19937 gen(1);
    std::normal_distribution<float> nd;
    std::vector<float> wf((size_t)rows * K), xf((size_t)maxM * K);
    for (float& v : wf) v = nd(gen);
    for (float& v : xf) v = nd(gen);
    std::vector<uint8_t> wq((size_t)rows * qrb), w((size_t)rows * wrb), xq((size_t)maxM * xrb);
    if (has_quantizer(tq)) {
        quantize_rows(tq, wf.data(), wq.data(), rows, K);
    } else {
        // no quantizer here (IQ3_S, IQ3_XXS, IQ2_*, IQ1_*, MXFP4): random blocks, with the leading scale (an fp16 d,
        // or MXFP4's e8m0 exponent) set to a modest value so that products stay finite
        std::uniform_int_distribution<int> byte(0, 255);
        for (uint8_t& b : wq) b = (uint8_t)byte(gen);
        const size_t bb = type_info((int32_t)tq)->block_bytes;  // (the file type's blocks, before any repacking)
        for (size_t o = 0; o < wq.size(); o += bb) {
            if (tq == Type::MXFP4) {
                wq[o] = 120;
            } else if (tq == Type::IQ1_M) {  // d in the top nibbles of the 4 scale words
                iq1m_set_d(*(block_iq1_m*)&wq[o], f32_to_fp16(0.01f * (1 + (wq[o] & 7))));
            } else {
                const uint16_t d = f32_to_fp16(0.01f * (1 + (wq[o] & 7)));
                std::memcpy(&wq[o], &d, 2);
            }
        }
    }
    if (r16)
        rf->repack(wq.data(), qrb, 0, rows / R16, K, w.data());
    else
        w = wq;
    quantize_act_rows(t, xf.data(), 0, maxM, K, xq.data());
    // from memory: copies of the matrix filling 512 MB, far more than a last-level cache
    const int64_t n_mats = dram ? std::max<int64_t>(2, (512ll << 20) / (int64_t)w.size()) : 1;
    std::vector<uint8_t> all((size_t)n_mats * w.size());
    for (int64_t i = 0; i < n_mats; i++) std::memcpy(all.data() + i * w.size(), w.data(), w.size());

    const gemm_fn fn = kr->gemm(t), ref = kernels_ref().gemm(tq);
    std::vector<float> y((size_t)maxM * rows), yr((size_t)maxM * rows);
    const int64_t nr = n1 - n0;
    const double sbs = (double)nr * (double)(K / QK_K);  // super-block rows per product
    char range[64] = "";
    if (nr != rows) std::snprintf(range, sizeof range, ", rows [%lld, %lld)", (long long)n0, (long long)n1);
    std::printf("%s %lldx%lld%s, isa %s, %s, one thread\n", ti->name, (long long)rows, (long long)K, range, kr->isa,
                dram ? "weights from memory" : "weights in cache");
    std::printf("%6s %12s %9s %14s %9s %9s %10s\n", "tokens", "us/product", "ns/SB", "ns/SB/token", "GB/s",
                "GFLOP/s", "max err");
    std::string js = "{\"type\": \"" + std::string(ti->name) + "\", \"rows\": " + std::to_string(rows) +
                     ", \"k\": " + std::to_string(K) + ", \"range\": [" + std::to_string(n0) + ", " +
                     std::to_string(n1) + "], \"isa\": \"" + kr->isa + "\", \"dram\": " +
                     (dram ? "true" : "false") + ", \"results\": [";
    for (size_t ti_ = 0; ti_ < tokens.size(); ti_++) {
        const int M = tokens[ti_];
        const float sentinel = -12345.f;  // rows outside [n0, n1) must keep it
        std::fill(y.begin(), y.end(), sentinel);
        fn(w.data(), wrb, xq.data(), xrb, K, M, y.data(), rows, n0, n1);
        ref(wq.data(), qrb, xq.data(), xrb, K, M, yr.data(), rows, n0, n1);
        double err = 0, scale = 0;
        bool outside = true;
        for (int m = 0; m < M; m++)
            for (int64_t n = 0; n < rows; n++) {
                const size_t i = (size_t)m * rows + n;
                if (n < n0 || n >= n1) {
                    outside = outside && y[i] == sentinel;
                    continue;
                }
                err = std::max(err, (double)std::fabs(y[i] - yr[i]));
                scale = std::max(scale, (double)std::fabs(yr[i]));
            }
        const double rel = err / std::max(scale, 1e-30);
        if (check && !(rel < 1e-4 && outside)) {
            if (!outside)
                std::fprintf(stderr, "kbench: %s at %d tokens wrote outside rows [%lld, %lld)\n", kr->isa, M,
                             (long long)n0, (long long)n1);
            else
                std::fprintf(stderr, "kbench: %s at %d tokens differs from the reference kernel (max rel. error %.3g)\n",
                             kr->isa, M, rel);
            return 1;
        }
        // in cache: repeat the one matrix for ~20 ms; from memory: one pass over the copies
        const int loops = dram ? 1 : std::max(1, (int)(2e7 / std::max(1.0, sbs * M * 3.0)));
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            const auto t0 = std::chrono::steady_clock::now();
            for (int l = 0; l < loops; l++)
                for (int64_t i = 0; i < n_mats; i++)
                    fn(all.data() + i * w.size(), wrb, xq.data(), xrb, K, M, y.data(), rows, n0, n1);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            best = std::min(best, s / loops / (double)n_mats);
        }
        const double ns_sb = best / sbs * 1e9;
        const double gbs = (double)nr * (double)wrb / best / 1e9, gflops = 2.0 * nr * K * M / best / 1e9;
        std::printf("%6d %12.2f %9.2f %14.2f %9.1f %9.0f %10.2g\n", M, best * 1e6, ns_sb, ns_sb / M, gbs, gflops,
                    rel);
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "%s{\"tokens\": %d, \"us_per_product\": %.3f, \"ns_per_superblock\": %.3f, \"gb_per_s\": %.2f, "
                      "\"gflop_per_s\": %.1f, \"max_rel_error\": %.3g}",
                      ti_ ? ", " : "", M, best * 1e6, ns_sb, gbs, gflops, rel);
        js += buf;
    }
    js += "]}\n";
    if (!json.empty()) {
        FILE* f = std::fopen(json.c_str(), "w");
        const bool wrote = f && std::fputs(js.c_str(), f) >= 0;
        if (!(f && std::fclose(f) == 0 && wrote)) {
            std::fprintf(stderr, "kbench: cannot write %s\n", json.c_str());
            return 1;
        }
    }
    return 0;
}
