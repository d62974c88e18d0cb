#include "reference/sampling.hpp"

#include <algorithm>
#include <vector>

#include "ds4/core/math.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rng.hpp"

namespace ds4::ref {

int sample_argmax(const float* logits, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (logits[i] > logits[best] || (logits[best] != logits[best] && logits[i] == logits[i])) best = i;
    return best;
}

int sample(const float* logits, int n, const sampling_params& p, std::uint64_t step) {
    if (!(p.temperature > 0.0f)) return sample_argmax(logits, n);
    std::vector<int> idx(n);
    for (int i = 0; i < n; ++i) idx[i] = i;
    const int k = (p.top_k > 0 && p.top_k < n) ? p.top_k : n;
    auto before = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
    idx.resize(k);

    std::vector<float> w(k);
    const float z0 = logits[idx[0]] / p.temperature;
    for (int i = 0; i < k; ++i) w[i] = exp_f32(logits[idx[i]] / p.temperature - z0);

    int kept = k;
    if (p.top_p < 1.0f) {
        float total = 0.0f;
        for (int i = 0; i < kept; ++i) total += w[i];
        const float target = p.top_p * total;
        float cum = 0.0f;
        for (int i = 0; i < kept; ++i) {
            cum += w[i];
            if (cum >= target) {
                kept = i + 1;
                break;
            }
        }
    }
    if (p.min_p > 0.0f) {
        int i = 1;
        while (i < kept && w[i] >= p.min_p) ++i;
        kept = i;
    }
    float total = 0.0f;
    for (int i = 0; i < kept; ++i) total += w[i];
    const float t = rng_uniform(p.seed, step) * total;
    float cum = 0.0f;
    for (int i = 0; i < kept; ++i) {
        cum += w[i];
        if (t < cum) return idx[i];
    }
    return idx[kept - 1];
}

namespace {

struct log_normaliser {
    float max = 0.0f;
    float log_sum = 0.0f;
};

log_normaliser normaliser(const float* logits, int n) {
    float m = logits[0];
    for (int i = 1; i < n; ++i) m = std::max(m, logits[i]);
    return {m, log_f32(sum_exp_shifted(logits, n, m))};
}

}  // namespace

float logprob_of(const float* logits, int n, int token) {
    const log_normaliser z = normaliser(logits, n);
    return (logits[token] - z.max) - z.log_sum;
}

std::vector<token_logprob> top_logprobs(const float* logits, int n, int n_top) {
    n_top = std::clamp(n_top, 0, n);
    if (n_top == 0) return {};
    const log_normaliser z = normaliser(logits, n);
    std::vector<int> idx(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) idx[std::size_t(i)] = i;
    auto before = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(idx.begin(), idx.begin() + n_top, idx.end(), before);
    std::vector<token_logprob> out(static_cast<std::size_t>(n_top));
    for (int i = 0; i < n_top; ++i) {
        const int t = idx[std::size_t(i)];
        out[std::size_t(i)] = {t, (logits[t] - z.max) - z.log_sum};
    }
    return out;
}

}  // namespace ds4::ref
