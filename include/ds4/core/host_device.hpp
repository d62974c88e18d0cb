#pragma once
// DS4_HD marks code that both the CPU reference and the CUDA kernels compile: the one
// numerics definition per operation (docs/README.md decision 1). A macro is the only way to spell
// an execution-space qualifier that plain C++ compilers must not see.
#if defined(__CUDACC__)
#define DS4_HD __host__ __device__
#define DS4_HD_INLINE __host__ __device__ __forceinline__
#else
#define DS4_HD
#define DS4_HD_INLINE inline
#endif

static_assert(__cplusplus >= 202002L, "ds4 headers need C++20 (set CMAKE_CXX_STANDARD 20; nvcc: -std=c++20)");
