#pragma once
// Every CUDA call is checked; a failure becomes a ds4::error naming the call site and the
// CUDA error string. std::source_location gives the site without a macro.
#include <cuda_runtime.h>

#include <source_location>
#include <string>

#include "ds4/core/error.hpp"

namespace ds4 {

inline void cuda_check(cudaError_t status, const char* what,
                       std::source_location where = std::source_location::current()) {
    if (status == cudaSuccess) return;
    fail(std::string(where.file_name()) + ":" + std::to_string(where.line()) + ": " + what + ": " +
         cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

// After a launch: catches bad configurations at once; execution errors surface at the next
// synchronising call, which is checked the same way.
inline void cuda_check_launch(const char* kernel, std::source_location where = std::source_location::current()) {
    cuda_check(cudaGetLastError(), kernel, where);
}

// True when a CUDA device is usable; GPU tests skip (exit 77) otherwise.
inline bool cuda_device_present() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

}  // namespace ds4
