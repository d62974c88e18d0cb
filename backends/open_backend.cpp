#include "backends/open_backend.hpp"

#include "backends/cuda_entry.hpp"
#include "ds4/core/error.hpp"
#include "reference/cpu_backend.hpp"
#include "reference/parallel.hpp"

namespace ds4::backends {

backend_kind parse_backend_kind(const std::string& name) {
    if (name == "auto") return backend_kind::automatic;
    if (name == "cpu") return backend_kind::cpu;
    if (name == "cuda") return backend_kind::cuda;
    fail("backend '" + name + "': expected one of auto, cpu, cuda");
}

std::unique_ptr<engine::backend> open_backend(const backend_options& o) {
    require(o.threads >= 0, "backend options: threads must be >= 0 (0 = all cores)");
    require(o.max_rollback >= -1, "backend options: max_rollback must be >= 0 (or -1: the default)");
    require(o.chunk_rows == 0 || (o.chunk_rows >= 16 && o.chunk_rows <= 4096),
            "backend options: chunk_rows must be 16..4096 (or 0: the default)");
    const bool cuda = o.kind == backend_kind::cuda || (o.kind == backend_kind::automatic && cuda_device_count() > 0);
    if (cuda) return open_cuda_backend(o);
    ref::set_thread_count(o.threads);
    ref::cpu_backend_options c;
    c.mtp = o.mtp;
    if (o.max_rollback >= 0) c.max_rollback = o.max_rollback;
    return ref::make_cpu_backend(o.model, c);
}

}  // namespace ds4::backends
