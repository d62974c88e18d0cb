#pragma once
// Q4_K (docs/model.md §5.4; the MTP experts and the q4 model): 256 weights in 8 groups of 32, 4-bit
// quants, 6-bit scales and mins packed into 12 bytes under F16 super-scales d and dmin.
// Weight = d*sc*q - dmin*m.
//
// Contract: exact. dequantize and dot_q4_k_q8_k give the same bits on host and device. The dot
// keeps GGML's scalar order (ggml_vec_dot_q4_K_q8_K generic): eight float lanes sums[l]
// accumulate d*aux32[l] across blocks, where lane l holds the integer sum of every element
// with index = l mod 8; the min term is subtracted from sumf per block; the lanes are added to
// sumf in order 0..7 at the end.
#include <cstdint>

#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/q8_k.hpp"

namespace ds4 {

struct q4_k_block {
    std::uint16_t d;     // F16
    std::uint16_t dmin;  // F16
    std::uint8_t scales[12];
    std::uint8_t qs[128];
};
static_assert(sizeof(q4_k_block) == 144 && alignof(q4_k_block) == 2, "GGML block_q4_K layout");

// 6-bit scale and min of group j (GGML get_scale_min_k4): groups 0..3 keep both in the low six
// bits of bytes j and j+4; groups 4..7 keep their low nibbles in byte j+4 and their top two
// bits in the spare high bits of bytes j-4 (scale) and j (min).
DS4_HD_INLINE void q4_k_scale_min(const q4_k_block& b, int j, int& sc, int& m) {
    if (j < 4) {
        sc = b.scales[j] & 63;
        m = b.scales[j + 4] & 63;
    } else {
        sc = (b.scales[j + 4] & 15) | ((b.scales[j - 4] >> 6) << 4);
        m = (b.scales[j + 4] >> 4) | ((b.scales[j] >> 6) << 4);
    }
}

// Group j reads qs[(j/2)*32 + l]: low nibble for even j, high nibble for odd j.
DS4_HD_INLINE int q4_k_quant(const q4_k_block& b, int e) {
    const int j = e >> 5;
    return (b.qs[(j >> 1) * 32 + (e & 31)] >> (4 * (j & 1))) & 15;
}

DS4_HD_INLINE void dequantize(const q4_k_block& b, float* out256) {
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int j = 0; j < 8; ++j) {
        int sc, m;
        q4_k_scale_min(b, j, sc, m);
        const float scale = mul_rn(d, static_cast<float>(sc));
        const float min = mul_rn(dmin, static_cast<float>(m));
        for (int l = 0; l < 32; ++l) {
            const int e = 32 * j + l;
            out256[e] = sub_rn(mul_rn(scale, static_cast<float>(q4_k_quant(b, e))), min);
        }
    }
}

DS4_HD_INLINE float dot_q4_k_q8_k(const q4_k_block* w, const q8_k_block* x, int nblocks) {
    float sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float sumf = 0.0f;
    for (int b = 0; b < nblocks; ++b) {
        int aux32[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int sumi = 0;
        for (int j = 0; j < 8; ++j) {
            int sc, m;
            q4_k_scale_min(w[b], j, sc, m);
            // bsums are per 16 elements, two per 32-element group.
            sumi += (int(x[b].bsums[2 * j]) + int(x[b].bsums[2 * j + 1])) * m;
            for (int l = 0; l < 32; ++l) {
                const int e = 32 * j + l;
                aux32[l & 7] += sc * (int(x[b].qs[e]) * q4_k_quant(w[b], e));
            }
        }
        const float d = mul_rn(f16_to_f32(w[b].d), x[b].d);
        for (int l = 0; l < 8; ++l) sums[l] = add_rn(sums[l], mul_rn(d, static_cast<float>(aux32[l])));
        const float dmin = mul_rn(f16_to_f32(w[b].dmin), x[b].d);
        sumf = sub_rn(sumf, mul_rn(dmin, static_cast<float>(sumi)));
    }
    for (int l = 0; l < 8; ++l) sumf = add_rn(sumf, sums[l]);
    return sumf;
}

}  // namespace ds4
