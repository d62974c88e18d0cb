#pragma once
// The xor butterfly of a warp over many outputs at once, by recursive halving: at offset `off` a
// lane keeps the half of its outputs its lane bit `off` selects and adds the partner's value of
// the same output (partner = lane ^ off). Over offsets 16, 8, 4, 2, 1 a lane ends with output
// `lane` of 32 (or 2 lane + e of 64 after four halvings and a last one of two): the same sums as
// the full butterfly on every output, since a + b == b + a, in 31 shuffles for 32 outputs instead
// of 160. Shared by the CUDA-core F16 GEMMs (gemm_f16.cuh, hyper_connection_chunk.cuh).
#include <cuda_runtime.h>

#include "ds4/core/rounding.hpp"

namespace ds4::kernels {

template <int HALF>
__device__ __forceinline__ void warp_halve(float* v, int lane, int off) {
    const bool upper = (lane & off) != 0;
#pragma unroll
    for (int j = 0; j < HALF; ++j) {
        const float keep = upper ? v[HALF + j] : v[j];
        const float send = upper ? v[j] : v[HALF + j];
        v[j] = add_rn(keep, __shfl_xor_sync(0xffffffffu, send, off));
    }
}

}  // namespace ds4::kernels
