#pragma once
// Opens the engine for a model file on the best backend this build and machine offer. The server
// and the CLI call this and then see only ds4::engine::backend.
#include <filesystem>
#include <memory>
#include <string>

#include "ds4/engine/backend.hpp"

namespace ds4::backends {

enum class backend_kind { automatic, cpu, cuda };

struct backend_options {
    std::filesystem::path model;  // the base model GGUF
    std::filesystem::path mtp;    // optional MTP head GGUF (empty: no drafter)
    backend_kind kind = backend_kind::automatic;  // automatic: CUDA where a device is present, else CPU
    int threads = 0;              // CPU backend threads; 0 = all cores
    bool exact = false;           // CUDA: exact CUDA-core attention (logits bit-equal to the CPU's)
    std::uint64_t kv_capacity_bytes = 0;  // 0: the backend's default (CPU: bounded by memory)
    // truncate()'s reach in positions (each kept position costs a frontier copy per sequence);
    // -1: the backend's default (16).
    std::int32_t max_rollback = -1;
    // CUDA: rows of the largest prefill chunk (16..4096); 0: the backend's default (1024).
    int chunk_rows = 0;
};

// "cpu" / "cuda" / "auto" -> kind; anything else is a ds4::error naming the accepted values.
backend_kind parse_backend_kind(const std::string& name);

std::unique_ptr<engine::backend> open_backend(const backend_options& options);

}  // namespace ds4::backends
