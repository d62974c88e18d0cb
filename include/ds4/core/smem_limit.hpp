#pragma once
// Dynamic shared memory above the 48 KB default needs a per-kernel opt-in. It is raised once per
// thread and kernel (and only upwards), so a launch captured into a CUDA graph after an eager
// launch or a plan has run sets no attribute.
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "ds4/core/cuda_check.hpp"

namespace ds4 {

template <class Kernel>
void raise_smem_limit(Kernel* kernel, std::size_t bytes, const char* what) {
    static thread_local std::vector<std::pair<const void*, std::size_t>> raised;
    const void* key = reinterpret_cast<const void*>(kernel);
    auto it = raised.begin();
    while (it != raised.end() && it->first != key) ++it;
    if (it != raised.end() && it->second >= bytes) return;
    cuda_check(cudaFuncSetAttribute(key, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what);
    if (it != raised.end()) it->second = bytes;
    else raised.emplace_back(key, bytes);
}

}  // namespace ds4
