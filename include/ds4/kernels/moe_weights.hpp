#pragma once
// The MoE layer's shape and device weight pointers (kernels/moe.cuh, moe_gemm.cuh), apart from
// the kernels: a file that only holds or passes these (the CUDA backend's weight table) includes
// this instead of moe.cuh, whose inline launchers would compile every MoE and matvec kernel there.
#include <cstdint>

namespace ds4::kernels {

struct moe_shape {
    int n_embd = 4096, n_ff = 2048, n_ff_shared = 2048, n_expert = 256;
};

// The routed experts of one layer in the tiled layouts; expert e of gate/up/down starts at e
// times the layout's per-expert size. Shared by the decode MoE and the grouped GEMM (moe_gemm.cuh).
struct moe_routed_weights {
    const std::uint8_t* gate_q = nullptr;   // iq2_xxs tiled, per expert [n_ff][n_embd]
    const std::uint16_t* gate_d = nullptr;
    const std::uint8_t* up_q = nullptr;
    const std::uint16_t* up_d = nullptr;
    const std::uint8_t* down_q = nullptr;   // q2_k tiled, per expert [n_embd][n_ff]
    const std::uint32_t* down_dd = nullptr;
};

// Device weights of one layer: the routed experts, the router and the shared expert.
struct moe_weights : moe_routed_weights {
    const std::uint16_t* router = nullptr;  // F16 rows [n_expert][n_embd] as in the GGUF
    const float* bias = nullptr;            // [n_expert], null = no bias
    const std::int32_t* tid2eid = nullptr;  // [n_vocab][6]; non-null selects hash routing
    const std::uint8_t* sh_gate_q = nullptr;  // q8_0 tiled [n_ff_shared][n_embd]
    const std::uint16_t* sh_gate_d = nullptr;
    const std::uint8_t* sh_up_q = nullptr;
    const std::uint16_t* sh_up_d = nullptr;
    const std::uint8_t* sh_down_q = nullptr;  // q8_0 tiled [n_embd][n_ff_shared]
    const std::uint16_t* sh_down_d = nullptr;
    float clamp = 10.0f;
    float weight_scale = 1.5f;
};

}  // namespace ds4::kernels
