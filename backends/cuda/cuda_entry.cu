#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda_entry.hpp"
#include "ds4/core/cuda_check.hpp"

namespace ds4::backends {

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

std::unique_ptr<engine::backend> open_cuda_backend(const backend_options& o) {
    require(cuda_device_count() > 0, "backend 'cuda': no CUDA device is present");
    require(o.mtp.empty(), "backend 'cuda': MTP drafts are not implemented on the CUDA backend yet (drop --mtp)");
    cuda_backend::options c;
    c.exact = o.exact;
    c.kv_capacity_bytes = o.kv_capacity_bytes;
    return cuda_backend::make_cuda_backend(o.model, c);
}

}  // namespace ds4::backends
