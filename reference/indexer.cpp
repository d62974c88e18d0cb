#include "reference/indexer.hpp"

#include <algorithm>
#include <cmath>

#include "ds4/format/e2m1.hpp"
#include "reference/matvec.hpp"

namespace ds4::ref {

void hadamard128(float* x) {
    for (int stride = 1; stride < indexer_head_dim; stride *= 2) {
        for (int base = 0; base < indexer_head_dim; base += 2 * stride) {
            for (int i = base; i < base + stride; ++i) {
                const float a = x[i], b = x[i + stride];
                x[i] = a + b;
                x[i + stride] = a - b;
            }
        }
    }
    for (int i = 0; i < indexer_head_dim; ++i) x[i] *= 0.08838834764831845f;
}

void indexer_qat(float* x) {
    hadamard128(x);
    for (int b = 0; b < indexer_head_dim; b += e2m1_block_size) e2m1_block_roundtrip(x + b, e2m1_block_size);
}

void indexer_queries(const std::uint16_t* q_b, const float* qn, int n_lora_q, int n_head,
                     std::uint32_t pos, const rope_params& rp, float* q) {
    matvec_f16(q_b, qn, n_lora_q, n_head * indexer_head_dim, q);
    for (int h = 0; h < n_head; ++h) {
        float* qh = q + std::int64_t(h) * indexer_head_dim;
        rope_tail_inplace(qh + indexer_head_dim - 64, 64, rp, pos, false);
        indexer_qat(qh);
    }
}

void indexer_head_weights(const std::uint16_t* proj, const float* xn, int n_embd, int n_head, float* w) {
    matvec_f16(proj, xn, n_embd, n_head, w);
    const float scale = 1.0f / std::sqrt(float(indexer_head_dim * n_head));
    for (int h = 0; h < n_head; ++h) w[h] *= scale;
}

void indexer_scores(const float* q, const float* w, int n_head, const float* keys, int n_comp,
                    float* scores) {
    for (int c = 0; c < n_comp; ++c) {
        const float* k = keys + std::int64_t(c) * indexer_head_dim;
        float s = 0.0f;
        for (int h = 0; h < n_head; ++h) {
            const float d = dot_f32(k, q + std::int64_t(h) * indexer_head_dim, indexer_head_dim);
            s += (d > 0.0f ? d : 0.0f) * w[h];
        }
        scores[c] = s;
    }
}

std::vector<int> indexer_top_k(const float* scores, int n_comp, int top_k) {
    // The repeated strict-> selection of the spec orders rows by (score descending, index
    // ascending); a partial sort under that total order picks the same rows in the same order
    // in O(n log k), which matters at 1M context (262144 rows). Scores are finite (NaN-free).
    std::vector<int> idx(n_comp);
    for (int c = 0; c < n_comp; ++c) idx[c] = c;
    const int n = top_k < n_comp ? top_k : n_comp;
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int a, int b) {
        return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    });
    idx.resize(n);
    return idx;
}

std::vector<std::uint8_t> indexer_mask(const std::uint16_t* q_b, const std::uint16_t* proj,
                                       const float* qn, const float* xn, const float* keys,
                                       int n_comp, int n_lora_q, int n_embd, int n_head, int top_k,
                                       std::uint32_t pos, const rope_params& rp) {
    if (n_comp <= top_k) return {};
    std::vector<float> q(std::size_t(n_head) * indexer_head_dim), w(n_head), scores(n_comp);
    indexer_queries(q_b, qn, n_lora_q, n_head, pos, rp, q.data());
    indexer_head_weights(proj, xn, n_embd, n_head, w.data());
    indexer_scores(q.data(), w.data(), n_head, keys, n_comp, scores.data());
    std::vector<std::uint8_t> mask(n_comp, 0);
    for (int c : indexer_top_k(scores.data(), n_comp, top_k)) mask[c] = 1;
    return mask;
}

}  // namespace ds4::ref
