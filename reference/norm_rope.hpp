#pragma once
// RMSNorm, the per-head norm without weight, and RoPE/YaRN on head tails (docs/model.md §2.4 steps
// 1-4 and 10). The angle definition is the shared one in ds4/core/rope.hpp.
#include <cstdint>

#include "ds4/core/rope.hpp"

namespace ds4::ref {

// 1/sqrtf((float)(sum_i (double)x_i^2 / n) + eps): squares exact in double, summed in the lane
// order of ds4/core/reduce.hpp (the kernels' order), the mean rounded to float once.
float rms_scale(const float* x, int n, float eps);

// out = (x * scale) * w. out may alias x.
void rms_norm(const float* x, const float* w, int n, float eps, float* out);

// out = x * scale (no weight: HC-flat and the output head's flat state). out may alias x.
void rms_norm_noweight(const float* x, int n, float eps, float* out);

// Each of n_head heads of head_dim values scaled by its own rms_scale, in place (§2.4 step 2).
void head_rms_norm(float* x, int n_head, int head_dim, float eps);

// RoPE (or its inverse) on the last n_rot values of each head, at position pos (§2.4 step 4).
void rope_tail(float* x, int n_head, int head_dim, int n_rot, const rope_params& p,
               std::uint32_t pos, bool inverse);

}  // namespace ds4::ref
