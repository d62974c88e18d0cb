#pragma once
// The CUDA backend of the engine contract (ds4/engine/backend.hpp) on one device: weights loaded
// once into a device arena in the kernels' layouts (device_weights.hpp), KV rows in device page
// arenas with host-side page bookkeeping (copy on write by device page copies), the layer
// program of ds4/graph/ instantiated with the CUDA op set (cuda_ops.hpp) over sub-batches of up
// to 16 rows, sampling on the device. Snapshots use the CPU backend's byte format, so a snapshot
// taken on either backend restores on the other.
#include <cstdint>
#include <filesystem>
#include <memory>

#include "ds4/engine/backend.hpp"

namespace ds4::cuda_backend {

struct options {
    int device = 0;
    // Exact mode: the CUDA-core attention whose order the CPU reference replays (logits equal
    // the CPU backend's bitwise). Otherwise the tensor-core attention (F16 operands, bounded).
    bool exact = true;
    std::int32_t max_rollback = 16;
    std::int32_t max_rows_per_step = 8192;
    std::uint64_t kv_capacity_bytes = 0;  // 0: min(16 GiB, 90% of the memory left after the weights and the workspace)
    // Rows of the largest prefill chunk (rows that want no output): 16..4096; the activations
    // (about 0.5 MB per row on the flash shape) are sized for it. 2048 by measurement (H200, flash
    // shape, 2048-token prefill after 2048: 1874 tok/s at 1024 rows, 2125 at 2048; 4096-row chunks
    // of 4096-token calls 2066 after 4096): the grouped MoE reads every expert once per chunk.
    int chunk_rows = 2048;
    // A run of at least this many rows of any kind (decode or verify rows included) is one chunk
    // (each weight read once for all of them); shorter runs of output rows go in 16-row
    // sub-batches, which are faster there (H200, flash shape: 32 decode rows 183 tok/s chunked
    // against 308 in sub-batches, 128 rows 368 against 308). 0: only prefill rows form chunks.
    int chunk_output_rows = 128;
};

std::unique_ptr<engine::backend> make_cuda_backend(const std::filesystem::path& model, const options& o = {});

}  // namespace ds4::cuda_backend
