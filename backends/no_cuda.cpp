#include "backends/cuda_entry.hpp"
#include "ds4/core/error.hpp"

namespace ds4::backends {

int cuda_device_count() { return 0; }

std::unique_ptr<engine::backend> open_cuda_backend(const backend_options&) {
    fail("backend 'cuda': this build has no CUDA backend (build with nvcc present and DS4_ENABLE_CUDA=ON)");
}

}  // namespace ds4::backends
