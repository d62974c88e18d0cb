#pragma once
// The int8 warpgroup MMA the int8 wgmma kernels issue (moe_gemm_wgmma.cuh, gemm_q8_0_wgmma.cuh):
// m64n32k32 -> s32 with both operands K-major in shared memory (wgmma_operand.hpp's layout), and
// the register pin that keeps an accumulator's readers below the wait that completes it.
#include <cstdint>

namespace ds4::kernels::wgmma_detail {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// wgmma m64n32k32 -> s32, both operands K-major in shared memory: D = A . B (Accumulate 0: the
// sums from zero) or D += A . B (1); B is s8, A is s8 or, with UnsignedA, u8.
template <int Accumulate, bool UnsignedA = false>
__device__ __forceinline__ void mma_m64n32k32(int (&d)[16], std::uint64_t da, std::uint64_t db) {
    // The operand type is part of the instruction's text, which a template cannot compose: a
    // macro local to this function spells the two forms once.
#define DS4_WGMMA_M64N32K32(atype)                                                                                          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                              \
                 "wgmma.mma_async.sync.aligned.m64n32k32.s32." atype                                                        \
                 ".s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p;\n}\n"           \
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),          \
                   "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])    \
                 : "l"(da), "l"(db), "n"(Accumulate)                                                                       \
                 : "memory")
    if constexpr (UnsignedA)
        DS4_WGMMA_M64N32K32("u8");
    else
        DS4_WGMMA_M64N32K32("s8");
#undef DS4_WGMMA_M64N32K32
}
#endif

// After a wait: the accumulators are read only past this point (an empty asm that "writes" them,
// so the compiler cannot hoist their readers above the wgmma wait).
__device__ __forceinline__ void pin(int (&d)[16]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

}  // namespace ds4::kernels::wgmma_detail
