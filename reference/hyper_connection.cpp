#include "reference/hyper_connection.hpp"

#include <string>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/core/hyper_connection.hpp"
#include "reference/matvec.hpp"
#include "reference/norm_rope.hpp"

namespace ds4::ref {

hc_split hc_split_sinkhorn(const float* mix, const float* scale, const float* base, int n_hc,
                           int iters, float eps) {
    require(n_hc > 0 && n_hc <= hc_split::max_hc, "hc_split_sinkhorn: n_hc = " + std::to_string(n_hc));
    return ds4::hc_split_sinkhorn(mix, scale, base, n_hc, iters, eps);
}

namespace {

// x_in[d] = sum_h X[h][d]*w[h] (ds4/core/hyper_connection.hpp).
void weighted_stream_sum(const float* X, const float* w, int n_embd, int n_hc, float* out) {
    for (int d = 0; d < n_embd; ++d) out[d] = hc_weighted_sum(X + d, n_embd, w, n_hc);
}

}  // namespace

hc_split hc_pre(const float* X, const std::uint16_t* fn, const float* scale, const float* base,
                int n_embd, int n_hc, int iters, float rms_eps, float hc_eps, float* x_in) {
    const int n_flat = n_embd * n_hc;
    const int n_mix = 2 * n_hc + n_hc * n_hc;
    std::vector<float> flat(n_flat), mix(n_mix);
    rms_norm_noweight(X, n_flat, rms_eps, flat.data());
    matvec_f16(fn, flat.data(), n_flat, n_mix, mix.data());
    const hc_split s = hc_split_sinkhorn(mix.data(), scale, base, n_hc, iters, hc_eps);
    weighted_stream_sum(X, s.pre, n_embd, n_hc, x_in);
    return s;
}

void hc_post(const float* F, const float* X, const hc_split& s, int n_embd, int n_hc, float* Y) {
    for (int j = 0; j < n_hc; ++j)
        for (int d = 0; d < n_embd; ++d) Y[std::int64_t(j) * n_embd + d] = hc_post_element(F[d], X + d, n_embd, s, n_hc, j);
}

void output_hc_mix(const float* X, const std::uint16_t* fn, const float* scale, const float* base,
                   int n_embd, int n_hc, float rms_eps, float hc_eps, float* e) {
    require(n_hc > 0 && n_hc <= hc_split::max_hc, "output_hc_mix: n_hc = " + std::to_string(n_hc));
    const int n_flat = n_embd * n_hc;
    std::vector<float> flat(n_flat);
    float pre[hc_split::max_hc], w[hc_split::max_hc];
    rms_norm_noweight(X, n_flat, rms_eps, flat.data());
    matvec_f16(fn, flat.data(), n_flat, n_hc, pre);
    for (int h = 0; h < n_hc; ++h) w[h] = hc_output_weight(pre[h], scale[0], base[h], hc_eps);
    weighted_stream_sum(X, w, n_embd, n_hc, e);
}

}  // namespace ds4::ref
