#include "reference/attention_decode.hpp"

#include <cmath>
#include <vector>

#include "ds4/core/math.hpp"
#include "reference/matvec.hpp"
#include "reference/norm_rope.hpp"
#include "reference/parallel.hpp"

namespace ds4::ref {

void sink_attention(const float* q, const float* raw, int n_raw, const float* comp, int n_comp,
                    const std::uint8_t* comp_mask, const float* sinks, int n_head, int head_dim,
                    float* out) {
    const float kq_scale = 1.0f / std::sqrt(float(head_dim));
    // Visible rows in attention order.
    std::vector<const float*> rows;
    rows.reserve(std::size_t(n_raw) + n_comp);
    for (int r = 0; r < n_raw; ++r) rows.push_back(raw + std::int64_t(r) * head_dim);
    for (int c = 0; c < n_comp; ++c)
        if (!comp_mask || comp_mask[c]) rows.push_back(comp + std::int64_t(c) * head_dim);

    parallel_for(n_head, [&](std::int64_t h0, std::int64_t h1) {
        std::vector<float> score(rows.size());
        for (std::int64_t h = h0; h < h1; ++h) {
            const float* qh = q + h * head_dim;
            float* oh = out + h * head_dim;
            float m = sinks[h];
            for (std::size_t r = 0; r < rows.size(); ++r) {
                score[r] = dot_f32(qh, rows[r], head_dim) * kq_scale;
                if (score[r] > m) m = score[r];
            }
            for (int i = 0; i < head_dim; ++i) oh[i] = 0.0f;
            float denom = exp_f32(sinks[h] - m);
            for (std::size_t r = 0; r < rows.size(); ++r) {
                const float w = exp_f32(score[r] - m);
                denom += w;
                for (int i = 0; i < head_dim; ++i) oh[i] += w * rows[r][i];
            }
            const float inv = 1.0f / denom;
            for (int i = 0; i < head_dim; ++i) oh[i] *= inv;
        }
    });
}

void attention_decode(const float* q, const float* raw, int n_raw, const float* comp, int n_comp,
                      const std::uint8_t* comp_mask, const float* sinks, int n_head, int head_dim,
                      int n_rot, const rope_params& rp, std::uint32_t pos, float* out) {
    sink_attention(q, raw, n_raw, comp, n_comp, comp_mask, sinks, n_head, head_dim, out);
    rope_tail(out, n_head, head_dim, n_rot, rp, pos, true);
}

}  // namespace ds4::ref
