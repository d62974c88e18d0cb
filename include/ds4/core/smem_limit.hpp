#pragma once
// Dynamic shared memory above the 48 KB default needs a per-kernel opt-in, and the attribute is
// per device. It is raised once per (device, kernel), only upwards, and remembered for every
// thread: a family's prepare_*(device) raises it before capture, so a launch recorded into a
// CUDA graph sets no attribute. A launch during capture whose limit was never raised on that
// device fails with a ds4::error naming the kernel (see per_device.hpp).
#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/per_device.hpp"

namespace ds4 {

namespace smem_detail {

struct raised_limits {
    std::mutex m;
    std::vector<std::pair<const void*, std::size_t>> raised[max_devices];
};

inline raised_limits& limits() {
    static raised_limits r;
    return r;
}

template <class Kernel>
void raise(Kernel* kernel, std::size_t bytes, const char* what, const cudaStream_t* launch_stream) {
    const int dev = current_device();
    auto& l = limits();
    const void* key = reinterpret_cast<const void*>(kernel);
    std::lock_guard<std::mutex> lock(l.m);
    auto& raised = l.raised[dev];
    auto it = raised.begin();
    while (it != raised.end() && it->first != key) ++it;
    if (it != raised.end() && it->second >= bytes) return;
    if (launch_stream) require_prepared(false, *launch_stream, what, "the kernel family's prepare");
    cuda_check(cudaFuncSetAttribute(key, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what);
    if (it != raised.end()) it->second = bytes;
    else raised.emplace_back(key, bytes);
}

}  // namespace smem_detail

// `stream` is the launch's stream: while it captures, an unraised limit is an error.
template <class Kernel>
void raise_smem_limit(Kernel* kernel, std::size_t bytes, const char* what, cudaStream_t stream) {
    smem_detail::raise(kernel, bytes, what, &stream);
}

// The same from a prepare, before any capture.
template <class Kernel>
void raise_smem_limit(Kernel* kernel, std::size_t bytes, const char* what) {
    smem_detail::raise(kernel, bytes, what, nullptr);
}

// The largest dynamic shared memory a block may opt into on the current device.
inline std::size_t smem_optin_limit() {
    int optin = 0;
    cuda_check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, current_device()),
               "cudaDevAttrMaxSharedMemoryPerBlockOptin");
    return std::size_t(optin);
}

// The most dynamic shared memory `kernel` can opt into on the current device: the opt-in limit
// less the kernel's static shared memory (asking for the whole opt-in limit is an invalid value
// for a kernel that has any).
template <class Kernel>
std::size_t max_dynamic_smem(Kernel* kernel) {
    cudaFuncAttributes attr{};
    cuda_check(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel)), "cudaFuncGetAttributes");
    return smem_optin_limit() - attr.sharedSizeBytes;
}

}  // namespace ds4
