#include "reference/hyper_connection.hpp"

#include <string>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/core/math.hpp"
#include "reference/matvec.hpp"
#include "reference/norm_rope.hpp"

namespace ds4::ref {
namespace {

// 1/(1+e^-z) as §2.2 writes it (not the stable form: upstream uses this one for the HC gates).
float plain_sigmoid(float z) { return 1.0f / (1.0f + exp_f32(-z)); }

// x_in[d] = sum_h X[h][d]*w[h], h ascending, accumulator starting at 0.0f.
void weighted_stream_sum(const float* X, const float* w, int n_embd, int n_hc, float* out) {
    for (int d = 0; d < n_embd; ++d) {
        float acc = 0.0f;
        for (int h = 0; h < n_hc; ++h) acc += X[std::int64_t(h) * n_embd + d] * w[h];
        out[d] = acc;
    }
}

}  // namespace

hc_split hc_split_sinkhorn(const float* mix, const float* scale, const float* base, int n_hc,
                           int iters, float eps) {
    require(n_hc > 0 && n_hc <= hc_split::max_hc, "hc_split_sinkhorn: n_hc = " + std::to_string(n_hc));
    hc_split s{};
    for (int h = 0; h < n_hc; ++h) s.pre[h] = plain_sigmoid(mix[h] * scale[0] + base[h]) + eps;
    for (int h = 0; h < n_hc; ++h) {
        const int o = n_hc + h;
        s.post[h] = 2.0f / (1.0f + exp_f32(-(mix[o] * scale[1] + base[o])));
    }
    float* M = s.comb;  // M[i*n_hc + j]
    for (int i = 0; i < n_hc; ++i) {
        float mx = -1e30f;
        for (int j = 0; j < n_hc; ++j) {
            const int o = 2 * n_hc + i * n_hc + j;
            M[i * n_hc + j] = mix[o] * scale[2] + base[o];
            if (M[i * n_hc + j] > mx) mx = M[i * n_hc + j];
        }
        float sum = 0.0f;
        for (int j = 0; j < n_hc; ++j) {
            M[i * n_hc + j] = exp_f32(M[i * n_hc + j] - mx);
            sum += M[i * n_hc + j];
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j < n_hc; ++j) M[i * n_hc + j] = M[i * n_hc + j] * inv + eps;
    }
    auto column_pass = [&] {
        for (int j = 0; j < n_hc; ++j) {
            float sum = 0.0f;
            for (int i = 0; i < n_hc; ++i) sum += M[i * n_hc + j];
            const float inv = 1.0f / (sum + eps);
            for (int i = 0; i < n_hc; ++i) M[i * n_hc + j] *= inv;
        }
    };
    column_pass();
    for (int it = 1; it < iters; ++it) {
        for (int i = 0; i < n_hc; ++i) {
            float sum = 0.0f;
            for (int j = 0; j < n_hc; ++j) sum += M[i * n_hc + j];
            const float inv = 1.0f / (sum + eps);
            for (int j = 0; j < n_hc; ++j) M[i * n_hc + j] *= inv;
        }
        column_pass();
    }
    return s;
}

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
    for (int j = 0; j < n_hc; ++j) {
        for (int d = 0; d < n_embd; ++d) {
            float acc = F[d] * s.post[j];
            for (int i = 0; i < n_hc; ++i) acc += s.comb[i * n_hc + j] * X[std::int64_t(i) * n_embd + d];
            Y[std::int64_t(j) * n_embd + d] = acc;
        }
    }
}

void output_hc_mix(const float* X, const std::uint16_t* fn, const float* scale, const float* base,
                   int n_embd, int n_hc, float rms_eps, float hc_eps, float* e) {
    require(n_hc > 0 && n_hc <= hc_split::max_hc, "output_hc_mix: n_hc = " + std::to_string(n_hc));
    const int n_flat = n_embd * n_hc;
    std::vector<float> flat(n_flat);
    float pre[hc_split::max_hc], w[hc_split::max_hc];
    rms_norm_noweight(X, n_flat, rms_eps, flat.data());
    matvec_f16(fn, flat.data(), n_flat, n_hc, pre);
    for (int h = 0; h < n_hc; ++h) w[h] = sigmoid(pre[h] * scale[0] + base[h]) + hc_eps;
    weighted_stream_sum(X, w, n_embd, n_hc, e);
}

}  // namespace ds4::ref
