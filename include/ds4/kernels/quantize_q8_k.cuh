#pragma once
// Q8_K quantization of activations by one warp per 256-value block, as format/q8_k.hpp's
// quantize_q8_k: the decode MoE (moe.cuh) and the grouped prefill MoE (moe_gemm.cuh) quantize
// xn and the SwiGLU output with it. A header of its own so that moe_gemm.cuh does not include the
// decode MoE's kernels.
#include <cuda_runtime.h>

#include <cstdint>

#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4::kernels::detail {

// Q8_K of 256 values by one warp (lane l holds v[0..8) = x[8l .. 8l+8)), as quantize_q8_k:
// the first value of largest magnitude sets iscale = -127/max; NaN never wins the max.
__device__ __forceinline__ void warp_quantize_q8_k(const float (&v)[8], int lane, std::int8_t* qs, float* d,
                                                   std::int16_t* bsums) {
    float amax = 0.0f, mx = 0.0f;
    int idx = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float a = abs_exact(v[i]);
        if (a > amax) {
            amax = a;
            mx = v[i];
            idx = 8 * lane + i;
        }
    }
    // (amax desc, index asc) is a total order on the candidates: the butterfly gives every
    // lane the sequential scan's winner.
    for (int off = 16; off > 0; off /= 2) {
        const float oa = __shfl_xor_sync(0xffffffffu, amax, off);
        const float om = __shfl_xor_sync(0xffffffffu, mx, off);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
        if (oa > amax || (oa == amax && oi < idx)) {
            amax = oa;
            mx = om;
            idx = oi;
        }
    }
    int q[8];
    if (amax == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = 0;
    } else {
        const float iscale = div_rn(-127.0f, mx);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int t = round_half_even(mul_rn(iscale, v[i]));
            q[i] = t < -128 ? -128 : (t > 127 ? 127 : t);
        }
        if (lane == 0) *d = div_rn(1.0f, iscale);
    }
    if (amax == 0.0f && lane == 0) *d = 0.0f;
    std::uint32_t lo = 0, hi = 0;
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        lo |= std::uint32_t(std::uint8_t(q[i])) << (8 * i);
        hi |= std::uint32_t(std::uint8_t(q[4 + i])) << (8 * i);
        sum += q[i] + q[4 + i];
    }
    *reinterpret_cast<uint2*>(qs + 8 * lane) = make_uint2(lo, hi);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if (bsums && (lane & 1) == 0) bsums[lane / 2] = std::int16_t(sum);
}

}  // namespace ds4::kernels::detail
