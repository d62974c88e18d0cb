#pragma once
// The base model's weights in one device arena, in the layouts the kernels read (docs/README.md decision 5):
// Q8_0 matrices tiled (format/tiled.hpp, kernels/matvec.cuh), routed experts tiled per expert
// (IQ2_XXS gate/up, Q2_K down: kernels/moe.cuh), everything else (F16 embeddings, HC fns, router,
// compressor and indexer projections; F32 norms, scales, sinks; I32 hash table) as in the GGUF.
//
// The loader streams the file tensor by tensor: each tensor is repacked on the host into one of
// two pinned staging buffers (sized by the largest tensor), copied asynchronously into its place
// in the arena while the next one is repacked, and its host pages are released behind it
// (gguf::file::release). Peak device memory is the arena (the final weight bytes) plus nothing:
// the staging is host memory. Free device memory is checked against the arena (plus a reserve)
// before anything is allocated.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ds4/core/rope.hpp"
#include "ds4/gguf/reader.hpp"
#include "ds4/kernels/moe_weights.hpp"
#include "ds4/model/shape.hpp"

namespace ds4::cuda_backend {

// A Q8_0 matrix in the tiled layout: quants then scales.
struct q8_matrix {
    const std::uint8_t* quants = nullptr;
    const std::uint16_t* scales = nullptr;
    int rows = 0, in = 0;
};

struct hc_mix {
    const std::uint16_t* fn = nullptr;  // F16 [n_mix][n_hc * n_embd]
    const float* scale = nullptr;
    const float* base = nullptr;
};

struct compressor_mats {
    const std::uint16_t* wkv = nullptr;   // F16 [width][n_embd]
    const std::uint16_t* wgate = nullptr;
    const std::uint16_t* ape = nullptr;   // F16 [ratio][width]
    const float* norm = nullptr;
};

struct layer_weights {
    hc_mix hc_attn, hc_ffn;
    const float* attn_norm = nullptr;
    const float* q_a_norm = nullptr;
    const float* kv_norm = nullptr;
    const float* sinks = nullptr;
    const float* ffn_norm = nullptr;
    q8_matrix q_a, q_b, kv, out_a, out_b;
    compressor_mats attn_comp, idx_comp;
    const std::uint16_t* idx_q_b = nullptr;   // F16 [n_indexer_head * 128][n_lora_q]
    const std::uint16_t* idx_proj = nullptr;  // F16 [n_indexer_head][n_embd]
    kernels::moe_weights moe;                 // tid2eid set on hash layers only
    rope_params rope{};
};

struct head_weights {
    hc_mix hc;
    const float* norm = nullptr;
    q8_matrix output;
};

struct model_weights {
    const std::uint16_t* token_embd = nullptr;
    std::vector<layer_weights> layers;
    head_weights head;
};

// The arena and the bound pointers. Loading prints a progress line with GB/s on stderr when it
// is a terminal.
class device_weights {
public:
    // `reserve_bytes`: device memory that must stay free after the weights (KV pools, workspaces);
    // a device with less free memory than arena + reserve is a ds4::error naming both figures.
    device_weights(gguf::file& file, const model::model_dims& d, std::uint64_t reserve_bytes);
    ~device_weights();
    device_weights(const device_weights&) = delete;
    device_weights& operator=(const device_weights&) = delete;

    const model_weights& weights() const { return w_; }
    std::uint64_t bytes() const { return bytes_; }

private:
    void* arena_ = nullptr;
    std::uint64_t bytes_ = 0;
    model_weights w_;
};

}  // namespace ds4::cuda_backend
