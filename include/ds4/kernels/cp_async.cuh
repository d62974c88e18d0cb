#pragma once
// cp.async (sm_80+) global -> shared copies that do not wait, with zero fill, and the group
// commit / wait around them: the staging rings of the GEMM kernels (gemm_q8_0, gemm_f16,
// moe_gemm). A header of its own so that a kernel using them does not include another family.
#include <cuda_runtime.h>

namespace ds4::kernels::cp_async {

__device__ __forceinline__ unsigned smem_u32(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }

// N bytes (4, 8 or 16); valid = false writes zeros and reads nothing (src_bytes 0).
template <int N>
__device__ __forceinline__ void zfill(void* dst, const void* src, bool valid) {
    const int src_bytes = valid ? N : 0;
    if constexpr (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_u32(dst)), "l"(src), "n"(N),
                     "r"(src_bytes));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace ds4::kernels::cp_async
