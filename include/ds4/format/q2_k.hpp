#pragma once
// Q2_K (docs/model.md §5.4): 256 weights in 16 groups of 16, 2-bit quants, a 4-bit scale and a
// 4-bit min per group under F16 super-scales d and dmin. Weight = d*sc*q - dmin*m.
//
// Contract: exact. dequantize and dot_q2_k_q8_k give the same bits on host and device; the
// dot is ds4's scalar branch (= GGML ggml_vec_dot_q2_K_q8_K generic, docs/model.md §7.3): exact
// integer sums per block, then sumf += dall*isum - dmin*summs with dall = x.d*d, dmin =
// x.d*dmin, each product rounded separately.
#include <cstdint>

#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/q8_k.hpp"

namespace ds4 {

struct q2_k_block {
    std::uint8_t scales[16];  // low nibble: scale, high nibble: min, of group g
    std::uint8_t qs[64];
    std::uint16_t d;     // F16
    std::uint16_t dmin;  // F16
};
static_assert(sizeof(q2_k_block) == 84 && alignof(q2_k_block) == 2, "GGML block_q2_K layout");

// Element e = 128k + 32j + 16h + i sits in group g = 8k + 2j + h, bits 2j..2j+1 of
// qs[32k + 16h + i]: each qs byte carries four elements 32 apart, so one 32-byte load feeds
// 128 consecutive weights.
DS4_HD_INLINE int q2_k_quant(const q2_k_block& b, int e) {
    const int k = e >> 7, j = (e >> 5) & 3, r = e & 31;
    return (b.qs[32 * k + r] >> (2 * j)) & 3;
}

DS4_HD_INLINE void dequantize(const q2_k_block& b, float* out256) {
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int e = 0; e < 256; ++e) {
        const int g = e >> 4;
        const float scale = mul_rn(d, static_cast<float>(b.scales[g] & 15));
        const float min = mul_rn(dmin, static_cast<float>(b.scales[g] >> 4));
        out256[e] = sub_rn(mul_rn(scale, static_cast<float>(q2_k_quant(b, e))), min);
    }
}

DS4_HD_INLINE float dot_q2_k_q8_k(const q2_k_block* w, const q8_k_block* x, int nblocks) {
    float sumf = 0.0f;
    for (int b = 0; b < nblocks; ++b) {
        // The min term through the activation's 16-sums; integer and exact in any order.
        int summs = 0;
        for (int g = 0; g < 16; ++g) summs += int(x[b].bsums[g]) * int(w[b].scales[g] >> 4);
        int isum = 0;
        for (int g = 0; g < 16; ++g) {
            int isuml = 0;
            for (int i = 0; i < 16; ++i) {
                const int e = 16 * g + i;
                isuml += int(x[b].qs[e]) * q2_k_quant(w[b], e);
            }
            isum += int(w[b].scales[g] & 15) * isuml;
        }
        const float dall = mul_rn(x[b].d, f16_to_f32(w[b].d));
        const float dmin = mul_rn(x[b].d, f16_to_f32(w[b].dmin));
        sumf = add_rn(sumf, sub_rn(mul_rn(dall, static_cast<float>(isum)),
                                   mul_rn(dmin, static_cast<float>(summs))));
    }
    return sumf;
}

}  // namespace ds4
