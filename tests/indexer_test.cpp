// The indexer (model.md §2.6): activation threshold, tie rule, Hadamard against the explicit
// Sylvester matrix, and the score formula against double.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/rope.hpp"
#include "reference/indexer.hpp"

TEST_CASE("hadamard128 equals the 128x128 Sylvester matrix times 1/sqrt(128)") {
    std::mt19937 rng(1);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x(128);
    for (auto& v : x) v = g(rng);
    std::vector<float> y = x;
    ds4::ref::hadamard128(y.data());
    for (int i = 0; i < 128; ++i) {
        double want = 0, mag = 0;
        for (int j = 0; j < 128; ++j) {
            const double h = (std::popcount(unsigned(i & j)) & 1) ? -1.0 : 1.0;
            want += h * x[j];
            mag += std::fabs(x[j]);
        }
        want /= std::sqrt(128.0);
        CHECK(std::fabs(y[i] - want) <= 1e-6 * mag);
    }
}

TEST_CASE("top-k: equal scores go to the lower index") {
    const float s[6] = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f, 0.5f};
    CHECK(ds4::ref::indexer_top_k(s, 6, 2) == std::vector<int>{1, 2});
    CHECK(ds4::ref::indexer_top_k(s, 6, 4) == std::vector<int>{1, 2, 4, 3});
    // Against the spec's repeated strict-> selection on many ties.
    std::mt19937 rng(2);
    std::uniform_int_distribution<int> u(0, 9);
    std::vector<float> sc(300);
    for (auto& v : sc) v = float(u(rng));
    std::vector<int> naive;
    std::vector<bool> taken(sc.size());
    for (int t = 0; t < 37; ++t) {
        int best = -1;
        for (int c = 0; c < int(sc.size()); ++c)
            if (!taken[c] && (best < 0 || sc[c] > sc[best])) best = c;
        taken[best] = true;
        naive.push_back(best);
    }
    CHECK(ds4::ref::indexer_top_k(sc.data(), int(sc.size()), 37) == naive);
}

TEST_CASE("the indexer switches on at top_k + 1 compressed rows") {
    const int n_lora_q = 32, n_embd = 64, n_head = 2, top_k = 5;
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<std::uint16_t> q_b(n_lora_q * n_head * 128), proj(n_embd * n_head);
    for (auto& v : q_b) v = ds4::f32_to_f16(0.2f * g(rng));
    for (auto& v : proj) v = ds4::f32_to_f16(0.2f * g(rng));
    std::vector<float> qn(n_lora_q), xn(n_embd), keys(7 * 128);
    for (auto& v : qn) v = g(rng);
    for (auto& v : xn) v = g(rng);
    for (auto& v : keys) v = g(rng);
    const auto rp = ds4::ds4_rope_params(true);
    CHECK(ds4::ref::indexer_mask(q_b.data(), proj.data(), qn.data(), xn.data(), keys.data(), top_k, n_lora_q,
                                 n_embd, n_head, top_k, 100, rp)
              .empty());
    const auto m = ds4::ref::indexer_mask(q_b.data(), proj.data(), qn.data(), xn.data(), keys.data(), top_k + 1,
                                          n_lora_q, n_embd, n_head, top_k, 100, rp);
    REQUIRE(m.size() == std::size_t(top_k + 1));
    int on = 0;
    for (auto b : m) on += b;
    CHECK(on == top_k);
}

TEST_CASE("scores: sum over heads of w_h * relu(k . q_h)") {
    const int n_head = 5, n_comp = 9;
    std::mt19937 rng(4);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> q(n_head * 128), w(n_head), keys(n_comp * 128), s(n_comp);
    for (auto& v : q) v = g(rng);
    for (auto& v : w) v = g(rng);
    for (auto& v : keys) v = g(rng);
    ds4::ref::indexer_scores(q.data(), w.data(), n_head, keys.data(), n_comp, s.data());
    for (int c = 0; c < n_comp; ++c) {
        double want = 0, mag = 0;
        for (int h = 0; h < n_head; ++h) {
            double d = 0, dm = 0;
            for (int i = 0; i < 128; ++i) {
                d += double(keys[c * 128 + i]) * q[h * 128 + i];
                dm += std::fabs(double(keys[c * 128 + i]) * q[h * 128 + i]);
            }
            want += std::max(0.0, d) * w[h];
            mag += dm * std::fabs(w[h]);
        }
        CHECK(std::fabs(s[c] - want) <= 1e-5 * mag);
    }
}

TEST_CASE("QAT output lies on the E2M1 grid of each 32-block") {
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x(128);
    for (auto& v : x) v = g(rng);
    ds4::ref::indexer_qat(x.data());
    for (int b = 0; b < 128; b += 32) {
        float amax = 0;
        for (int i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        // Values are k/2 * 2^e on the grid {0,.5,1,1.5,2,3,4,6}: at most 8 distinct magnitudes.
        std::vector<float> mags;
        for (int i = b; i < b + 32; ++i)
            if (std::find(mags.begin(), mags.end(), std::fabs(x[i])) == mags.end()) mags.push_back(std::fabs(x[i]));
        CHECK(mags.size() <= 8);
        CHECK(amax > 0.0f);
    }
}
