#include "reference/attention_split.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "ds4/core/math.hpp"
#include "reference/norm_rope.hpp"
#include "reference/parallel.hpp"

namespace ds4::ref {

namespace {

struct chunk_state {
    float m = 0, l = 0;
    std::vector<float> o;
};

// One chunk's (m, l, o) over its visible rows, in the order given.
void chunk_partial(const float* qh, const std::vector<const float*>& rows, int head_dim, float kq_scale,
                   chunk_state& st) {
    std::vector<float> s(rows.size());
    float m = -std::numeric_limits<float>::infinity();
    for (std::size_t r = 0; r < rows.size(); ++r) {
        float acc = 0.0f;
        for (int i = 0; i < head_dim; ++i) acc = fma_f32(qh[i], rows[r][i], acc);
        s[r] = mul_rn(acc, kq_scale);
        if (s[r] > m) m = s[r];
    }
    st.m = m;
    st.l = 0.0f;
    st.o.assign(std::size_t(head_dim), 0.0f);
    for (std::size_t r = 0; r < rows.size(); ++r) {
        const float p = exp_f32(sub_rn(s[r], m));
        st.l = add_rn(st.l, p);
        for (int i = 0; i < head_dim; ++i) st.o[std::size_t(i)] = fma_f32(p, rows[r][i], st.o[std::size_t(i)]);
    }
}

}  // namespace

void split_sink_attention(const float* q, const float* raw, std::int64_t raw_first_pos, int n_raw, const float* comp,
                          int n_comp, const std::uint8_t* comp_mask, const float* sinks, int n_head, int head_dim,
                          float* out) {
    const float kq_scale = 1.0f / std::sqrt(float(head_dim));
    const std::int64_t C = attention_chunk_rows;
    // The chunks' visible rows, in visiting order.
    std::vector<std::vector<const float*>> chunks;
    for (int i = 0; i < n_raw; ++i) {
        const std::int64_t p = raw_first_pos + i;
        if (i == 0 || p % C == 0) chunks.emplace_back();
        chunks.back().push_back(raw + std::int64_t(i) * head_dim);
    }
    std::int64_t open = -1;
    for (int c = 0; c < n_comp; ++c) {
        if (comp_mask && !comp_mask[c]) continue;
        if (c / C != open) {
            chunks.emplace_back();
            open = c / C;
        }
        chunks.back().push_back(comp + std::int64_t(c) * head_dim);
    }
    parallel_for(n_head, [&](std::int64_t h0, std::int64_t h1) {
        std::vector<chunk_state> st(chunks.size());
        for (std::int64_t h = h0; h < h1; ++h) {
            const float* qh = q + h * head_dim;
            float* oh = out + h * head_dim;
            for (std::size_t c = 0; c < chunks.size(); ++c) chunk_partial(qh, chunks[c], head_dim, kq_scale, st[c]);
            const float sink = sinks[h];
            float M = sink;
            for (const auto& s : st)
                if (s.m > M) M = s.m;
            float denom = exp_f32(sub_rn(sink, M));
            for (int i = 0; i < head_dim; ++i) oh[i] = 0.0f;
            for (const auto& s : st) {
                const float w = exp_f32(sub_rn(s.m, M));
                denom = fma_f32(w, s.l, denom);
                for (int i = 0; i < head_dim; ++i) oh[i] = fma_f32(w, s.o[std::size_t(i)], oh[i]);
            }
            const float inv = div_rn(1.0f, denom);
            for (int i = 0; i < head_dim; ++i) oh[i] = mul_rn(oh[i], inv);
        }
    });
}

void attention_decode_split(const float* q, const float* raw, int n_raw, const float* comp, int n_comp,
                            const std::uint8_t* comp_mask, const float* sinks, int n_head, int head_dim, int n_rot,
                            const rope_params& rp, std::uint32_t pos, float* out) {
    split_sink_attention(q, raw, std::int64_t(pos) + 1 - n_raw, n_raw, comp, n_comp, comp_mask, sinks, n_head,
                         head_dim, out);
    rope_tail(out, n_head, head_dim, n_rot, rp, pos, true);
}

}  // namespace ds4::ref
