#pragma once
// The indexer of ratio-4 layers (docs/model.md §2.6): FP4-simulated queries and keys, per-row scores
// sum_h w_h * relu(q_h . k), and the top-k selection that masks compressed attention rows.
#include <cstdint>
#include <vector>

#include "ds4/core/rope.hpp"

namespace ds4::ref {

inline constexpr int indexer_head_dim = 128;

// In-place unnormalised Walsh-Hadamard butterfly over 128 values (strides 1, 2, ..., 64,
// (a, b) -> (a + b, a - b)), then every value times 0.08838834764831845f (1/sqrt(128)).
void hadamard128(float* x);

// QAT of one 128-vector: hadamard128, then the E2M1 round trip per 32-value block.
void indexer_qat(float* x);

// Queries: q = q_b . qn (F16 [n_lora_q, n_head*128]); per head RoPE on dims 64..127 at pos,
// then indexer_qat. q has n_head*128 values.
void indexer_queries(const std::uint16_t* q_b, const float* qn, int n_lora_q, int n_head,
                     std::uint32_t pos, const rope_params& rp, float* q);

// Head weights: w = proj . xn (F16 [n_embd, n_head]), each times 1/sqrtf(128*n_head).
void indexer_head_weights(const std::uint16_t* proj, const float* xn, int n_embd, int n_head, float* w);

// score[c] = sum_{h ascending} max(0, keys_c . q_h) * w_h, dots sequential over 128 dims.
void indexer_scores(const float* q, const float* w, int n_head, const float* keys, int n_comp,
                    float* scores);

// The top_k highest scores: repeated selection of the largest not-yet-selected score with strict
// >, so equal scores go to the lower index. Returns the selected row indices in selection order.
std::vector<int> indexer_top_k(const float* scores, int n_comp, int top_k);

// The whole step. Returns an empty mask when n_comp <= top_k (every row visible, nothing read);
// otherwise mask[c] = 1 for the selected rows.
std::vector<std::uint8_t> indexer_mask(const std::uint16_t* q_b, const std::uint16_t* proj,
                                       const float* qn, const float* xn, const float* keys,
                                       int n_comp, int n_lora_q, int n_embd, int n_head, int top_k,
                                       std::uint32_t pos, const rope_params& rp);

}  // namespace ds4::ref
