// RMSNorm, per-head norm and RoPE/YaRN (docs/model.md §1 derived constants, §2.4 steps 1-4 and 10).
// Expected values are worked by hand or recomputed here in double from the spec's formulas.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ds4/core/rope.hpp"
#include "reference/norm_rope.hpp"

using ds4::rope_params;

TEST_CASE("rms_norm hand case") {
    // x = (3, 4, 0, 0): mean square 25/4, rms 2.5, scale 0.4 (eps 0 keeps it a hand value).
    const float x[4] = {3.0f, 4.0f, 0.0f, -0.0f};
    const float w[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    float out[4];
    ds4::ref::rms_norm(x, w, 4, 0.0f, out);
    CHECK(ds4::ref::rms_scale(x, 4, 0.0f) == 0.4f);
    CHECK(out[0] == 3.0f * 0.4f);
    CHECK(out[1] == (4.0f * 0.4f) * 2.0f);
    CHECK(out[2] == 0.0f);
    // eps enters inside the square root: all-zero input gives scale 1/sqrt(eps), not inf.
    const float z[3] = {0.0f, 0.0f, 0.0f};
    CHECK(ds4::ref::rms_scale(z, 3, 1e-6f) == doctest::Approx(1000.0).epsilon(1e-6));
}

TEST_CASE("rms_norm sums squares in double") {
    // 1 + 4096 * (2^-12)^2 * ... : a float accumulation would drop the tiny terms entirely.
    std::vector<float> x(4097, 0x1p-13f);
    x[0] = 1.0f;
    double ss = 1.0;
    for (int i = 1; i < 4097; ++i) ss += 0x1p-26;
    const float expect = 1.0f / std::sqrt(float(ss / 4097.0) + 1e-6f);
    CHECK(ds4::ref::rms_scale(x.data(), 4097, 1e-6f) == expect);
}

TEST_CASE("head_rms_norm normalises each head on its own, without weight") {
    std::vector<float> x = {1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 3};
    ds4::ref::head_rms_norm(x.data(), 3, 4, 0.0f);
    for (int i = 0; i < 8; ++i) CHECK(x[i] == 1.0f);
    CHECK(x[11] == 3.0f * (1.0f / std::sqrt(2.25f)));
}

TEST_CASE("RoPE derived constants match docs/model.md §1") {
    const rope_params c = ds4::ds4_rope_params(true);
    const rope_params d = ds4::ds4_rope_params(false);
    CHECK(c.theta_scale == 0.687656045f);
    CHECK(d.theta_scale == 0.749894202f);
    CHECK(c.freq_scale == 1.0f / 16.0f);
    CHECK(d.freq_scale == 1.0f);
    CHECK(c.yarn);
    CHECK_FALSE(d.yarn);
    CHECK(c.corr_low == 15.0f);
    CHECK(c.corr_high == 25.0f);
}

TEST_CASE("YaRN ramp is 1 up to pair 15, 0 from pair 25, linear between") {
    const rope_params c = ds4::ds4_rope_params(true);
    for (int k = 0; k <= 15; ++k) CHECK(ds4::rope_yarn_ramp(c, k) == 1.0f);
    for (int k = 25; k < 32; ++k) CHECK(ds4::rope_yarn_ramp(c, k) == 0.0f);
    CHECK(ds4::rope_yarn_ramp(c, 20) == 0.5f);
    CHECK(ds4::rope_yarn_ramp(c, 16) == doctest::Approx(0.9).epsilon(1e-6));
    // Pairs at or below 15 rotate at the raw frequency, at or above 25 at 1/16 of it.
    CHECK(ds4::rope_theta(c, 1000, 15) == doctest::Approx(1000.0 * std::pow(double(c.theta_scale), 15)).epsilon(1e-6));
    CHECK(ds4::rope_theta(c, 1000, 25) ==
          doctest::Approx(1000.0 / 16.0 * std::pow(double(c.theta_scale), 25)).epsilon(1e-6));
}

namespace {

// The spec's angle in double: pos * theta_scale^k, YaRN-mixed.
double spec_theta(const rope_params& p, std::uint32_t pos, int k) {
    const double ex = double(pos) * std::pow(double(p.theta_scale), k);
    if (!p.yarn) return ex;
    double y = (k - double(p.corr_low)) / std::max(0.001, double(p.corr_high - p.corr_low));
    y = std::min(1.0, std::max(0.0, y));
    const double ramp = 1.0 - y;
    return ex * p.freq_scale * (1.0 - ramp) + ex * ramp;
}

}  // namespace

TEST_CASE("RoPE angles at positions 0, 1 and 65535 follow the formula") {
    for (bool compressed : {false, true}) {
        const rope_params p = ds4::ds4_rope_params(compressed);
        for (std::uint32_t pos : {0u, 1u, 65535u}) {
            // A 2-head tensor with head_dim 80 (nope 16): the nope part must stay untouched.
            std::vector<float> x(160), y;
            std::mt19937 rng(pos + 7);
            std::uniform_real_distribution<float> u(-2.0f, 2.0f);
            for (auto& v : x) v = u(rng);
            y = x;
            ds4::ref::rope_tail(y.data(), 2, 80, 64, p, pos, false);
            for (int h = 0; h < 2; ++h) {
                for (int i = 0; i < 16; ++i) CHECK(y[h * 80 + i] == x[h * 80 + i]);
                for (int k = 0; k < 32; ++k) {
                    const double th = spec_theta(p, pos, k);
                    // The iterated float product drifts by at most ~k half-ulps from the exact
                    // power; the angle error then is relative, 32 * 2^-24.
                    CHECK(ds4::rope_theta(p, pos, k) == doctest::Approx(th).epsilon(2.5e-6));
                    const double x0 = x[h * 80 + 16 + 2 * k], x1 = x[h * 80 + 17 + 2 * k];
                    const double e0 = x0 * std::cos(th) - x1 * std::sin(th);
                    const double e1 = x0 * std::sin(th) + x1 * std::cos(th);
                    // Absolute tolerance: angle error (|th| * 2.5e-6) times |x| plus rounding.
                    const double tol = 4.0 * (std::fabs(th) * 2.5e-6 + 1e-6);
                    CHECK(std::fabs(y[h * 80 + 16 + 2 * k] - e0) <= tol);
                    CHECK(std::fabs(y[h * 80 + 17 + 2 * k] - e1) <= tol);
                }
            }
            if (pos == 0) CHECK(y == x);  // angle 0 everywhere: cos 1, sin 0 exactly
        }
    }
    // Position 1, pair 0 is exactly 1 radian on both layer kinds.
    CHECK(ds4::rope_theta(ds4::ds4_rope_params(true), 1, 0) == 1.0f);
    CHECK(ds4::rope_theta(ds4::ds4_rope_params(false), 1, 0) == 1.0f);
}

TEST_CASE("inverse RoPE undoes RoPE within rounding") {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    for (bool compressed : {false, true}) {
        const rope_params p = ds4::ds4_rope_params(compressed);
        for (std::uint32_t pos : {5u, 129u, 2051u, 1000000u}) {
            std::vector<float> x(3 * 512);
            for (auto& v : x) v = u(rng);
            std::vector<float> y = x;
            ds4::ref::rope_tail(y.data(), 3, 512, 64, p, pos, false);
            ds4::ref::rope_tail(y.data(), 3, 512, 64, p, pos, true);
            for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::fabs(y[i] - x[i]) <= 3e-6f * 3.0f);
        }
    }
}
