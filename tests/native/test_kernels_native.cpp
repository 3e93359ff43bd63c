// The SIMD kernel tables of this build against the scalar reference, without Python: every format on
// random and adversarial data, at shapes that are not multiples of the tiles, and the MoE product against
// per-expert matmuls. run_aarch64.sh builds it for aarch64 and runs it under qemu-user; on an x86 build
// (with kernels_avx2.cpp) it checks AVX2 the same way.
// Usage: test_kernels_native [--expect-dotprod=yes|no]. Ends with the line "N passed, M failed".
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch.h"
#include "formats.h"
#include "lowbit.h"
#include "kernels.h"
#include "model_ops.h"
#include "ops.h"
#include "quants.h"

namespace clover {
// Both builds of kernels_neon.cpp (defined there; kernels.h declares only the dispatched kernels_neon()).
const Kernels* kernels_neon_plain();
const Kernels* kernels_neon_dotprod();
}  // namespace clover

using namespace clover;

namespace {

// SIMD vs scalar: the same integer block dots, only the float summation order differs (of max |ref|).
constexpr double TOL_VS_REF = 2e-5;
// MoE vs the same kernels run expert by expert: grouping must not change the numbers.
constexpr double TOL_MOE_GROUPING = 1e-6;
// MoE vs per-expert products on the scalar kernels: a hidden value that lands within rounding of an int8
// step boundary may requantize one step differently (about 1/127 of one of I terms). Without such a step
// the difference is float summation order only (below 1e-6 here; k-quants are bit for bit).
constexpr double TOL_MOE_VS_REF = 2e-3;

int g_passed = 0, g_failed = 0;

struct Table {
    std::string name;
    const Kernels* k;
};

struct Format {
    Type type;
    const char* name;
    int block;  // weights per block; 1 for the float formats
};

const Format FORMATS[] = {
    {Type::F32, "f32", 1},      {Type::F16, "f16", 1},     {Type::BF16, "bf16", 1},    {Type::Q8_0, "q8_0", QK},
    {Type::Q4_0, "q4_0", QK},   {Type::Q4_K, "q4_K", QK_K}, {Type::Q5_K, "q5_K", QK_K}, {Type::Q6_K, "q6_K", QK_K},
};

// the low-bit and legacy formats (lowbit.h); fill_raw_blocks gives each its raw blocks
const Format LOWBIT[] = {
    {Type::Q2_K, "q2_K", QK_K},       {Type::Q3_K, "q3_K", QK_K},       {Type::IQ4_XS, "iq4_xs", QK_K},
    {Type::IQ2_XXS, "iq2_xxs", QK_K}, {Type::IQ2_XS, "iq2_xs", QK_K},   {Type::IQ2_S, "iq2_s", QK_K},
    {Type::IQ3_XXS, "iq3_xxs", QK_K}, {Type::IQ3_S, "iq3_s", QK_K},     {Type::Q4_1, "q4_1", QK},
    {Type::Q5_0, "q5_0", QK},         {Type::Q5_1, "q5_1", QK},         {Type::IQ4_NL, "iq4_nl", QK},
    {Type::MXFP4, "mxfp4", QK},       {Type::IQ1_S, "iq1_s", QK_K},     {Type::IQ1_M, "iq1_m", QK_K},
};

const Format& format(Type t) {
    for (const Format& f : FORMATS)
        if (f.type == t) return f;
    for (const Format& f : LOWBIT)
        if (f.type == t) return f;
    return FORMATS[0];
}

bool is_float(Type t) { return t == Type::F32 || t == Type::F16 || t == Type::BF16; }

// Compare got against want (both n values); print the first mismatches and the max difference on failure.
bool check(const std::string& what, const float* got, const float* want, size_t n, double tol) {
    double scale = 0.0;
    for (size_t i = 0; i < n; i++) scale = std::max(scale, std::fabs((double)want[i]));
    double max_diff = 0.0;
    size_t n_bad = 0;
    std::string lines;
    for (size_t i = 0; i < n; i++) {
        const double diff = std::fabs((double)got[i] - (double)want[i]);
        if (!(diff <= tol * scale)) {  // NaN fails too
            if (n_bad < 5) {
                char buf[160];
                std::snprintf(buf, sizeof buf, "    at %zu: got %.9g, want %.9g\n", i, got[i], want[i]);
                lines += buf;
            }
            n_bad++;
        }
        if (!(diff <= max_diff)) max_diff = diff;
    }
    if (n_bad == 0) {
        g_passed++;
        return true;
    }
    g_failed++;
    std::printf("FAIL %s: %zu of %zu values off; max diff %.3e (tolerance %.1e x %.3e)\n%s", what.c_str(), n_bad, n,
                max_diff, tol, scale, lines.c_str());
    return false;
}

void expect(bool ok, const std::string& what) {
    if (ok) {
        g_passed++;
    } else {
        g_failed++;
        std::printf("FAIL %s\n", what.c_str());
    }
}

// ---- weights ----

enum class WData { RANDOM, LARGE, ZERO, EXTREME, RAW, MINUS_128 };
const char* wdata_name(WData d) {
    switch (d) {
        case WData::RANDOM: return "random";
        case WData::LARGE: return "large";
        case WData::ZERO: return "zero";
        case WData::EXTREME: return "extreme";
        case WData::RAW: return "raw-bytes";
        case WData::MINUS_128: return "minus-128";
    }
    return "?";
}

std::vector<float> normal(std::mt19937& rng, size_t n, float scale) {
    std::normal_distribution<float> dist(0.f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

// Random bytes in every field of every block, with finite scales of moderate size: covers bit patterns
// the quantizers never write (all 6-bit scales and mins, q6_K scales of -128, q8_0 quants of -128).
void fill_raw_blocks(std::mt19937& rng, Type t, uint8_t* data, size_t n_blocks) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
    const TypeInfo& ti = *type_info((int32_t)t);
    for (size_t i = 0; i < n_blocks * ti.block_bytes; i++) data[i] = (uint8_t)byte(rng);
    for (size_t b = 0; b < n_blocks; b++) {
        uint8_t* blk = data + b * ti.block_bytes;
        auto set_half = [&](size_t offset) {
            const uint16_t h = f32_to_fp16(scale(rng));
            std::memcpy(blk + offset, &h, 2);
        };
        switch (t) {
            case Type::Q8_0: set_half(offsetof(block_q8_0, d)); break;
            case Type::Q4_0: set_half(offsetof(block_q4_0, d)); break;
            case Type::Q4_K:
                set_half(offsetof(block_q4_K, d));
                set_half(offsetof(block_q4_K, dmin));
                break;
            case Type::Q5_K:
                set_half(offsetof(block_q5_K, d));
                set_half(offsetof(block_q5_K, dmin));
                break;
            case Type::Q6_K: set_half(offsetof(block_q6_K, d)); break;
            case Type::Q2_K:
                set_half(offsetof(block_q2_K, d));
                set_half(offsetof(block_q2_K, dmin));
                break;
            case Type::Q3_K: set_half(offsetof(block_q3_K, d)); break;
            case Type::Q4_1:
            case Type::Q5_1:  // (d, then m: the same offsets in both)
                set_half(0);
                set_half(2);
                break;
            case Type::MXFP4: blk[0] = (uint8_t)(118 + byte(rng) % 16); break;  // 2^-10 .. 2^5
            case Type::Q5_0: case Type::IQ4_NL: case Type::IQ4_XS: case Type::IQ2_XXS: case Type::IQ2_XS:
            case Type::IQ2_S: case Type::IQ3_XXS: case Type::IQ3_S: case Type::IQ1_S:
                set_half(0);  // (d first)
                break;
            case Type::IQ1_M: iq1m_set_d(*(block_iq1_m*)blk, f32_to_fp16(scale(rng))); break;  // (d in the scale words)
            default: break;
        }
    }
}

std::vector<uint8_t> make_weights(std::mt19937& rng, const Format& f, int64_t N, int64_t K, WData d) {
    const TypeInfo& ti = *type_info((int32_t)f.type);
    std::vector<uint8_t> w(row_bytes(ti, K) * N);
    std::vector<float> x((size_t)(N * K), 0.f);
    switch (d) {
        case WData::RANDOM: x = normal(rng, x.size(), 1.f); break;
        case WData::LARGE: x = normal(rng, x.size(), 1e3f); break;
        case WData::ZERO: break;
        case WData::EXTREME:
            // +-1 alternating, all +1 and all -1 rows: the largest quants each format allows
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) {
                    const float alt = k % 2 ? -1.f : 1.f;
                    x[n * K + k] = n % 3 == 0 ? alt : n % 3 == 1 ? 1.f : -1.f;
                }
            break;
        case WData::RAW:
        case WData::MINUS_128: break;
    }
    quantize_rows(f.type, x.data(), w.data(), N, K);
    if (d == WData::RAW) fill_raw_blocks(rng, f.type, w.data(), w.size() / ti.block_bytes);
    if (d == WData::MINUS_128) {  // a file may hold -128 in a Q8_0 block; the quantizer never writes it
        quantize_rows(f.type, normal(rng, x.size(), 1.f).data(), w.data(), N, K);
        for (size_t b = 0; b < w.size() / sizeof(block_q8_0); b++)
            std::memset(((block_q8_0*)w.data())[b].qs, 0x80, QK);
    }
    return w;
}

// ---- activations, quantized with the shared quantizer (ops.h) as the product does ----

enum class XData { RANDOM, LARGE, ZERO, SPIKY, EXTREME, RAW };
const char* xdata_name(XData d) {
    switch (d) {
        case XData::RANDOM: return "random";
        case XData::LARGE: return "large";
        case XData::ZERO: return "zero";
        case XData::SPIKY: return "spiky";
        case XData::EXTREME: return "extreme";
        case XData::RAW: return "raw-int8";
    }
    return "?";
}

std::vector<uint8_t> make_acts(std::mt19937& rng, const Format& f, int64_t M, int64_t K, XData d) {
    std::vector<float> x((size_t)(M * K), 0.f);
    switch (d) {
        case XData::RANDOM:
        case XData::RAW: x = normal(rng, x.size(), 1.f); break;
        case XData::LARGE: x = normal(rng, x.size(), 1e4f); break;
        case XData::ZERO: break;
        case XData::SPIKY:  // one dominant value per 32, the rest tiny
            x = normal(rng, x.size(), 1e-3f);
            for (size_t i = 0; i < x.size(); i++)
                if (i % 32 == 5) x[i] = 100.f;
            break;
        case XData::EXTREME:  // rows of +1 and of -1: activation quants of +-127
            for (int64_t m = 0; m < M; m++)
                for (int64_t k = 0; k < K; k++) x[m * K + k] = m % 2 ? -1.f : 1.f;
            break;
    }
    std::vector<uint8_t> q(act_row_bytes(f.type, K) * M);
    quantize_acts(f.type, x.data(), M, K, q.data());
    if (d == XData::RAW && !is_float(f.type)) {
        // any int8 in -127..127 (the activation quantizers' range), bsums kept consistent
        std::uniform_int_distribution<int> qv(-127, 127);
        if (act_format(f.type) == ActFormat::Q8_A) {
            for (size_t b = 0; b < q.size() / sizeof(block_q8_a); b++)
                for (auto& v : ((block_q8_a*)q.data())[b].qs) v = (int8_t)qv(rng);
        } else {
            for (size_t b = 0; b < q.size() / sizeof(block_q8_K); b++) {
                block_q8_K& blk = ((block_q8_K*)q.data())[b];
                for (int g = 0; g < QK_K / 16; g++) {
                    int s = 0;
                    for (int j = 0; j < 16; j++) {
                        blk.qs[16 * g + j] = (int8_t)qv(rng);
                        s += blk.qs[16 * g + j];
                    }
                    blk.bsums[g] = (int16_t)s;
                }
            }
        }
    }
    return q;
}

// ---- one gemm against the reference ----

// Rows [n0, n1) of an N-row weight for M tokens, output with a padded stride. Cells outside the
// requested rows must keep their sentinel.
// With r16 (q4_K weights only), the table multiplies those weights repacked (block_q4_K_r16) against the
// reference's product in the file's layout.
void check_gemm(const Table& tb, const Format& f, int64_t N, int64_t K, int M, int64_t n0, int64_t n1,
                const std::vector<uint8_t>& w, const std::vector<uint8_t>& x, const std::string& what,
                const std::vector<uint8_t>* r16 = nullptr, double tol = TOL_VS_REF) {
    const size_t wrb = row_bytes(*type_info((int32_t)f.type), K), xrb = act_row_bytes(f.type, K);
    const int64_t ldy = N + 3;
    const float sentinel = -12345.f;
    std::vector<float> want((size_t)(M * ldy), sentinel), got((size_t)(M * ldy), sentinel);
    kernels_ref().gemm(f.type)(w.data(), wrb, x.data(), xrb, K, M, want.data(), ldy, n0, n1);
    if (r16)
        tb.k->gemm_q4_K_r16(r16->data(), row_bytes(*type_info((int32_t)Type::Q4_K_R16), K), x.data(), xrb, K, M,
                            got.data(), ldy, n0, n1);
    else
        tb.k->gemm(f.type)(w.data(), wrb, x.data(), xrb, K, M, got.data(), ldy, n0, n1);
    std::vector<float> g, r;
    bool outside_ok = true;
    for (int m = 0; m < M; m++)
        for (int64_t n = 0; n < ldy; n++) {
            const float a = got[m * ldy + n], b = want[m * ldy + n];
            if (n >= n0 && n < n1) {
                g.push_back(a);
                r.push_back(b);
            } else if (a != sentinel) {
                outside_ok = false;
            }
        }
    const std::string name = tb.name + " " + (r16 ? "q4_k_r16" : f.name) + " " + what;
    if (!check(name, g.data(), r.data(), g.size(), tol)) return;
    expect(outside_ok, name + ": wrote outside rows [n0, n1)");
}

std::string shape(int64_t N, int64_t K, int M, int64_t n0, int64_t n1) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "N=%lld K=%lld M=%d rows=[%lld,%lld)", (long long)N, (long long)K, M, (long long)n0,
                  (long long)n1);
    return buf;
}

void test_gemm(const Table& tb, std::mt19937& rng) {
    const int Ms[] = {1, 2, 3, 4, 5, 7, 8, 33};
    const int64_t Ns[] = {1, 3, 6, 9};  // tiles are 4 rows (M = 1) or 2 rows
    for (const Format& f : FORMATS) {
        // K: the smallest block multiple, and a few blocks; float formats also any K (scalar tails)
        std::vector<int64_t> Ks;
        if (f.block == 1)
            Ks = {1, 3, 4, 7, 9, 31, 64, 257};
        else
            Ks = {f.block, 3 * f.block};
        // random data over every shape, full rows and an odd sub-range of rows
        for (int64_t K : Ks)
            for (int64_t N : Ns)
                for (int M : Ms) {
                    const auto w = make_weights(rng, f, N, K, WData::RANDOM);
                    const auto x = make_acts(rng, f, M, K, XData::RANDOM);
                    check_gemm(tb, f, N, K, M, 0, N, w, x, "random " + shape(N, K, M, 0, N));
                    if (N > 2) check_gemm(tb, f, N, K, M, 1, N - 1, w, x, "random " + shape(N, K, M, 1, N - 1));
                }
        // adversarial data at a few shapes
        const int64_t K = f.block == 1 ? 67 : 2 * f.block;
        std::vector<std::pair<WData, XData>> cases = {
            {WData::ZERO, XData::RANDOM}, {WData::RANDOM, XData::ZERO},   {WData::ZERO, XData::ZERO},
            {WData::LARGE, XData::LARGE}, {WData::RANDOM, XData::SPIKY},  {WData::EXTREME, XData::EXTREME},
        };
        if (!is_float(f.type)) {
            cases.push_back({WData::RAW, XData::RAW});
            cases.push_back({WData::RAW, XData::EXTREME});
        }
        if (f.type == Type::Q8_0) {
            cases.push_back({WData::MINUS_128, XData::EXTREME});
            cases.push_back({WData::MINUS_128, XData::RAW});
        }
        for (const auto& [wd, xd] : cases)
            for (int M : {1, 5, 33})
                for (int64_t N : {int64_t(3), int64_t(9)}) {
                    const auto w = make_weights(rng, f, N, K, wd);
                    const auto x = make_acts(rng, f, M, K, xd);
                    check_gemm(tb, f, N, K, M, 0, N, w, x,
                               std::string(wdata_name(wd)) + " weights, " + xdata_name(xd) + " acts " +
                                   shape(N, K, M, 0, N));
                }
    }
}

// q4_K weights repacked in groups of 16 rows: whole groups, rows that start or end inside a group (the
// kernels' fallback), token counts across the tiles' groups and panels, and raw blocks (every scale and
// min, all-15 nibbles).
std::vector<uint8_t> repacked(const std::vector<uint8_t>& w, int64_t N, int64_t K) {
    std::vector<uint8_t> out(w.size() / sizeof(block_q4_K) * sizeof(block_q4_K_r16) / R16);
    repack_q4_K_r16(w.data(), row_bytes(*type_info((int32_t)Type::Q4_K), K), 0, N / R16, K, out.data());
    return out;
}

void test_gemm_r16(const Table& tb, std::mt19937& rng) {
    const Format& f = format(Type::Q4_K);
    // the NEON kernel does the reference's arithmetic (integer sums, then its float expression): bit for bit
    const double tol = tb.name.rfind("neon", 0) == 0 ? 0.0 : TOL_VS_REF;
    const int64_t ranges[][2] = {{0, 48}, {16, 32}, {3, 43}, {5, 11}};
    for (int64_t K : {int64_t(QK_K), int64_t(3 * QK_K)})
        for (int M : {1, 2, 3, 4, 5, 7, 8, 17, 33}) {
            const auto w = make_weights(rng, f, 48, K, WData::RANDOM);
            const auto x = make_acts(rng, f, M, K, XData::RANDOM);
            const auto r = repacked(w, 48, K);
            for (const auto& nn : ranges)
                check_gemm(tb, f, 48, K, M, nn[0], nn[1], w, x, "random " + shape(48, K, M, nn[0], nn[1]), &r, tol);
        }
    const std::pair<WData, XData> cases[] = {
        {WData::RAW, XData::RAW}, {WData::RAW, XData::EXTREME}, {WData::LARGE, XData::LARGE},
        {WData::EXTREME, XData::EXTREME}, {WData::ZERO, XData::RANDOM}, {WData::RANDOM, XData::ZERO},
    };
    for (const auto& [wd, xd] : cases)
        for (int M : {1, 2, 5, 33}) {
            const int64_t K = 2 * QK_K;
            auto w = make_weights(rng, f, 32, K, wd);
            if (wd == WData::RAW && M == 5)  // all-15 nibbles: the largest sums
                for (size_t b = 0; b < w.size() / sizeof(block_q4_K); b++)
                    std::memset(((block_q4_K*)w.data())[b].qs, 0xff, QK_K / 2);
            const auto x = make_acts(rng, f, M, K, xd);
            const auto r = repacked(w, 32, K);
            check_gemm(tb, f, 32, K, M, 0, 32, w, x,
                       std::string(wdata_name(wd)) + " weights, " + xdata_name(xd) + " acts " + shape(32, K, M, 0, 32),
                       &r, tol);
        }
}

// ---- the low-bit and legacy formats (lowbit.h) ----


// Raw blocks (every index, sign, scale and bit pattern) of any of these formats, or, for those with a
// quantizer, quantized random weights.
std::vector<uint8_t> lowbit_weights(std::mt19937& rng, const Format& f, int64_t N, int64_t K, bool raw) {
    const TypeInfo& ti = *type_info((int32_t)f.type);
    std::vector<uint8_t> w(row_bytes(ti, K) * N);
    if (!raw && has_quantizer(f.type))
        quantize_rows(f.type, normal(rng, (size_t)(N * K), 1.f).data(), w.data(), N, K);
    else
        fill_raw_blocks(rng, f.type, w.data(), w.size() / ti.block_bytes);
    return w;
}

void test_gemm_lowbit(const Table& tb, std::mt19937& rng) {
    // the NEON kernels do the reference's arithmetic (integer sums, then its float expression): bit for bit
    const double tol = tb.name.rfind("neon", 0) == 0 ? 0.0 : TOL_VS_REF;
    for (const Format& f : LOWBIT) {
        for (int64_t K : {int64_t(f.block), int64_t(3 * f.block)})
            for (int64_t N : {int64_t(1), int64_t(5), int64_t(9)})
                for (int M : {1, 2, 3, 4, 5, 8, 33})
                    for (bool raw : {true, false}) {
                        const auto w = lowbit_weights(rng, f, N, K, raw);
                        const auto x = make_acts(rng, f, M, K, raw ? XData::RAW : XData::RANDOM);
                        const std::string what = std::string(raw ? "raw" : "quantized") + " " + shape(N, K, M, 0, N);
                        check_gemm(tb, f, N, K, M, 0, N, w, x, what, nullptr, tol);
                        if (N > 2) check_gemm(tb, f, N, K, M, 1, N - 1, w, x, what + " inner rows", nullptr, tol);
                    }
        for (XData xd : {XData::EXTREME, XData::ZERO, XData::SPIKY, XData::LARGE}) {
            const auto w = lowbit_weights(rng, f, 6, 2 * f.block, true);
            const auto x = make_acts(rng, f, 5, 2 * f.block, xd);
            check_gemm(tb, f, 6, 2 * f.block, 5, 0, 6, w, x, std::string("raw weights, ") + xdata_name(xd) + " acts",
                       nullptr, tol);
        }
    }
}

// iq4_xs, iq4_nl and mxfp4 repacked, iq3_xxs and iq3_s transcoded (block_iq4_xs_r16's layout) against the
// reference's product of the file's blocks: raw blocks (every code, scale and sign), whole groups and rows
// that start or end inside one, 1-33 tokens.
void test_gemm_codes_r16(const Table& tb, std::mt19937& rng) {
    const double tol = tb.name.rfind("neon", 0) == 0 ? 0.0 : TOL_VS_REF;
    const int64_t N = 48, ranges[][2] = {{0, 48}, {16, 32}, {3, 43}, {5, 11}};
    for (Type packed : {Type::IQ4_XS_R16, Type::IQ3_XXS_R16, Type::IQ3_S_R16, Type::IQ4_NL_R16, Type::MXFP4_R16}) {
        const R16Format& c = *r16_format_of(packed);
        const Format& f = format(c.from);
        const TypeInfo &fi = *type_info((int32_t)c.from), &pi = *type_info((int32_t)c.to);
        for (int64_t K : {int64_t(QK_K), int64_t(3 * QK_K)})
            for (int M : {1, 2, 3, 5, 8, 17, 33}) {
                std::vector<uint8_t> w(row_bytes(fi, K) * N), r(row_bytes(pi, K) * N);
                fill_raw_blocks(rng, c.from, w.data(), w.size() / fi.block_bytes);
                c.repack(w.data(), row_bytes(fi, K), 0, N / R16, K, r.data());
                const auto x = make_acts(rng, f, M, K, M % 2 ? XData::RAW : XData::RANDOM);
                for (const auto& nn : ranges) {
                    const int64_t ldy = N + 3;
                    std::vector<float> want((size_t)(M * ldy), -1.f), got((size_t)(M * ldy), -1.f);
                    kernels_ref().gemm(c.from)(w.data(), row_bytes(fi, K), x.data(), act_row_bytes(c.from, K), K, M,
                                               want.data(), ldy, nn[0], nn[1]);
                    tb.k->gemm(c.to)(r.data(), row_bytes(pi, K), x.data(), act_row_bytes(c.from, K), K, M,
                                         got.data(), ldy, nn[0], nn[1]);
                    check(tb.name + " " + pi.name + " raw " + shape(N, K, M, nn[0], nn[1]), got.data(), want.data(),
                          got.size(), tol);
                }
            }
    }
}

// ---- mixture of experts ----

float silu(float x) { return x / (1.f + std::exp(-x)); }

struct Experts {
    std::vector<uint8_t> data;
    ExpertsView view;
};

// r16: q4_K experts repacked in groups of 16 rows, as the loader does (rows a multiple of 16).
Experts make_experts(std::mt19937& rng, const Format& f, int64_t E, int64_t rows, int64_t k, bool r16 = false) {
    Experts ex;
    const size_t rb = row_bytes(*type_info((int32_t)f.type), k);
    ex.data.resize(rb * rows * E);
    if (has_quantizer(f.type))
        quantize_rows(f.type, normal(rng, (size_t)(E * rows * k), 0.2f).data(), ex.data.data(), E * rows, k);
    else  // (the i-quant grids: raw blocks)
        fill_raw_blocks(rng, f.type, ex.data.data(), ex.data.size() / type_info((int32_t)f.type)->block_bytes);
    ex.view = ExpertsView{WeightView{f.type, ex.data.data(), rows, k, rb}, E};
    if (r16 && f.type == Type::Q4_K) {
        ex.data = repacked(ex.data, E * rows, k);
        ex.view = ExpertsView{WeightView{Type::Q4_K_R16, ex.data.data(), rows, k,
                                         row_bytes(*type_info((int32_t)Type::Q4_K_R16), k)},
                              E};
    }
    return ex;
}

// out[t] = sum_j w[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), one token and one expert at a time.
std::vector<float> moe_per_expert(const Kernels& kr, const std::vector<float>& X, int64_t M,
                                  const std::vector<int32_t>& ids, const std::vector<float>& wts, int top_k,
                                  const Experts& gate, const Experts& up, const Experts& down) {
    const int64_t H = gate.view.w.k, I = gate.view.w.rows;
    std::vector<float> out((size_t)(M * H), 0.f), g(I), u(I), d(H);
    for (int64_t t = 0; t < M; t++)
        for (int j = 0; j < top_k; j++) {
            const int64_t e = ids[t * top_k + j];
            matmul(kr, gate.view.expert(e), &X[t * H], 1, g.data());
            matmul(kr, up.view.expert(e), &X[t * H], 1, u.data());
            for (int64_t i = 0; i < I; i++) g[i] = silu(g[i]) * u[i];
            matmul(kr, down.view.expert(e), g.data(), 1, d.data());
            for (int64_t n = 0; n < H; n++) out[t * H + n] += wts[t * top_k + j] * d[n];
        }
    return out;
}

void test_moe(const Table& tb, std::mt19937& rng) {
    const int64_t E = 8, H = 256, I = 256;
    const int top_k = 3;
    // (gate and up, down) formats; q4_K repacked where r16
    const std::tuple<Type, Type, bool> cases[] = {
        {Type::Q4_K, Type::Q6_K, false}, {Type::Q4_0, Type::Q8_0, false}, {Type::Q8_0, Type::Q5_K, false},
        {Type::F16, Type::F32, false},   {Type::BF16, Type::Q4_K, false}, {Type::Q4_K, Type::Q4_K, true},
        {Type::IQ3_XXS, Type::IQ4_XS, false}, {Type::Q3_K, Type::Q2_K, false}, {Type::IQ2_S, Type::Q5_1, false},
        {Type::IQ1_S, Type::IQ1_M, false},
    };
    for (const auto& [tu, td, r16] : cases) {
        const Format &fu = format(tu), &fd = format(td);
        const Experts gate = make_experts(rng, fu, E, I, H, r16), up = make_experts(rng, fu, E, I, H, r16);
        const Experts down = make_experts(rng, fd, E, H, I, r16);
        // M tokens; skewed: every token on expert 2, listed twice, plus one other
        for (const auto& [M, skewed] : {std::pair<int64_t, bool>{1, false}, {6, false}, {19, false}, {7, true}}) {
            const std::vector<float> X = normal(rng, (size_t)(M * H), 1.f);
            std::vector<int32_t> ids((size_t)(M * top_k));
            std::vector<float> wts(ids.size());
            std::uniform_real_distribution<float> uni(0.05f, 1.f);
            for (int64_t t = 0; t < M; t++) {
                std::vector<int32_t> perm(E);
                for (int e = 0; e < E; e++) perm[e] = e;
                std::shuffle(perm.begin(), perm.end(), rng);
                float sum = 0.f;
                for (int j = 0; j < top_k; j++) {
                    ids[t * top_k + j] = skewed ? (j < 2 ? 2 : perm[0] == 2 ? perm[1] : perm[0]) : perm[j];
                    sum += wts[t * top_k + j] = uni(rng);
                }
                for (int j = 0; j < top_k; j++) wts[t * top_k + j] /= sum;
            }
            std::vector<float> out((size_t)(M * H));
            moe(*tb.k, X.data(), M, ids.data(), wts.data(), top_k, gate.view, up.view, down.view, out.data());
            const std::string what = tb.name + " moe " + fu.name + "/" + fd.name + (r16 ? " repacked" : "") +
                                     " M=" + std::to_string(M) + (skewed ? " skewed" : "");
            const auto same = moe_per_expert(*tb.k, X, M, ids, wts, top_k, gate, up, down);
            check(what + " vs per-expert (same kernels)", out.data(), same.data(), out.size(), TOL_MOE_GROUPING);
            const auto ref = moe_per_expert(kernels_ref(), X, M, ids, wts, top_k, gate, up, down);
            check(what + " vs per-expert (scalar kernels)", out.data(), ref.data(), out.size(), TOL_MOE_VS_REF);
        }
    }
}

// ---- model operators: the SIMD table against the scalar one ----

constexpr double TOL_OPS = 1e-5;  // the float ops of a row in another order; exp within a few ulp
constexpr double TOL_GDN = 5e-5;  // a float32 recurrence over 70 tokens (chunked vs recurrent: other rounding)

std::vector<float> run_rows(void (*fn)(const float*, const float*, int64_t, float, float*), const std::vector<float>& x,
                            const std::vector<float>& w, int64_t d) {
    std::vector<float> y(x.size());
    for (size_t r = 0; r < x.size() / d; r++) fn(x.data() + r * d, w.data(), d, 1e-6f, y.data() + r * d);
    return y;
}

void test_model_ops(const std::string& name, const ModelKernels& mk, std::mt19937& rng) {
    const ModelKernels& ref = model_kernels_ref();
    for (int64_t d : {1, 7, 8, 16, 37, 256}) {
        const std::string sd = " d=" + std::to_string(d);
        std::vector<float> x = normal(rng, 3 * d, 2.f), z = normal(rng, 3 * d, 3.f), w = normal(rng, d, 1.f);
        z[0] = 100.f;  // silu / sigmoid saturate without overflow
        if (z.size() > 1) z[1] = -100.f;
        if (z.size() > 2) z[2] = -90.f;  // exp's lower clamp
        std::vector<float> got, want;
        got = run_rows(mk.rms_norm, x, w, d), want = run_rows(ref.rms_norm, x, w, d);
        check(name + " rms_norm" + sd, got.data(), want.data(), got.size(), TOL_OPS);
        std::vector<float> g1(x.size()), g2(x.size());
        for (int r = 0; r < 3; r++) {
            mk.gated_rms_norm(x.data() + r * d, z.data() + r * d, w.data(), d, 1e-6f, g1.data() + r * d);
            ref.gated_rms_norm(x.data() + r * d, z.data() + r * d, w.data(), d, 1e-6f, g2.data() + r * d);
        }
        check(name + " gated_rms_norm" + sd, g1.data(), g2.data(), g1.size(), TOL_OPS);
        mk.l2_norm(x.data(), d, 0.5f, g1.data());
        ref.l2_norm(x.data(), d, 0.5f, g2.data());
        check(name + " l2_norm" + sd, g1.data(), g2.data(), d, TOL_OPS);
        const int64_t n = 3 * d;
        mk.swiglu(z.data(), x.data(), n, g1.data());
        ref.swiglu(z.data(), x.data(), n, g2.data());
        check(name + " swiglu" + sd, g1.data(), g2.data(), n, TOL_OPS);
        mk.sigmoid_mul(x.data(), z.data(), n, g1.data());
        ref.sigmoid_mul(x.data(), z.data(), n, g2.data());
        check(name + " sigmoid_mul" + sd, g1.data(), g2.data(), n, TOL_OPS);
    }
    {  // causal depthwise conv over a channel range that is not a multiple of the vector
        const int64_t T = 5, C = 37, K = 4;
        std::vector<float> x = normal(rng, T * C, 1.f), w = normal(rng, C * K, 1.f), st = normal(rng, (K - 1) * C, 1.f);
        std::vector<float> y1(T * C, 0.f), y2(T * C, 0.f);
        mk.conv1d_silu(x.data(), w.data(), st.data(), T, C, K, 3, C, y1.data());
        ref.conv1d_silu(x.data(), w.data(), st.data(), T, C, K, 3, C, y2.data());
        check(name + " conv1d_silu", y1.data(), y2.data(), y1.size(), TOL_OPS);
    }
    {  // matmul with a tail in every dimension, beta = 0 and beta != 0
        const int64_t m = 6, n = 37, k = 19;
        std::vector<float> A = normal(rng, m * k, 1.f), B = normal(rng, k * n, 1.f), C0 = normal(rng, m * n, 1.f);
        for (float beta : {0.f, 0.5f}) {
            std::vector<float> c1 = C0, c2 = C0;
            mk.matmul(m, n, k, A.data(), k, B.data(), n, c1.data(), n, -1.5f, beta);
            ref.matmul(m, n, k, A.data(), k, B.data(), n, c2.data(), n, -1.5f, beta);
            check(name + " matmul beta=" + std::to_string(beta), c1.data(), c2.data(), c1.size(), TOL_OPS);
        }
    }
    // attention over f32, f16 and Q8_0 caches, causal and block-causal, with and without the gate;
    // 1 x 4 and 3 x 2 (tokens x query heads per kv head: the head-in-lanes kernel) and 5 x 4 (20 rows:
    // rows in lanes)
    for (int64_t T : {1, 3, 5})
    for (int64_t D : {32, 40, 256}) {
        const int64_t Hq = T == 3 ? 4 : 8, Hkv = 2, S = 77, n_kv = 75;
        std::vector<float> q = normal(rng, T * Hq * D, 1.f), gate = normal(rng, T * Hq * D, 2.f);
        std::vector<float> k = normal(rng, S * Hkv * D, 1.f), v = normal(rng, S * Hkv * D, 1.f);
        std::vector<uint16_t> k16(k.size()), v16(v.size());
        for (size_t i = 0; i < k.size(); i++) k16[i] = f32_to_fp16(k[i]), v16[i] = f32_to_fp16(v[i]);
        std::vector<uint8_t> k8, v8;
        if (D % KV_Q8_BLOCK == 0) {
            k8.resize(S * Hkv * kv_head_bytes(KvType::Q8_0, D));
            v8.resize(k8.size());
            quantize_rows(Type::Q8_0, k.data(), k8.data(), S * Hkv, D);
            quantize_rows(Type::Q8_0, v.data(), v8.data(), S * Hkv, D);
        }
        std::vector<int32_t> pos(T);
        for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(70 + t);
        for (KvType kv : {KvType::F32, KvType::F16, KvType::Q8_0}) {
            if (kv == KvType::Q8_0 && k8.empty()) continue;
            const void* K = kv == KvType::F32 ? (const void*)k.data() : kv == KvType::F16 ? (const void*)k16.data() : k8.data();
            const void* V = kv == KvType::F32 ? (const void*)v.data() : kv == KvType::F16 ? (const void*)v16.data() : v8.data();
            for (AttnMask mask : {AttnMask::Causal, AttnMask::BlockCausal})
                for (bool gated : {false, true}) {
                    std::vector<float> o1(q.size()), o2(q.size());
                    const float* G = gated ? gate.data() : nullptr;
                    attention(mk, q.data(), K, V, kv, pos.data(), G, T, Hq, Hkv, D, n_kv, mask, 8, 0.1f, o1.data());
                    attention(ref, q.data(), K, V, kv, pos.data(), G, T, Hq, Hkv, D, n_kv, mask, 8, 0.1f, o2.data());
                    check(name + " attention T=" + std::to_string(T) + " D=" + std::to_string(D) + " kv=" + std::to_string((int)kv) +
                              (mask == AttnMask::Causal ? " causal" : " block") + (gated ? " gated" : ""),
                          o1.data(), o2.data(), o1.size(), TOL_OPS);
                }
        }
    }
    {  // gated delta rule: this table's recurrent and chunked forms against the scalar recurrent one
        const int64_t T = 70, Hk = 2, Hv = 4, dk = 40, dv = 36;
        std::vector<float> q = normal(rng, T * Hk * dk, 1.f), k = normal(rng, T * Hk * dk, 1.f);
        std::vector<float> v = normal(rng, T * Hv * dv, 1.f), g(T * Hv), beta(T * Hv);
        std::uniform_real_distribution<float> u(0.f, 1.f);
        for (size_t i = 0; i < g.size(); i++) g[i] = -2.f * u(rng), beta[i] = u(rng);
        const std::vector<float> s0 = normal(rng, Hv * dk * dv, 0.3f);
        std::vector<float> s_ref = s0, o_ref(T * Hv * dv);
        gated_delta_rule(ref, GdnMode::Recurrent, q.data(), k.data(), v.data(), g.data(), beta.data(), s_ref.data(), T,
                         Hk, Hv, dk, dv, true, o_ref.data());
        for (GdnMode mode : {GdnMode::Recurrent, GdnMode::Chunked}) {
            std::vector<float> s = s0, o(T * Hv * dv);
            gated_delta_rule(mk, mode, q.data(), k.data(), v.data(), g.data(), beta.data(), s.data(), T, Hk, Hv, dk, dv,
                             true, o.data());
            const std::string m = mode == GdnMode::Recurrent ? " recurrent" : " chunked";
            check(name + " gated_delta_rule" + m + " out", o.data(), o_ref.data(), o.size(), TOL_GDN);
            check(name + " gated_delta_rule" + m + " state", s.data(), s_ref.data(), s.size(), TOL_GDN);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::string expect_dotprod;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a.rfind("--expect-dotprod=", 0) == 0) {
            expect_dotprod = a.substr(17);
        } else {
            std::fprintf(stderr, "usage: %s [--expect-dotprod=yes|no]\n", argv[0]);
            return 2;
        }
    }
    const CpuFeatures cpu = cpu_features();
    std::vector<Table> tables;
#if defined(CLOVER_HAVE_NEON)
    std::printf("cpu: neon %d, dotprod %d, i8mm %d\n", cpu.neon, cpu.dotprod, cpu.i8mm);
    if (!expect_dotprod.empty())
        expect(cpu.dotprod == (expect_dotprod == "yes"), "cpu reports dotprod " + expect_dotprod);
    // The dispatched table is the dot-product build exactly when the CPU has it, and is called "neon".
    expect(kernels_neon() == (cpu.dotprod ? kernels_neon_dotprod() : kernels_neon_plain()),
           "kernels_neon() picks the dotprod build iff the cpu has dotprod");
    expect(std::string(kernels_neon()->isa) == "neon" && available_isas().back() == "neon",
           "neon is listed and is the best isa");
    // q4_k_r16 has a kernel of its own in the dot-product build only (the plain one carries the reference)
    expect(!has_native_q4_K_r16(*kernels_neon_plain()) && has_native_q4_K_r16(*kernels_neon_dotprod()),
           "the dot-product build alone multiplies q4_k_r16 natively");
    for (Type t : {Type::IQ4_XS_R16, Type::IQ3_XXS_R16, Type::IQ3_S_R16, Type::IQ4_NL_R16, Type::MXFP4_R16})
        expect(!has_native_r16(*kernels_neon_plain(), t) && has_native_r16(*kernels_neon_dotprod(), t),
               "the dot-product build alone multiplies iq4_xs / iq3_xxs / iq3_s repacked natively");
    tables.push_back({"neon", kernels_neon_plain()});
    if (cpu.dotprod) tables.push_back({"neon+dotprod", kernels_neon_dotprod()});
#endif
#if defined(CLOVER_HAVE_AVX2)
    std::printf("cpu: avx2 %d, fma %d, f16c %d\n", cpu.avx2, cpu.fma, cpu.f16c);
    if (cpu.avx2 && cpu.fma && cpu.f16c) tables.push_back({"avx2", kernels_avx2()});
#endif
    expect(!tables.empty(), "this build and cpu have a SIMD table to test");

    for (const Table& tb : tables) {
        const int p0 = g_passed, f0 = g_failed;
        std::mt19937 rng(1234);
        test_gemm(tb, rng);
        test_gemm_r16(tb, rng);
        test_gemm_lowbit(tb, rng);
        test_gemm_codes_r16(tb, rng);
        test_moe(tb, rng);
        std::printf("%s: %d passed, %d failed\n", tb.name.c_str(), g_passed - p0, g_failed - f0);
    }
    // the model operators' SIMD table of this build (one per ISA) against the scalar table
    std::vector<const ModelKernels*> model_tables;
    if (model_kernels_neon()) {
        model_tables.push_back(model_kernels_neon());
        expect(&model_kernels_for("neon") == model_kernels_neon() && &active_model_kernels() == model_kernels_neon(),
               "the neon model-ops table is the one chosen");
    }
    if (model_kernels_avx2() && cpu.avx2 && cpu.fma && cpu.f16c) model_tables.push_back(model_kernels_avx2());
    expect(!model_tables.empty(), "this build has a SIMD model-ops table to test");
    for (const ModelKernels* mk : model_tables) {
        const int p0 = g_passed, f0 = g_failed;
        std::mt19937 rng(99);
        test_model_ops(std::string("model ops ") + mk->isa, *mk, rng);
        std::printf("model ops %s: %d passed, %d failed\n", mk->isa, g_passed - p0, g_failed - f0);
    }
    std::printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
