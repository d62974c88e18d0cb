#pragma once
// The split-KV order of kernels/attention_decode.cuh, replayed on the CPU (docs/README.md decision 1: a
// kernel that needs a parallel order fixes it by constants and the reference replays it). Same
// mathematics as sink_attention (docs/model.md §2.4 steps 9-10), other rounding order:
//
// Rows are grouped in chunks of attention_chunk_rows (= kv_page_rows = 64): raw rows by absolute
// position (chunk pos / 64), compressed rows by index (chunk c / 64). Chunks are visited raw
// ascending, then compressed ascending; a chunk with no visible row for the token is skipped.
// For a head h and a chunk c with visible rows r (ascending):
//   s_r  = dot(q_h, row_r) * kq_scale      dot: acc = fma(q[i], row[i], acc), i = 0..D-1, from 0
//   m_c  = max_r s_r (strict >, from -inf);  p_r = exp_f32(s_r - m_c)
//   l_c  = sum_r p_r (ascending, from 0);   o_c[d] = fma(p_r, row_r[d], o_c[d]) (ascending, from 0)
// Merge (chunks in order): M = max(sink_h, m_c) by strict >, starting at sink_h;
//   denom = exp_f32(sink_h - M); o = 0;  per chunk: w = exp_f32(m_c - M),
//   denom = fma(w, l_c, denom), o[d] = fma(w, o_c[d], o[d]);  then o[d] *= 1/denom (div_rn).
// kq_scale = 1.0f / sqrtf(float(D)), as sink_attention.
// Because the chunks are fixed by absolute position and index, a token's result does not depend
// on the other tokens, sequences or verify rows of the launch (decision 3).
#include <cstdint>

#include "ds4/core/rope.hpp"
#include "ds4/model/kv_layout.hpp"

namespace ds4::ref {

inline constexpr int attention_chunk_rows = model::kv_page_rows;

// raw: n_raw rows, the first at absolute position raw_first_pos (oldest -> newest).
// comp: n_comp rows, row c at index c; comp_mask nullptr (all visible) or n_comp bytes, 0 = skipped.
void split_sink_attention(const float* q, const float* raw, std::int64_t raw_first_pos, int n_raw, const float* comp,
                          int n_comp, const std::uint8_t* comp_mask, const float* sinks, int n_head, int head_dim,
                          float* out);

// split_sink_attention over the window of `pos` (raw rows pos+1-n_raw .. pos, n_raw = min(pos+1, n_swa),
// raw[i] at position pos+1-n_raw+i), then inverse RoPE of each head's last n_rot dims at pos.
void attention_decode_split(const float* q, const float* raw, int n_raw, const float* comp, int n_comp,
                            const std::uint8_t* comp_mask, const float* sinks, int n_head, int head_dim, int n_rot,
                            const rope_params& rp, std::uint32_t pos, float* out);

}  // namespace ds4::ref
