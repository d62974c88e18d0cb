#pragma once
// Q8_K (docs/model.md §5.4): the activation block of the K-quant and IQ2 dots, 256 int8 values with
// an F32 scale and the sums of each 16 consecutive quants (what the Q2_K/Q4_K min terms need).
//
// Contract: exact; quantize_q8_k gives the same bits on host and device. It follows ds4's
// ds4_quantize_row_q8_K: the scale comes from the *signed* value of largest magnitude (first
// occurrence), iscale = -127/max, so that value maps to -127 exactly and d = 1/iscale < 0 when
// max > 0.
#include <cstdint>

#include "ds4/core/host_device.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4 {

inline constexpr int q8_k_block_size = 256;

struct q8_k_block {
    float d;
    std::int8_t qs[256];
    std::int16_t bsums[16];  // bsums[g] = sum of qs[16g .. 16g+15]
};
static_assert(sizeof(q8_k_block) == 292 && alignof(q8_k_block) == 4, "GGML block_q8_K layout");

// n must be a multiple of 256 (n/256 blocks are written). NaN inputs do not take part in the
// max and quantise to 0, identically on both sides.
DS4_HD_INLINE void quantize_q8_k(const float* x, q8_k_block* out, int n) {
    for (int b = 0; b < n / 256; ++b) {
        const float* xb = x + 256 * b;
        q8_k_block& o = out[b];
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 256; ++i) {
            const float ax = abs_exact(xb[i]);
            if (ax > amax) {  // strict: the first occurrence of the largest |x| wins
                amax = ax;
                max = xb[i];
            }
        }
        if (amax == 0.0f) {
            o.d = 0.0f;
            for (int i = 0; i < 256; ++i) o.qs[i] = 0;
            for (int g = 0; g < 16; ++g) o.bsums[g] = 0;
            continue;
        }
        const float iscale = div_rn(-127.0f, max);
        for (int i = 0; i < 256; ++i) {
            const int q = round_half_even(mul_rn(iscale, xb[i]));
            o.qs[i] = static_cast<std::int8_t>(q < -128 ? -128 : (q > 127 ? 127 : q));
        }
        for (int g = 0; g < 16; ++g) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += o.qs[16 * g + i];
            o.bsums[g] = static_cast<std::int16_t>(s);
        }
        o.d = div_rn(1.0f, iscale);
    }
}

DS4_HD_INLINE void dequantize(const q8_k_block& b, float* out256) {
    for (int i = 0; i < 256; ++i) out256[i] = mul_rn(b.d, static_cast<float>(b.qs[i]));
}

}  // namespace ds4
