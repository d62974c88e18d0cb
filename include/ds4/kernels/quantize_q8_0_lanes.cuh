#pragma once
// Q8_0 activation blocks quantized by pairs of lanes (each holds 16 of a block's 32 values), as
// format/q8_0.hpp's quantize_q8_0_act: matvec.cuh quantizes its input in-kernel with them and
// quantize_act.cuh whole rows for the GEMMs. A header of its own so that quantize_act.cuh (and the
// GEMMs that include it) do not include the matvec kernels.
#include <cuda_runtime.h>

#include <cstdint>

#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4::kernels::detail {

// 16 consecutive floats (16-byte aligned), or zeros for a row or block past the live range.
__device__ __forceinline__ void load_16(const float* p, bool live, float (&v)[16]) {
    const float4* src = reinterpret_cast<const float4*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float4 f = live ? __ldg(src + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[4 * i] = f.x;
        v[4 * i + 1] = f.y;
        v[4 * i + 2] = f.z;
        v[4 * i + 3] = f.w;
    }
}

// Half of a 32-value Q8_0 activation block, held by one of two adjacent lanes: the pair's max
// is exact in any order, so the result equals quantize_q8_0_act. The even lane writes the scale.
__device__ __forceinline__ void quantize_half_block(const float (&v)[16], std::int8_t* q_out, float* d_out) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = max_num(amax, abs_exact(v[i]));
    amax = max_num(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    const float d = div_rn(amax, 127.0f);
    const float id = d != 0.0f ? div_rn(1.0f, d) : 0.0f;
    int packed[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        unsigned word = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int q = round_half_even(mul_rn(v[4 * i + j], id));
            q = q < -128 ? -128 : (q > 127 ? 127 : q);
            word |= (unsigned(q) & 0xffu) << (8 * j);
        }
        packed[i] = int(word);
    }
    if (q_out) *reinterpret_cast<int4*>(q_out) = make_int4(packed[0], packed[1], packed[2], packed[3]);
    if (d_out) *d_out = d;
}

}  // namespace ds4::kernels::detail
