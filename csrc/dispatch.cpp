// Picks the kernel table once, from what the CPU and OS report (the best but "amx", which is offered);
// CLOVER_ISA=ref|avx2|avxvnni|avx512|amx|neon forces one.
#include "dispatch.h"

#include "quants.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

namespace clover {

#if !defined(CLOVER_HAVE_AVX2)
const Kernels* kernels_avx2() { return nullptr; }
#endif
#if !defined(CLOVER_HAVE_AVX2)
const QuantSearch* quant_search_avx2() { return nullptr; }
const ActQuant* act_quant_avx2() { return nullptr; }
#endif
#if !defined(CLOVER_HAVE_NEON)
const Kernels* kernels_neon() { return nullptr; }
#endif
#if !defined(CLOVER_HAVE_AVX512)
const Kernels* kernels_avx512() { return nullptr; }
#endif
#if !defined(CLOVER_HAVE_AVXVNNI)
const Kernels* kernels_avxvnni() { return nullptr; }
#endif
#if !defined(CLOVER_HAVE_AMX)
const Kernels* kernels_amx() { return nullptr; }
bool cpu_has_amx() { return false; }
bool amx_tiles_granted() { return false; }
#endif
#if !defined(CLOVER_HAVE_AVX512_VBMI)
void add_avx512_vbmi(Kernels&) {}
#endif

bool cpu_has_avx512vbmi_bitalg() {
#if defined(CLOVER_HAVE_AVX512_VBMI)
    const CpuFeatures f = cpu_features();
    return f.avx512vbmi && f.avx512bitalg;
#else
    return false;
#endif
}

namespace {
CpuFeatures detect_features() {
    CpuFeatures f;
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    // libgcc checks OSXSAVE/XCR0 before it reports AVX features as present.
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.f16c = false;
    unsigned a, b, c, d;
    __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    f.f16c = (c >> 29) & 1;
    // (libgcc also checks that the OS saves the AVX-512 registers, XCR0 bits 5-7)
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
    f.avx512vnni = __builtin_cpu_supports("avx512vnni");
    f.avx512vbmi = __builtin_cpu_supports("avx512vbmi");
    f.avx512bitalg = __builtin_cpu_supports("avx512bitalg");
    // AVX-VNNI: CPUID leaf 7, subleaf 1, EAX bit 4 (read directly: GCC names it in
    // __builtin_cpu_supports only from version 11); the OS's 256-bit state is what avx2 already checked.
    unsigned max_leaf;
    __asm__ __volatile__("cpuid" : "=a"(max_leaf), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    if (max_leaf >= 7) {
        __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
        f.avxvnni = f.avx2 && ((a >> 4) & 1);
    }
#elif defined(__aarch64__)
    f.neon = true;  // Advanced SIMD is mandatory in AArch64
#if defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    f.dotprod = (hw >> 20) & 1;  // HWCAP_ASIMDDP
    const unsigned long hw2 = getauxval(AT_HWCAP2);
    f.i8mm = (hw2 >> 13) & 1;  // HWCAP2_I8MM
#elif defined(__APPLE__)
    int v = 0;
    size_t len = sizeof(v);
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, nullptr, 0) == 0) f.dotprod = v != 0;
    v = 0;
    if (sysctlbyname("hw.optional.arm.FEAT_I8MM", &v, &len, nullptr, 0) == 0) f.i8mm = v != 0;
#endif
#endif
    return f;
}
}  // namespace

// Read once: each kernels_for (every Python kernel call that names an ISA) asks, and CPUID in a virtual
// machine traps to the hypervisor (5% of a 128-token AMX product's time through Python, perf).
CpuFeatures cpu_features() {
    static const CpuFeatures f = detect_features();
    return f;
}

std::vector<std::string> available_isas() {
    std::vector<std::string> out = {"ref"};
    const CpuFeatures f = cpu_features();
    // (features first: building an ISA's table runs code compiled for it)
    if (f.avx2 && f.fma && f.f16c && kernels_avx2()) out.push_back("avx2");
    if (f.avx2 && f.fma && f.f16c && f.avxvnni && kernels_avxvnni()) out.push_back("avxvnni");
    if (f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && kernels_avx512())
        out.push_back("avx512");
    if (out.back() == "avx512" && kernels_amx() && cpu_has_amx()) out.push_back("amx");
    if (f.neon && kernels_neon()) out.push_back("neon");
    return out;
}

const Kernels& kernels_for(const std::string& isa) {
    bool ok = false;
    for (const auto& name : available_isas()) ok = ok || name == isa;
    if (!ok) {
        std::string have;
        for (const auto& name : available_isas()) have += (have.empty() ? "" : ", ") + name;
        throw std::invalid_argument("ISA '" + isa + "' is not available on this CPU or build (available: " + have +
                                    ")");
    }
    if (isa == "avx2") return *kernels_avx2();
    if (isa == "avx512") return *kernels_avx512();
    if (isa == "amx") {
        if (!amx_tiles_granted())
            throw std::invalid_argument("ISA 'amx': the OS did not grant this process the AMX tile registers");
        return *kernels_amx();
    }
    if (isa == "avxvnni") return *kernels_avxvnni();
    if (isa == "neon") return *kernels_neon();
    return kernels_ref();
}

namespace {
const Kernels* g_active = nullptr;

// The best table, listed last, but "amx": its prompt products round weights and activations to bf16 where
// the int8 products round the activations to 8 bits, so a prompt's results would depend on how its tokens
// are batched (a prompt read whole on the tiles, or after a cached prefix through the int8 products, or
// beside other requests' tokens: replies that the prompt cache and continuous batching promise to keep).
// It is offered: CLOVER_ISA=amx.
std::string default_isa() {
    const std::vector<std::string> isas = available_isas();
    return isas.back() == "amx" ? isas[isas.size() - 2] : isas.back();
}
}  // namespace

const Kernels& active_kernels() {
    if (!g_active) {
        const char* env = std::getenv("CLOVER_ISA");
        if (env && *env) {
            g_active = &kernels_for(env);
        } else {
            g_active = &kernels_for(default_isa());
        }
    }
    return *g_active;
}

void set_active_isa(const std::string& isa) {
    g_active = &kernels_for(isa);
    set_fast_quant_search(true);
}

}  // namespace clover
