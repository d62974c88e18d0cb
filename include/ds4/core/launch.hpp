#pragma once
// Kernel launches with programmatic dependent launch (PDL, sm_90 and later).
//
// A decode step is ~750 short launches, most of them a few microseconds long, so the time
// between one kernel's last CTA and the next kernel's first useful load is a large part of the
// step. With PDL the next kernel is launched while the current one still runs: its CTAs become
// resident, do what does not depend on earlier kernels (address arithmetic; weights, which no
// kernel writes), then wait in pdl_wait() until every earlier grid has completed and its stores
// are visible.
//
// The rule every kernel of the library follows, so that launching any of them with the
// attribute is safe after any other kernel:
//   - before pdl_wait(): no global store, and no global load of anything a kernel writes (only
//     weights and launch parameters);
//   - every CTA calls pdl_wait() before it exits, so a grid never completes before the grids it
//     depends on (the chain A -> B -> C stays ordered when C reads what A wrote);
//   - pdl_launch_dependents() after pdl_wait(), so at most one launch ahead is resident and
//     waiting (the dependent's CTAs start only once every CTA of this grid has started, so they
//     never take an SM slot this grid's own CTAs need). One exception, on a launch flag: the
//     decode MoE's finish (kernels/moe.cuh), a grid of a few CTAs whose wait is long, may release
//     the next launch first.
// On a GPU before sm_90, or a launch without the attribute, both are no-ops. DS4_PDL=0 in the
// environment launches without the attribute (for A/B measurement).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/per_device.hpp"

namespace ds4 {

// Waits until every grid this one depends on has completed and flushed its stores.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next launch in the stream start once every CTA of this grid has called it (or exited).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The start of a kernel that has nothing to do before its inputs are ready.
__device__ __forceinline__ void pdl_enter() {
    pdl_wait();
    pdl_launch_dependents();
}

// Asks L2 to fetch [p, p + bytes) (p 16-byte aligned; bytes rounded down to 16): what a kernel
// may do with its weights before pdl_wait(), one thread per range. On sm_90 one bulk prefetch;
// below it nothing, since without PDL there is no earlier kernel to overlap.
__device__ __forceinline__ void prefetch_l2(const void* p, std::size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const std::uint32_t n = std::uint32_t(bytes & ~std::size_t(15));
    if (n > 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
#else
    (void)p;
    (void)bytes;
#endif
}

// Whether launches on the current device carry the PDL attribute: compute capability 9.0 or
// later, unless DS4_PDL=0.
inline bool pdl_enabled() {
    static per_device_once<bool> enabled;
    return enabled.get(current_device(), [](int device) {
        int major = 0;
        cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
        const char* env = std::getenv("DS4_PDL");
        return major >= 9 && !(env && std::strcmp(env, "0") == 0);
    });
}

// Whether launches carry their stream's priority as a launch attribute: off until a caller
// creates a stream of non-default priority (mark_stream_priorities), so that a captured graph
// instantiated with node priorities (core/cuda_graph.hpp) keeps them.
inline bool& stream_priorities_marked() {
    static bool marked = false;
    return marked;
}
inline void mark_stream_priorities() { stream_priorities_marked() = true; }

namespace detail {
template <class... Params, class... Args>
void launch_kernel_with(bool pdl, unsigned cluster, const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                        std::size_t smem, cudaStream_t stream, Args&&... args) {
    cudaLaunchAttribute attr[3]{};
    unsigned n = 0;
    if (cluster > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster;
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        ++n;
    }
    if (pdl && pdl_enabled()) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    int priority = 0;
    if (stream_priorities_marked() && cudaStreamGetPriority(stream, &priority) == cudaSuccess && priority != 0) {
        attr[n].id = cudaLaunchAttributePriority;
        attr[n].val.priority = priority;
        ++n;
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = n;
    cuda_check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), name);
}
}  // namespace detail

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute where enabled.
template <class... Params, class... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                   cudaStream_t stream, Args&&... args) {
    detail::launch_kernel_with(true, 0, name, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// The same launch without the PDL attribute: its CTAs become resident only once the launch before
// it in the stream has completed, so until then the SM slots stay free for other streams' work
// (a wide grid launched early would hold them all while it waits).
template <class... Params, class... Args>
void launch_kernel_after(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                         cudaStream_t stream, Args&&... args) {
    detail::launch_kernel_with(false, 0, name, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// The PDL launch with the grid in clusters of `cluster` CTAs along x (sm_90 and later; the
// kernel's non-portable size opt-in, where cluster > 8, is its family's prepare).
template <class... Params, class... Args>
void launch_kernel_cluster(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                           unsigned cluster, cudaStream_t stream, Args&&... args) {
    detail::launch_kernel_with(true, cluster, name, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace ds4
