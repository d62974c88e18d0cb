#pragma once
// Hyper-connection pre/post (docs/model.md §2.2, §2.3) and the output head's HC mix (§2.8).
// The HC state X is n_hc streams of n_embd floats, stream-major: X[h*n_embd + d].
#include <cstdint>

#include "ds4/core/hyper_connection.hpp"

namespace ds4::ref {

// The split of the 24-wide (for n_hc = 4) mix (ds4/core/hyper_connection.hpp, shared with the
// kernels).
using hc_split = ds4::hc_split;

// Gates and the Sinkhorn-normalised combine matrix from the mix (ds4::hc_split_sinkhorn, n_hc
// checked), exactly as §2.2: plain sigmoid 1/(1+exp(-z)) (+eps for pre, x2 for post), row
// softmax (max-subtracted, multiply by 1/sum, +eps), one column pass, then iters-1 (row, column)
// passes, each multiplying by 1/(sum + eps). `scale` is F32[3], `base` F32[2*n_hc + n_hc*n_hc].
hc_split hc_split_sinkhorn(const float* mix, const float* scale, const float* base, int n_hc,
                           int iters, float eps);

// hc_pre: flat = RMSNorm_noweight(X) over n_hc*n_embd (double sum), mix = fn . flat with fn
// F16 [n_hc*n_embd, 2*n_hc + n_hc*n_hc] (matvec_f16 order), the split above, then
// x_in[d] = sum_h X[h][d]*pre[h] (h ascending, from 0.0f) on the unnormalised X.
// Returns the split (post and comb are what hc_post needs).
hc_split hc_pre(const float* X, const std::uint16_t* fn, const float* scale, const float* base,
                int n_embd, int n_hc, int iters, float rms_eps, float hc_eps, float* x_in);

// hc_post: Y[j][d] = F[d]*post[j] + sum_i M[i][j]*X[i][d], i ascending after the F term.
// Y may not alias X.
void hc_post(const float* F, const float* X, const hc_split& s, int n_embd, int n_hc, float* Y);

// Output head mix (§2.8): flat = RMSNorm_noweight(X), pre = fn . flat (fn F16 [n_hc*n_embd,
// n_hc]), w_h = sigmoid_stable(pre[h]*scale[0] + base[h]) + eps, e[d] = sum_h X[h][d]*w_h.
void output_hc_mix(const float* X, const std::uint16_t* fn, const float* scale, const float* base,
                   int n_embd, int n_hc, float rms_eps, float hc_eps, float* e);

}  // namespace ds4::ref
