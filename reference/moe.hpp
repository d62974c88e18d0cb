#pragma once
// The MoE FFN sublayer of the q2 model (docs/model.md §2.7): router, routed experts (IQ2_XXS gate/up,
// Q2_K down, Q8_K activations), the Q8_0 shared expert, and F = moe + shared.
#include <cstdint>

#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q4_k.hpp"
#include "ds4/format/q8_0.hpp"

namespace ds4::ref {

struct moe_route {
    static constexpr int max_used = 16;
    int n_used = 0;
    int expert[max_used];
    float weight[max_used];
};

// p_e = sqrtf(softplus(logit_e)), logit = gate_inp . xn (F16 [n_embd, n_expert], matvec_f16).
void router_probs(const std::uint16_t* gate_inp, const float* xn, int n_embd, int n_expert, float* p);

// Selection by biased score p_e + bias_e (bias may be nullptr = 0): insertion into a descending
// list of n_used with strict >, so on ties the lower expert id stays ahead.
moe_route route_top_k(const float* p, const float* bias, int n_expert, int n_used, float weight_scale);

// Hash layers: the experts are tid2eid_row[0..n_used) in stored slot order.
moe_route route_hash(const float* p, const std::int32_t* tid2eid_row, int n_used, float weight_scale);

// The routed experts. gate/up: [n_embd, n_ff, n_expert] IQ2_XXS (expert e's n_ff rows start at
// block e*n_ff*n_embd/256); down: [n_ff, n_embd, n_expert] Q2_K. For slot s with expert e:
//   g = min(gate_e . Q8_K(xn), clamp); u = clamp(up_e . Q8_K(xn), -clamp, clamp)
//   mid = (silu(g) * u) * w_s; y_s = down_e . Q8_K(mid)
// out[o] = sum over slots in order (from 0.0f).
void moe_routed(const iq2_xxs_block* gate_exps, const iq2_xxs_block* up_exps, const q2_k_block* down_exps,
                const moe_route& route, const float* xn, int n_embd, int n_ff, float clamp, float* out);
// The same with Q4_K gate/up/down (the shipped MTP file's experts).
void moe_routed(const q4_k_block* gate_exps, const q4_k_block* up_exps, const q4_k_block* down_exps,
                const moe_route& route, const float* xn, int n_embd, int n_ff, float clamp, float* out);

// The shared expert: g, u from Q8_0 gate/up on Q8_0(xn); mid = silu(min(g, clamp)) *
// clamp(u, +-clamp); out = down . Q8_0(mid). gate/up [n_embd, n_ff], down [n_ff, n_embd].
void shared_expert(const q8_0_block* gate, const q8_0_block* up, const q8_0_block* down, const float* xn,
                   int n_embd, int n_ff, float clamp, float* out);

}  // namespace ds4::ref
