// The HC split of docs/model.md §2.2 against an independent double-precision statement of it, on
// mixes whose Sinkhorn iteration converges slowly. Random mixes converge within a few passes, so
// 20 and 21 passes agree to ~1e-6 there; a (nearly) triangular combine matrix converges like
// 1/k, and one pass more or less moves its entries by percents. The tolerance is tight enough
// that the float code must do exactly the spec's 20 normalisation passes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "ds4/model/shape.hpp"
#include "reference/hyper_connection.hpp"

namespace {

struct split_d {
    double pre[4], post[4], comb[16];
};

// docs/model.md §2.2 in double: sigmoid gates, row softmax + eps, one column pass, then passes-1
// (row, column) pairs, each multiplying by 1/(sum + eps). `passes` = 20 in the spec.
split_d spec_split(const float* mix, const float* scale, const float* base, int passes) {
    const double eps = 1e-6;
    split_d s{};
    for (int h = 0; h < 4; ++h) {
        s.pre[h] = 1.0 / (1.0 + std::exp(-(double(mix[h]) * scale[0] + base[h]))) + eps;
        s.post[h] = 2.0 / (1.0 + std::exp(-(double(mix[4 + h]) * scale[1] + base[4 + h])));
    }
    double* M = s.comb;
    for (int i = 0; i < 4; ++i) {
        double z[4], mx = -1e300, sum = 0;
        for (int j = 0; j < 4; ++j) mx = std::max(mx, z[j] = double(mix[8 + 4 * i + j]) * scale[2] + base[8 + 4 * i + j]);
        for (int j = 0; j < 4; ++j) sum += (z[j] = std::exp(z[j] - mx));
        for (int j = 0; j < 4; ++j) M[4 * i + j] = z[j] / sum + eps;
    }
    auto cols = [&] {
        for (int j = 0; j < 4; ++j) {
            double sum = 0;
            for (int i = 0; i < 4; ++i) sum += M[4 * i + j];
            for (int i = 0; i < 4; ++i) M[4 * i + j] *= 1.0 / (sum + eps);
        }
    };
    auto rows = [&] {
        for (int i = 0; i < 4; ++i) {
            double sum = 0;
            for (int j = 0; j < 4; ++j) sum += M[4 * i + j];
            for (int j = 0; j < 4; ++j) M[4 * i + j] *= 1.0 / (sum + eps);
        }
    };
    cols();
    for (int it = 1; it < passes; ++it) rows(), cols();
    return s;
}

double max_comb_diff(const split_d& a, const split_d& b) {
    double m = 0;
    for (int k = 0; k < 16; ++k) m = std::max(m, std::fabs(a.comb[k] - b.comb[k]));
    return m;
}

// The float code vs the double statement: gates within float rounding, comb within `tol`.
void check_split(const float* mix, const float* scale, const float* base, double tol) {
    const int passes = ds4::model::common_shape::n_hc_sinkhorn_iter;
    const split_d want = spec_split(mix, scale, base, 20);
    const ds4::ref::hc_split got = ds4::ref::hc_split_sinkhorn(mix, scale, base, 4, passes, 1e-6f);
    for (int h = 0; h < 4; ++h) {
        CHECK(got.pre[h] == doctest::Approx(want.pre[h]).epsilon(1e-6));
        CHECK(got.post[h] == doctest::Approx(want.post[h]).epsilon(1e-6));
    }
    for (int k = 0; k < 16; ++k) {
        INFO("comb[" << k << "] float " << got.comb[k] << " double " << want.comb[k]);
        CHECK(std::fabs(got.comb[k] - want.comb[k]) <= tol);
    }
}

}  // namespace

TEST_CASE("sinkhorn: a triangular combine matrix, 20 passes exactly") {
    // Logits 0 on and above the diagonal, -40 below: the softmax leaves only eps (1e-6) below the
    // diagonal, a matrix without total support, whose Sinkhorn limit is reached like 1/k.
    float mix[24] = {}, base[24] = {};
    const float scale[3] = {1.0f, 1.0f, 1.0f};
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) mix[8 + 4 * i + j] = j >= i ? 0.0f : -40.0f;
    mix[0] = 0.3f, mix[5] = -0.7f;
    const double tol = 2e-5;
    // The input is only a test if one pass more or less is far outside the tolerance.
    const double step = max_comb_diff(spec_split(mix, scale, base, 20), spec_split(mix, scale, base, 21));
    REQUIRE(step > 100 * tol);
    REQUIRE(max_comb_diff(spec_split(mix, scale, base, 20), spec_split(mix, scale, base, 19)) > 100 * tol);
    check_split(mix, scale, base, tol);
}

TEST_CASE("sinkhorn: near-triangular mixes through scale and base") {
    std::mt19937 rng(20261201);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int trial = 0; trial < 20; ++trial) {
        float mix[24], base[24];
        const float scale[3] = {0.5f + 0.5f * (u(rng) + 1.0f), 0.7f, 2.0f};
        for (int o = 0; o < 24; ++o) mix[o] = u(rng), base[o] = 0.1f * u(rng);
        // Strictly lower-triangular entries pushed below exp(-60): slow convergence again, with
        // the surviving entries random.
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < i; ++j) base[8 + 4 * i + j] = -60.0f;
        INFO("trial " << trial);
        const double step = max_comb_diff(spec_split(mix, scale, base, 20), spec_split(mix, scale, base, 21));
        const double tol = 2e-5;
        REQUIRE(step > 10 * tol);
        check_split(mix, scale, base, tol);
    }
}

TEST_CASE("sinkhorn: random mixes agree with the double statement") {
    std::mt19937 rng(7);
    std::normal_distribution<float> n(0.0f, 2.0f);
    for (int trial = 0; trial < 50; ++trial) {
        float mix[24], base[24];
        const float scale[3] = {0.1f, 0.1f, 0.1f};
        for (int o = 0; o < 24; ++o) mix[o] = 10.0f * n(rng), base[o] = 0.1f * n(rng);
        check_split(mix, scale, base, 2e-6);
    }
}
