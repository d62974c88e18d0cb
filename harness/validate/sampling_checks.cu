// ds4-validate rows for kernels/sampling.cuh against reference/sampling: the token of every row
// (greedy and sampled, each row with its own sampler, seed and step), the chosen token's
// log-probability and the top log-probabilities, bitwise. Logit rows are peaked (a few tokens far
// above the rest, ties at the top), flat (most of the vocabulary within reach: such rows exceed
// the candidate cap unless top_k cuts them, and must say so with status 1 exactly when the host
// rule below predicts it), massively tied (few distinct values, +0 and -0 among them), and, for
// greedy rows, with NaNs (an all-NaN row must give 0). A graph captured at 2 rows replays at 6.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/device_buffer.hpp"
#include "ds4/core/math.hpp"
#include "ds4/kernels/sampling.cuh"
#include "harness/validate/checks.hpp"
#include "harness/validate/row_inputs.hpp"
#include "reference/sampling.hpp"

namespace ds4::validate {
namespace {

using kernels::sampling_row;

enum class logit_kind { peaked, flat, tied, nan };

std::vector<float> make_logits(std::mt19937_64& g, int n, logit_kind k) {
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> l(n);
    switch (k) {
        case logit_kind::flat:
            for (auto& v : l) v = n01(g);
            break;
        case logit_kind::tied: {
            static const float values[] = {-2.0f, -1.0f, 0.0f, -0.0f, 1.0f, 3.0f};
            for (auto& v : l) v = values[g() % std::size(values)];
            break;
        }
        default: {
            for (auto& v : l) v = 2.0f * n01(g) - 10.0f;
            std::uniform_real_distribution<float> boost(8.0f, 25.0f);
            const int peaks = 1 + int(g() % 50);
            for (int p = 0; p < peaks; ++p) l[g() % n] = boost(g);
            const int top = int(std::max_element(l.begin(), l.end()) - l.begin());
            l[g() % n] = l[top];  // a tie at the maximum
            l[g() % n] = 0.0f;
            l[g() % n] = -0.0f;
            if (k == logit_kind::nan)
                for (int i = 0; i < 5; ++i) l[g() % n] = std::nanf("");
        }
    }
    return l;
}

sampling_row random_sampler(std::mt19937_64& g, int n, bool greedy) {
    sampling_row p;
    static const std::int32_t logprobs[] = {-1, 0, 3, 20};
    p.n_logprobs = logprobs[g() % std::size(logprobs)];
    p.seed = g();
    p.step = g() % 100000;
    if (greedy) return p;
    switch (g() % 6) {
        case 0: p.temperature = 0.8f, p.top_k = 40; break;
        case 1: p.temperature = 1.0f, p.top_p = 0.9f; break;
        case 2: p.temperature = 1.3f, p.min_p = 0.05f; break;
        case 3: p.temperature = 0.6f, p.top_k = 1; break;
        case 4: p.temperature = 1.0f, p.top_k = n + 5, p.top_p = 0.5f, p.min_p = 0.02f; break;
        default: p.temperature = 1.0f; break;
    }
    return p;
}

ref::sampling_params ref_params(const sampling_row& p) {
    ref::sampling_params r;
    r.temperature = p.temperature;
    r.top_k = p.top_k;
    r.top_p = p.top_p;
    r.min_p = p.min_p;
    r.seed = p.seed;
    return r;
}

// The status the kernel's contract predicts: 1 when the candidates down to the smallest
// non-negligible weight, cut at top_k, exceed the cap (the rare fallbacks aside).
int expected_status(const std::vector<float>& l, const sampling_row& p) {
    if (!(p.temperature > 0.0f)) return 0;
    const int n = int(l.size());
    const float z0 = l[std::size_t(ref::sample_argmax(l.data(), n))] / p.temperature;
    float lmin = INFINITY;
    for (float v : l)
        if (exp_f32(v / p.temperature - z0) >= kernels::sampling_negligible) lmin = std::min(lmin, v);
    const int prefix = int(std::count_if(l.begin(), l.end(), [&](float v) { return v >= lmin; }));
    const int k = (p.top_k > 0 && p.top_k < n) ? p.top_k : n;
    return std::min(k, prefix) > kernels::sampling_max_candidates ? 1 : 0;
}

struct sample_run {
    int n, capacity;
    device_buffer<float> logits;
    device_buffer<sampling_row> params;
    device_buffer<std::int32_t> token, status;
    device_buffer<float> logprob;
    device_buffer<kernels::sampled_logprob> top;
    device_buffer<float> work;
    device_count rows;
    kernels::sampling_launch a;
    int device_rows = 0, host_rows = 0;

    sample_run(int n_, int cap)
        : n(n_), capacity(cap), logits(std::size_t(cap) * n_), params(cap), token(cap), status(cap), logprob(cap),
          top(std::size_t(cap) * kernels::sampling_max_logprobs), work(kernels::sampling_work_floats(cap)) {
        work.fill_bytes(0);  // the counters start at zero; every launch leaves them there
        a = {logits.data(), n, n, params.data(), token.data(), status.data(), logprob.data(), top.data(), rows.get(),
             work.data()};
    }

    template <class Run>
    comparison run(std::mt19937_64& g, int n_rows, const std::vector<logit_kind>& kinds, Run&& launch) {
        std::vector<float> l;
        std::vector<sampling_row> p;
        std::vector<logit_kind> kind(capacity);
        for (int r = 0; r < capacity; ++r) {
            kind[r] = kinds[g() % kinds.size()];
            auto row = make_logits(g, n, kind[r]);
            if (r == 0 && kind[r] == logit_kind::nan) std::fill(row.begin(), row.end(), std::nanf(""));
            l.insert(l.end(), row.begin(), row.end());
            p.push_back(random_sampler(g, n, kind[r] == logit_kind::nan || g() % 4 == 0));
            // The reference's top list sorts with a comparator NaN breaks: rows with NaN ask for
            // the chosen token's log-probability only.
            if (kind[r] == logit_kind::nan) p.back().n_logprobs = std::min(p.back().n_logprobs, 0);
        }
        logits.upload(l);
        params.upload(p);
        rows.set(n_rows);
        for (auto* b : {&token, &status}) b->fill_bytes(0x7f);
        logprob.fill_bytes(0xff);
        top.fill_bytes(0xff);
        cuda_check(cudaDeviceSynchronize(), "sampling inputs");
        launch();
        const auto got_t = token.download(), got_s = status.download();
        const auto got_l = logprob.download();
        const auto got_top = top.download();
        comparison c;
        std::vector<float> got_f, want_f;
        for (int r = 0; r < n_rows; ++r) {
            const float* lr = l.data() + std::size_t(r) * n;
            const int want_status = expected_status(std::vector<float>(lr, lr + n), p[r]);
            ++c.count;
            if (got_s[r] != want_status) {
                ++c.mismatches;
                continue;
            }
            if (want_status) {
                ++host_rows;
                c.mismatches += got_t[r] != -1;
                continue;
            }
            ++device_rows;
            const int want = ref::sample(lr, n, ref_params(p[r]), p[r].step);
            c.mismatches += got_t[r] != want;
            if (p[r].n_logprobs < 0) continue;
            got_f.push_back(got_l[r]);
            want_f.push_back(ref::logprob_of(lr, n, want));
            const auto top_want = ref::top_logprobs(lr, n, std::min(p[r].n_logprobs, kernels::sampling_max_logprobs));
            for (std::size_t j = 0; j < top_want.size(); ++j) {
                const auto& gt = got_top[std::size_t(r) * kernels::sampling_max_logprobs + j];
                c.mismatches += gt.token != top_want[j].token;
                got_f.push_back(gt.logprob);
                want_f.push_back(top_want[j].logprob);
            }
        }
        c.add(compare(got_f, want_f));
        c.mismatches += written_outside(got_t, std::size_t(n_rows), std::size_t(capacity), 0x7f);
        c.mismatches += written_outside(got_s, std::size_t(n_rows), std::size_t(capacity), 0x7f);
        return c;
    }

    std::string note() const {
        return std::to_string(device_rows) + " rows on device, " + std::to_string(host_rows) + " over the cap (status 1)";
    }
};

}  // namespace

std::vector<check_row> check_sampling(std::uint64_t seed, bool quick) {
    std::mt19937_64 g(seed ^ 0x73616du);
    using K = logit_kind;
    const std::vector<K> all = {K::peaked, K::peaked, K::flat, K::tied, K::nan};
    std::vector<int> vocabs = {5, 97, 1000, 1536};
    if (!quick) vocabs.push_back(129280);
    std::vector<check_row> out;
    for (int n : vocabs)
        for (int rows : quick ? std::vector<int>{1, 7} : std::vector<int>{1, 7, 32}) {
            sample_run s(n, rows + 1);
            const comparison c = s.run(g, rows, all, [&] {
                kernels::launch_sampling(s.a, s.capacity, nullptr);
                cuda_check(cudaDeviceSynchronize(), "sampling");
            });
            out.push_back(row_of("sampling", std::to_string(n) + " x" + std::to_string(rows), "exact", c, s.note()));
        }
    sample_run s(quick ? 1536 : 129280, 6);
    comparison total;
    total.add(s.run(g, 2, all, [&] {
                   kernels::launch_sampling(s.a, s.capacity, nullptr);
                   cuda_check(cudaDeviceSynchronize(), "sampling");
               }));
    const replayed_graph graph([&](cudaStream_t st) { kernels::launch_sampling(s.a, s.capacity, st); });
    total.add(s.run(g, 6, all, graph));
    out.push_back(row_of("sampling", std::to_string(s.n) + " x6", "exact", total,
                         "graph captured at 2 rows; replayed at 6; " + s.note()));
    return out;
}

}  // namespace ds4::validate
