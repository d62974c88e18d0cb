#pragma once
// Half i (0..7) of 8 halves held in a 16-byte word (a row's 8 block scales, loaded once): selects
// instead of an indexed array so the word stays in registers when i is not a compile-time
// constant. Shared by the Q8_0 matvec and the wgmma Q8_0 GEMM.
#include <cuda_runtime.h>

#include <cstdint>

namespace ds4::kernels {

__device__ __forceinline__ std::uint16_t half_at(const int4& v, int i) {
    const int w = (i >> 1) == 0 ? v.x : ((i >> 1) == 1 ? v.y : ((i >> 1) == 2 ? v.z : v.w));
    return std::uint16_t((unsigned(w) >> (16 * (i & 1))) & 0xffffu);
}

}  // namespace ds4::kernels
