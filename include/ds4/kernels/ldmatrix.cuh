#pragma once
// ldmatrix.x4 (and its transposed form): four 8 x 8 b16 matrices from shared memory, lane l giving
// the address of row l % 8 of matrix l / 8 and getting back, in register q, row l / 4 of matrix q,
// elements 2 (l % 4) and 2 (l % 4) + 1. Shared by the tensor-core kernels (the attention tile loop,
// the Q8_0 GEMM) without pulling either's kernels into the other's users.
#include <cuda_runtime.h>

#include <cstdint>

namespace ds4::kernels {

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
    const auto a = static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
    const auto a = static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

}  // namespace ds4::kernels
