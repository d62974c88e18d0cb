#pragma once
// The CUDA backend's entry points as open_backend sees them. A build without CUDA links
// no_cuda.cpp, which reports no device and refuses --backend cuda by name.
#include <memory>

#include "backends/open_backend.hpp"

namespace ds4::backends {

int cuda_device_count();
std::unique_ptr<engine::backend> open_cuda_backend(const backend_options& options);

}  // namespace ds4::backends
