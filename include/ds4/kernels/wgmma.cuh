#pragma once
// sm_90a warpgroup MMA (wgmma) plumbing shared by the kernels that use it (attention_wgmma.cuh,
// moe_gemm_wgmma.cuh): shared-memory matrix descriptors, the fence / commit / wait of the
// async MMA, the proxy fence that makes ordinary shared-memory writes visible to it, named
// barriers, register hand-off between warpgroups, and the host probe that tells whether a device
// runs the sm_90a code of this build.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ds4/core/cuda_check.hpp"
#include "ds4/kernels/wgmma_desc.hpp"

namespace ds4::kernels::wgmma_detail {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
inline constexpr bool device_has_wgmma = true;
#else
inline constexpr bool device_has_wgmma = false;
#endif

// Shared-memory matrix descriptor, no swizzle: start address, leading (K-direction for K-major,
// K-direction core-matrix stride for N-major) and stride byte offsets, each >> 4.
__device__ __forceinline__ std::uint64_t smem_desc(const void* p, std::uint32_t lbo, std::uint32_t sbo) {
    return wgmma_desc_bits(static_cast<std::uint32_t>(__cvta_generic_to_shared(p)), lbo, sbo);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Until at most N committed groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy shared-memory writes made visible to the async proxy (wgmma operand reads).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
// Hands registers between warpgroups (whole warpgroup, immediate counts).
template <int N>
__device__ __forceinline__ void regs_grow() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void regs_shrink() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

template <int = 0>
__global__ void probe_kernel(int* out) { *out = device_has_wgmma ? 1 : 0; }

// The shared memory one CTA may opt in to on `dev`.
inline std::size_t smem_optin(int dev) {
    int optin = 0;
    cuda_check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "smem opt-in");
    return std::size_t(optin);
}

// Whether `dev` is an sm_90 device that runs this build's sm_90a code (a probe kernel reports what
// was compiled for it). It allocates, launches and copies: callers cache the answer per device and
// ask before any stream capture (their prepare_*(device)).
inline bool runs_wgmma_code(int dev) {
    int major = 0;
    cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cc major");
    if (major != 9) return false;
    int prev = 0;
    cuda_check(cudaGetDevice(&prev), "cudaGetDevice");
    cuda_check(cudaSetDevice(dev), "cudaSetDevice");
    int* d = nullptr;
    cuda_check(cudaMalloc(&d, sizeof(int)), "wgmma probe");
    probe_kernel<><<<1, 1>>>(d);
    int h = 0;
    const cudaError_t e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    (void)cudaGetLastError();
    cuda_check(cudaSetDevice(prev), "cudaSetDevice");
    return e == cudaSuccess && h == 1;
}

}  // namespace ds4::kernels::wgmma_detail
