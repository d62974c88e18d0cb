// docs/model.md §2.2: pre[h] = 1/(1+exp(-z)) + 1e-6. Where the sigmoid is open the 1e-6 is below
// float rounding of a gate near 0.5, so the gate tests elsewhere cannot see it; a closed gate
// (z = -40, sigmoid 4.2e-18) is worth exactly the epsilon, and x_in is then 1e-6 * sum_h X[h][d]
// instead of ~0.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference/hyper_connection.hpp"

TEST_CASE("§2.2: a closed pre gate is the HC epsilon, not 0") {
    float mix[24] = {}, base[24] = {};
    const float scale[3] = {1.0f, 1.0f, 1.0f};
    const float z[4] = {-40.0f, -40.0f, -30.0f, 0.0f};
    for (int h = 0; h < 4; ++h) base[h] = z[h];
    const auto s = ds4::ref::hc_split_sinkhorn(mix, scale, base, 4, 20, 1e-6f);
    for (int h = 0; h < 4; ++h) {
        const double want = 1.0 / (1.0 + std::exp(-double(z[h]))) + 1e-6;
        INFO("h " << h << " pre " << s.pre[h] << " want " << want);
        CHECK(std::fabs(s.pre[h] - want) <= 1e-6 * want);
    }
}

TEST_CASE("§2.2: x_in with every pre gate closed is 1e-6 times the stream sum") {
    const int n_embd = 64;
    std::vector<float> X(4 * n_embd), x_in(n_embd);
    for (int h = 0; h < 4; ++h)
        for (int d = 0; d < n_embd; ++d) X[h * n_embd + d] = float(h + 1) * (d % 7 == 0 ? -1.0f : 0.5f) + 0.01f * d;
    // fn = 0 (F16 +0): mix = 0, so every gate is sigmoid(base[h]) + 1e-6 = 1e-6 + 4.2e-18.
    const std::vector<std::uint16_t> fn(std::size_t(24) * 4 * n_embd, 0);
    const float scale[3] = {1.0f, 1.0f, 1.0f};
    float base[24] = {};
    for (int h = 0; h < 4; ++h) base[h] = -40.0f;
    ds4::ref::hc_pre(X.data(), fn.data(), scale, base, n_embd, 4, 20, 1e-6f, 1e-6f, x_in.data());
    const double gate = 1.0 / (1.0 + std::exp(40.0)) + 1e-6;
    for (int d = 0; d < n_embd; ++d) {
        double want = 0, mag = 0;
        for (int h = 0; h < 4; ++h) want += X[h * n_embd + d] * gate, mag += std::fabs(X[h * n_embd + d] * gate);
        INFO("d " << d << " x_in " << x_in[d] << " want " << want);
        CHECK(mag > 0.0);
        CHECK(std::fabs(x_in[d] - want) <= 1e-5 * mag);
    }
}
