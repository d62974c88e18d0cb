#include "reference/norm_rope.hpp"

#include "ds4/core/reduce.hpp"

namespace ds4::ref {

float rms_scale(const float* x, int n, float eps) { return ds4::rms_scale(x, n, eps); }

void rms_norm(const float* x, const float* w, int n, float eps, float* out) {
    const float scale = rms_scale(x, n, eps);
    for (int i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

void rms_norm_noweight(const float* x, int n, float eps, float* out) {
    const float scale = rms_scale(x, n, eps);
    for (int i = 0; i < n; ++i) out[i] = x[i] * scale;
}

void head_rms_norm(float* x, int n_head, int head_dim, float eps) {
    for (int h = 0; h < n_head; ++h) rms_norm_noweight(x + std::int64_t(h) * head_dim, head_dim, eps,
                                                      x + std::int64_t(h) * head_dim);
}

void rope_tail(float* x, int n_head, int head_dim, int n_rot, const rope_params& p,
               std::uint32_t pos, bool inverse) {
    for (int h = 0; h < n_head; ++h)
        rope_tail_inplace(x + std::int64_t(h) * head_dim + (head_dim - n_rot), n_rot, p, pos, inverse);
}

}  // namespace ds4::ref
