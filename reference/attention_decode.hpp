#pragma once
// Sink-aware decode attention (docs/model.md §2.4 steps 9-10): every query head against one shared
// K=V row per position, raw window rows oldest -> newest, then the visible compressed rows in
// ascending index; the head's sink logit joins the softmax denominator but adds no value.
#include <cstdint>

#include "ds4/core/rope.hpp"

namespace ds4::ref {

// For each head h:
//   s_r = dot_f32(q_h, row_r) * (1/sqrtf(head_dim))       (sequential 512-dim dot)
//   m = max(sink[h], max_r s_r); denom = exp(sink[h] - m)
//   for r in order: w = exp(s_r - m); denom += w; o_h += w * row_r   (AXPY, element-wise)
//   o_h *= 1/denom
// comp_mask: nullptr (all compressed rows visible) or n_comp bytes, 0 = skipped.
void sink_attention(const float* q, const float* raw, int n_raw, const float* comp, int n_comp,
                    const std::uint8_t* comp_mask, const float* sinks, int n_head, int head_dim,
                    float* out);

// sink_attention followed by inverse RoPE of each output head's last n_rot dims at pos.
void attention_decode(const float* q, const float* raw, int n_raw, const float* comp, int n_comp,
                      const std::uint8_t* comp_mask, const float* sinks, int n_head, int head_dim,
                      int n_rot, const rope_params& rp, std::uint32_t pos, float* out);

}  // namespace ds4::ref
