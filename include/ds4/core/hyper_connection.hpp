#pragma once
// The scalar parts of the hyper-connection (docs/model.md §2.2, §2.3, §2.8) shared by
// reference/hyper_connection and kernels/hyper_connection.cuh: the gates and Sinkhorn combine
// matrix from the 24-wide mix, the output head's gates, and the per-element stream sums. Every
// product and sum is one rounding (mul_rn/add_rn), so host and device agree bit for bit.
#include <cstdint>

#include "ds4/core/host_device.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4 {

// The split of the mix: pre[n_hc], post[n_hc], comb[n_hc*n_hc] with comb[i*n_hc + j] = M[i][j]
// (flat index 2*n_hc + n_hc*i + j of the mix, as §2.2 writes it).
struct hc_split {
    static constexpr int max_hc = 8;
    float pre[max_hc];
    float post[max_hc];
    float comb[max_hc * max_hc];
};

// 1/(1+e^-z) as §2.2 writes it (not the stable form: upstream uses this one for the HC gates).
DS4_HD_INLINE float hc_plain_sigmoid(float z) { return div_rn(1.0f, add_rn(1.0f, exp_f32(-z))); }

// The pre gate of stream h, sigmoid(mix[h]*scale[0] + base[h]) + eps: what hc_split_sinkhorn
// writes to pre[h], on its own so that a kernel can weight the streams without the Sinkhorn.
DS4_HD_INLINE float hc_pre_gate(float mix, float scale0, float base, float eps) {
    return add_rn(hc_plain_sigmoid(add_rn(mul_rn(mix, scale0), base)), eps);
}

// The post gate of stream h: 2*sigmoid(mix[n_hc+h]*scale[1] + base[n_hc+h]).
DS4_HD_INLINE float hc_post_gate(float mix, float scale1, float base) {
    return div_rn(2.0f, add_rn(1.0f, exp_f32(-add_rn(mul_rn(mix, scale1), base))));
}

// The combine matrix's logit M[i][j] before the row softmax.
DS4_HD_INLINE float hc_comb_logit(float mix, float scale2, float base) { return add_rn(mul_rn(mix, scale2), base); }

// A Sinkhorn pass's factor for a row or column whose sum (from 0.0f, in index order) is `sum`.
DS4_HD_INLINE float hc_sinkhorn_factor(float sum, float eps) { return div_rn(1.0f, add_rn(sum, eps)); }

// Gates and the Sinkhorn-normalised combine matrix, exactly as §2.2: plain sigmoid (+eps for
// pre, x2 for post), row softmax (max-subtracted, multiply by 1/sum, +eps), one column pass,
// then iters-1 (row, column) passes, each multiplying by 1/(sum + eps). `scale` is F32[3],
// `base` F32[2*n_hc + n_hc*n_hc]; 1 <= n_hc <= max_hc (the caller checks). kernels/
// hyper_connection.cuh also runs it spread over lanes (one lane per M[i][j], the same steps).
DS4_HD_INLINE hc_split hc_split_sinkhorn(const float* mix, const float* scale, const float* base, int n_hc,
                                         int iters, float eps) {
    hc_split s{};
    for (int h = 0; h < n_hc; ++h) s.pre[h] = hc_pre_gate(mix[h], scale[0], base[h], eps);
    for (int h = 0; h < n_hc; ++h) s.post[h] = hc_post_gate(mix[n_hc + h], scale[1], base[n_hc + h]);
    float* M = s.comb;  // M[i*n_hc + j]
    for (int i = 0; i < n_hc; ++i) {
        float mx = -1e30f;
        for (int j = 0; j < n_hc; ++j) {
            const int o = 2 * n_hc + i * n_hc + j;
            M[i * n_hc + j] = hc_comb_logit(mix[o], scale[2], base[o]);
            if (M[i * n_hc + j] > mx) mx = M[i * n_hc + j];
        }
        float sum = 0.0f;
        for (int j = 0; j < n_hc; ++j) {
            M[i * n_hc + j] = exp_f32(sub_rn(M[i * n_hc + j], mx));
            sum = add_rn(sum, M[i * n_hc + j]);
        }
        const float inv = div_rn(1.0f, sum);
        for (int j = 0; j < n_hc; ++j) M[i * n_hc + j] = add_rn(mul_rn(M[i * n_hc + j], inv), eps);
    }
    // One column pass, then iters-1 (row, column) passes; iters < 1 still runs the first.
    for (int it = 0; it < (iters > 1 ? iters : 1); ++it) {
        if (it > 0) {
            for (int i = 0; i < n_hc; ++i) {
                float sum = 0.0f;
                for (int j = 0; j < n_hc; ++j) sum = add_rn(sum, M[i * n_hc + j]);
                const float inv = hc_sinkhorn_factor(sum, eps);
                for (int j = 0; j < n_hc; ++j) M[i * n_hc + j] = mul_rn(M[i * n_hc + j], inv);
            }
        }
        for (int j = 0; j < n_hc; ++j) {
            float sum = 0.0f;
            for (int i = 0; i < n_hc; ++i) sum = add_rn(sum, M[i * n_hc + j]);
            const float inv = hc_sinkhorn_factor(sum, eps);
            for (int i = 0; i < n_hc; ++i) M[i * n_hc + j] = mul_rn(M[i * n_hc + j], inv);
        }
    }
    return s;
}

// The output head's gates (§2.8): w_h = sigmoid_stable(pre[h]*scale[0] + base[h]) + eps.
DS4_HD_INLINE float hc_output_weight(float pre, float scale0, float base, float eps) {
    return add_rn(sigmoid(add_rn(mul_rn(pre, scale0), base)), eps);
}

// x_in[d] = sum_h X[h][d]*w[h], h ascending, from 0.0f; `stride` = n_embd.
DS4_HD_INLINE float hc_weighted_sum(const float* X, std::int64_t stride, const float* w, int n_hc) {
    float acc = 0.0f;
    for (int h = 0; h < n_hc; ++h) acc = add_rn(acc, mul_rn(X[h * stride], w[h]));
    return acc;
}

// Y[j][d] = F[d]*post[j] + sum_i M[i][j]*X[i][d], i ascending after the F term.
DS4_HD_INLINE float hc_post_element(float f, const float* X, std::int64_t stride, const hc_split& s, int n_hc, int j) {
    float acc = mul_rn(f, s.post[j]);
    for (int i = 0; i < n_hc; ++i) acc = add_rn(acc, mul_rn(s.comb[i * n_hc + j], X[i * stride]));
    return acc;
}

}  // namespace ds4
