#pragma once

#include <string>
#include <vector>

#include "kernels.h"

namespace clover {

struct CpuFeatures {
    bool avx2 = false, fma = false, f16c = false, avx512f = false;
    bool avx512bw = false, avx512vl = false, avx512vnni = false, avx512vbmi = false, avx512bitalg = false, avxvnni = false;
    bool neon = false, dotprod = false, i8mm = false;
};

CpuFeatures cpu_features();
std::vector<std::string> available_isas();        // "ref" first, the best last
const Kernels& kernels_for(const std::string& isa);  // throws std::invalid_argument if unavailable
const Kernels& active_kernels();                  // chosen on first use (CLOVER_ISA overrides)
void set_active_isa(const std::string& isa);

}  // namespace clover
