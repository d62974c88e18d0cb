#pragma once
// Q8_0 (docs/model.md §5.4): 32 int8 weights with one F16 scale, and ds4's Q8_0 activation block,
// which keeps its scale in F32 and rounds half to even (§7.5: not GGML's F16 scale + roundf).
//
// Contract: exact. dequantize, quantize_q8_0_act and dot_q8_0 give the same bits on host and
// device; the dot is the scalar order of §7.3: acc += (f16(w.d) * x.d) * (float)isum, blocks
// in order from acc = 0.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4 {

inline constexpr int q8_0_block_size = 32;

struct q8_0_block {
    std::uint16_t d;  // F16 scale
    std::int8_t qs[32];
};
static_assert(sizeof(q8_0_block) == 34 && alignof(q8_0_block) == 2, "GGML block_q8_0 layout");

struct q8_0_act_block {
    float d;  // F32 scale, never F16-rounded
    std::int8_t qs[32];
};
static_assert(sizeof(q8_0_act_block) == 36 && alignof(q8_0_act_block) == 4);

DS4_HD_INLINE void dequantize(const q8_0_block& b, float* out32) {
    const float d = f16_to_f32(b.d);
    for (int i = 0; i < 32; ++i) out32[i] = mul_rn(d, static_cast<float>(b.qs[i]));
}

DS4_HD_INLINE void dequantize(const q8_0_act_block& b, float* out32) {
    for (int i = 0; i < 32; ++i) out32[i] = mul_rn(b.d, static_cast<float>(b.qs[i]));
}

// n must be a multiple of 32 (n/32 blocks are written).
DS4_HD_INLINE void quantize_q8_0_act(const float* x, q8_0_act_block* out, int n) {
    for (int b = 0; b < n / 32; ++b) {
        const float* xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = max_num(amax, abs_exact(xb[i]));
        const float d = div_rn(amax, 127.0f);
        const float id = d != 0.0f ? div_rn(1.0f, d) : 0.0f;
        out[b].d = d;
        for (int i = 0; i < 32; ++i) {
            const int q = round_half_even(mul_rn(xb[i], id));
            out[b].qs[i] = static_cast<std::int8_t>(q < -128 ? -128 : (q > 127 ? 127 : q));
        }
    }
}

// Exact integer part of one block's dot: |isum| <= 32*128*128, far inside int32.
DS4_HD_INLINE std::int32_t q8_0_block_isum(const q8_0_block& w, const q8_0_act_block& x) {
    std::int32_t isum = 0;
    for (int i = 0; i < 32; ++i) isum += std::int32_t(w.qs[i]) * std::int32_t(x.qs[i]);
    return isum;
}

DS4_HD_INLINE float dot_q8_0(const q8_0_block* w, const q8_0_act_block* x, int nblocks) {
    float acc = 0.0f;
    for (int b = 0; b < nblocks; ++b) {
        const float scale = mul_rn(f16_to_f32(w[b].d), x[b].d);
        acc = add_rn(acc, mul_rn(scale, static_cast<float>(q8_0_block_isum(w[b], x[b]))));
    }
    return acc;
}

// Weight quantiser (host only, for synthetic models and tests) as docs/model.md §5.4 states it: d =
// amax/127 stored as F16, qs = roundf(x/d) with the unrounded F32 d. GGML's reference
// multiplies by 1/d instead, which can move a value sitting on a .5 boundary by one code.
inline void quantize_q8_0(const float* x, q8_0_block* out, std::size_t n) {
    require(n % 32 == 0, "quantize_q8_0: n = " + std::to_string(n) + " is not a multiple of 32");
    for (std::size_t b = 0; b < n / 32; ++b) {
        const float* xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = max_num(amax, abs_exact(xb[i]));
        const float d = amax / 127.0f;
        out[b].d = f32_to_f16(d);
        for (int i = 0; i < 32; ++i) {
            const float q = d != 0.0f ? std::round(xb[i] / d) : 0.0f;
            out[b].qs[i] = static_cast<std::int8_t>(q < -128.0f ? -128 : (q > 127.0f ? 127 : int(q)));
        }
    }
}

}  // namespace ds4
