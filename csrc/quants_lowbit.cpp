// Dequantizers of the low-bit and legacy formats (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, IQ4_XS,
// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), float for float as gguf.quants.dequantize computes them (the same
// products in the same order; the file, as the whole extension, is built with -ffp-contract=off), and the
// quantizers of the legacy ones, byte for byte as gguf.quants.quantize (ggml's reference quantizers).
#include <cmath>

#include "lowbit.h"
#include "quants.h"

namespace clover {

namespace {

template <typename Block>
void dequant32(const uint8_t* x, float* y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++) {
        const Block& b = ((const Block*)x)[i];
        int q[32];
        unpack32(b, q);
        float d;
        if constexpr (std::is_same_v<Block, block_mxfp4>)
            d = e8m0_to_fp32_half(b.e);
        else
            d = fp16_to_f32(b.d);
        for (int j = 0; j < 32; j++) {
            if constexpr (std::is_same_v<Block, block_q4_1> || std::is_same_v<Block, block_q5_1>)
                y[QK * i + j] = d * (float)q[j] + fp16_to_f32(b.m);
            else
                y[QK * i + j] = d * (float)q[j];
        }
    }
}

// The float factor of group g of a super-block (gguf.quants' expression for it).
template <typename Block>
float group_factor(const Block& b, const SuperInts& s, int g) {
    const float d = fp16_to_f32(block_d(b));
    if constexpr (std::is_same_v<Block, block_iq2_xxs> || std::is_same_v<Block, block_iq2_xs> ||
                  std::is_same_v<Block, block_iq2_s>)
        return d * (0.5f + (float)((s.scale[g] - 1) / 2)) * 0.25f;
    else if constexpr (std::is_same_v<Block, block_iq1_s> || std::is_same_v<Block, block_iq1_m>)
        return d * (float)s.scale[g] * 0.125f;  // exact: gguf's d (2 s + 1) times q / 8 = grid + delta, one rounding
    else if constexpr (std::is_same_v<Block, block_iq3_xxs>)
        return d * (0.5f + (float)((s.scale[g] - 1) / 2)) * 0.5f;
    else
        return d * (float)s.scale[g];  // q3_K, iq4_xs, iq3_s (1 + 2 s), q2_K (sc & 15)
}

template <typename Block, void (*Unpack)(const Block&, SuperInts&)>
void dequant256(const uint8_t* x, float* y, int64_t k) {
    SuperInts s;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const Block& b = ((const Block*)x)[i];
        Unpack(b, s);
        for (int g = 0; g < 16; g++) {
            const float dl = group_factor(b, s, g);
            float ml = 0.f;
            if constexpr (std::is_same_v<Block, block_q2_K>) ml = fp16_to_f32(b.dmin) * (float)s.min[g];
            for (int l = 0; l < 16; l++) {
                const int j = 16 * g + l;
                if constexpr (std::is_same_v<Block, block_q2_K>)
                    y[QK_K * i + j] = dl * (float)s.q[j] - ml;
                else
                    y[QK_K * i + j] = dl * (float)s.q[j];
            }
        }
    }
}

// ggml's quantize_row_q4_1_ref / q5_1 / q5_0 (gguf.quants): min and max, d = (max - min) / (2^bits - 1),
// q = trunc((x - min) / d + 0.5) clipped; q5_0: d = max / -16 of the value of largest magnitude.
void quantize_q4_1(const float* x, block_q4_1* y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++, x += QK) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < QK; j++) {
            mn = std::min(mn, x[j]);
            mx = std::max(mx, x[j]);
        }
        const float d = (mx - mn) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        y[i].m = f32_to_fp16(mn);
        for (int j = 0; j < QK / 2; j++) {
            const int a = std::min(15, (int)std::trunc((x[j] - mn) * id + 0.5f));
            const int b = std::min(15, (int)std::trunc((x[j + QK / 2] - mn) * id + 0.5f));
            y[i].qs[j] = (uint8_t)(a | (b << 4));
        }
    }
}

void set_fifth_bits(const int q[32], uint8_t qh[4], uint8_t qs[16]) {
    uint32_t h = 0;
    for (int j = 0; j < 32; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    std::memcpy(qh, &h, 4);
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
}

void quantize_q5_1(const float* x, block_q5_1* y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++, x += QK) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < QK; j++) {
            mn = std::min(mn, x[j]);
            mx = std::max(mx, x[j]);
        }
        const float d = (mx - mn) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        y[i].m = f32_to_fp16(mn);
        int q[32];
        for (int j = 0; j < QK; j++) q[j] = std::min(31, std::max(0, (int)std::trunc((x[j] - mn) * id + 0.5f)));
        set_fifth_bits(q, y[i].qh, y[i].qs);
    }
}

void quantize_q5_0(const float* x, block_q5_0* y, int64_t k) {
    for (int64_t i = 0; i < k / QK; i++, x += QK) {
        float amax = 0.f, mx = 0.f;
        for (int j = 0; j < QK; j++)
            if (std::fabs(x[j]) > amax) {
                amax = std::fabs(x[j]);
                mx = x[j];
            }
        const float d = mx / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        int q[32];
        for (int j = 0; j < QK; j++) q[j] = std::min(31, std::max(0, (int)std::trunc(x[j] * id + 16.5f)));
        set_fifth_bits(q, y[i].qh, y[i].qs);
    }
}

}  // namespace

bool dequantize_row_lowbit(Type t, const uint8_t* x, float* y, int64_t k) {
    switch (t) {
        case Type::Q4_1: dequant32<block_q4_1>(x, y, k); return true;
        case Type::Q5_0: dequant32<block_q5_0>(x, y, k); return true;
        case Type::Q5_1: dequant32<block_q5_1>(x, y, k); return true;
        case Type::IQ4_NL: dequant32<block_iq4_nl>(x, y, k); return true;
        case Type::MXFP4: dequant32<block_mxfp4>(x, y, k); return true;
        case Type::Q2_K: dequant256<block_q2_K, unpack_q2_K>(x, y, k); return true;
        case Type::Q3_K: dequant256<block_q3_K, unpack_q3_K>(x, y, k); return true;
        case Type::IQ4_XS: dequant256<block_iq4_xs, unpack_iq4_xs>(x, y, k); return true;
        case Type::IQ2_XXS: dequant256<block_iq2_xxs, unpack_iq2_xxs>(x, y, k); return true;
        case Type::IQ2_XS: dequant256<block_iq2_xs, unpack_iq2_xs>(x, y, k); return true;
        case Type::IQ2_S: dequant256<block_iq2_s, unpack_iq2_s>(x, y, k); return true;
        case Type::IQ3_XXS: dequant256<block_iq3_xxs, unpack_iq3_xxs>(x, y, k); return true;
        case Type::IQ3_S: dequant256<block_iq3_s, unpack_iq3_s>(x, y, k); return true;
        case Type::IQ1_S: dequant256<block_iq1_s, unpack_iq1_s>(x, y, k); return true;
        case Type::IQ1_M: dequant256<block_iq1_m, unpack_iq1_m>(x, y, k); return true;
        default: return false;
    }
}

bool quantize_row_lowbit(Type t, const float* x, uint8_t* y, int64_t k) {
    switch (t) {
        case Type::Q4_1: quantize_q4_1(x, (block_q4_1*)y, k); return true;
        case Type::Q5_0: quantize_q5_0(x, (block_q5_0*)y, k); return true;
        case Type::Q5_1: quantize_q5_1(x, (block_q5_1*)y, k); return true;
        default: return quantize_rows_lowbit(t, x, y, 1, k, nullptr);  // Q2_K, Q3_K, IQ4_NL, IQ4_XS
    }
}

}  // namespace clover
