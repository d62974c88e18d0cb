#pragma once
// The CPU reference backend of the engine contract (ds4/engine/backend.hpp): the layer program
// of ds4/graph/ instantiated with the reference op set, weights used in place from the GGUF
// mapping, KV in the native paged formats, sampling with the reference sampler.
//
// Batch invariance (decision 3): a sequence's outputs depend only on its own rows. Every row
// runs the same per-row code, rows of a sequence in position order, and the reference ops split
// work by constants, never by the thread count; so one prefill of N tokens, N single steps, and
// any mix with other sequences give the same bits. It is the oracle the CUDA backend's exact
// mode is compared with.
#include <cstdint>
#include <filesystem>
#include <memory>

#include "ds4/engine/backend.hpp"
#include "ds4/gguf/reader.hpp"

namespace ds4::ref {

struct cpu_backend_options {
    std::filesystem::path mtp;      // optional MTP head file (empty: no drafter)
    std::int32_t max_rollback = 16;  // truncate() reach; 0 keeps no frontier history
    std::int32_t max_draft = 16;
    std::int32_t max_rows_per_step = 8192;
};

// Opens and validates the model (and the MTP head); a bad file is a ds4::error with the
// validator's report.
std::unique_ptr<engine::backend> make_cpu_backend(const std::filesystem::path& model,
                                                  const cpu_backend_options& options = {});
std::unique_ptr<engine::backend> make_cpu_backend(gguf::file model, const cpu_backend_options& options = {});

}  // namespace ds4::ref
