#pragma once
// The KV compressor (docs/model.md §2.5): per-token projection into a rolling state, and every
// ratio-th token a pooled, normalised, RoPE'd, FP8- or FP4-simulated row appended to the
// compressed cache. Attention rows are head_dim wide (nope = head_dim - n_rot gets the E4M3
// round trip); indexer rows are 128 wide (Hadamard + E2M1 on all dims).
#include <cstdint>
#include <vector>

#include "ds4/core/rope.hpp"

namespace ds4::ref {

enum class compressed_row_kind { attention, indexer };

// Ratio 4 keeps two windows of 4 rows, each 2*head_dim wide (coff = 2: the first half of a
// token's projection pools with the next window, the second half with its own); any other ratio
// keeps ratio rows of head_dim. Initial state: kv = 0, score = -1e30.
struct compressor_state {
    int ratio = 0;
    int head_dim = 0;
    std::vector<float> kv, score;  // rows() x width(), row-major
    int coff() const { return ratio == 4 ? 2 : 1; }
    int width() const { return coff() * head_dim; }
    int rows() const { return coff() * ratio; }
};

compressor_state make_compressor_state(int ratio, int head_dim);

struct compressor_weights {
    const std::uint16_t* wkv;    // F16 [n_embd, width]
    const std::uint16_t* wgate;  // F16 [n_embd, width]
    const std::uint16_t* ape;    // F16 [width, ratio]: element (j, p) at ape[p*width + j]
    const float* norm;           // F32 [head_dim]
};

// kvp = wkv . xn; sc = wgate . xn + ape[pos % ratio] (matvec_f16 order, then one F32 add).
void compressor_project(const compressor_weights& w, const float* xn, int n_embd, int width, int ratio,
                        std::uint32_t pos, float* kvp, float* sc);

// The per-channel softmax pooling of the current state (head_dim outputs). Ratio 4 visits the
// 8 candidates interleaved: for i = 0..3, denom += wp_i + wc_i; sum += wp_i*vp_i; sum += wc_i*vc_i
// (prev window first half, current window second half); else denom += w_i; sum += w_i*v_i.
// A channel whose max score is <= -0.5e30 pools to 0; otherwise sum / denom.
void compressor_pool(const compressor_state& st, float* pooled);

// Write (kvp, sc) into the state row of pos; when (pos+1) % ratio == 0 finish a row into
// out_row (head_dim values, exactly as the cache stores it: RMSNorm * norm, RoPE on the last
// n_rot dims at pos + 1 - ratio, FP8 or Hadamard+FP4, F16 round), shift the ratio-4 window,
// and return true.
bool compressor_update(compressor_state& st, const float* kvp, const float* sc, const float* norm,
                       std::uint32_t pos, const rope_params& rp, int n_rot, compressed_row_kind kind,
                       float rms_eps, float* out_row);

// compressor_project + compressor_update.
bool compressor_step(compressor_state& st, const compressor_weights& w, const float* xn, int n_embd,
                     std::uint32_t pos, const rope_params& rp, int n_rot, compressed_row_kind kind,
                     float rms_eps, float* out_row);

}  // namespace ds4::ref
