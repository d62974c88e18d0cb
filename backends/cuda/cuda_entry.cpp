#include <cstdio>

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
    // The contract reports a missing drafter as caps().max_draft == 0; callers adapt to it.
    if (!o.mtp.empty())
        std::fprintf(stderr, "backend 'cuda': the MTP head '%s' is not loaded (no drafter on the CUDA backend yet)\n",
                     o.mtp.string().c_str());
    cuda_backend::options c;
    c.exact = o.exact;
    c.kv_capacity_bytes = o.kv_capacity_bytes;
    if (o.max_rollback >= 0) c.max_rollback = o.max_rollback;
    if (o.chunk_rows > 0) c.chunk_rows = o.chunk_rows;
    return cuda_backend::make_cuda_backend(o.model, c);
}

}  // namespace ds4::backends
