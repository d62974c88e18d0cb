// Hyper-connection pre/post and the output-head mix (docs/model.md §2.2, §2.3, §2.8) against a
// naive double-precision statement of the same formulas, plus the Sinkhorn invariants.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "reference/hyper_connection.hpp"

namespace {

struct hc_case {
    int n_embd, n_hc = 4;
    std::vector<float> X, scale, base;
    std::vector<std::uint16_t> fn;
    std::vector<double> fn_d;  // decoded, for the naive formula
};

hc_case make_case(int n_embd, unsigned seed, int n_out) {
    hc_case c;
    c.n_embd = n_embd;
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int n_flat = c.n_hc * n_embd;
    c.X.resize(n_flat);
    for (auto& v : c.X) v = g(rng) * 3.0f;
    c.fn.resize(std::size_t(n_flat) * n_out);
    c.fn_d.resize(c.fn.size());
    for (std::size_t i = 0; i < c.fn.size(); ++i) {
        c.fn[i] = ds4::f32_to_f16(g(rng) * 0.05f);
        c.fn_d[i] = ds4::f16_to_f32(c.fn[i]);
    }
    c.scale = {0.7f + 0.1f * g(rng), 0.9f + 0.1f * g(rng), 1.3f + 0.1f * g(rng)};
    c.base.resize(n_out);
    for (auto& v : c.base) v = 0.5f * g(rng);
    return c;
}

// The naive statement: everything in double, the Sinkhorn loop as §2.2 writes it.
struct naive_split {
    double pre[4], post[4], M[4][4];
};

naive_split naive_hc_split(const hc_case& c) {
    const int n_flat = 4 * c.n_embd;
    double ss = 0;
    for (float v : c.X) ss += double(v) * v;
    const double r = 1.0 / std::sqrt(ss / n_flat + 1e-6);
    double mix[24] = {};
    for (int o = 0; o < 24; ++o)
        for (int i = 0; i < n_flat; ++i) mix[o] += c.fn_d[std::size_t(o) * n_flat + i] * (c.X[i] * r);
    naive_split s;
    for (int h = 0; h < 4; ++h) {
        s.pre[h] = 1.0 / (1.0 + std::exp(-(mix[h] * c.scale[0] + c.base[h]))) + 1e-6;
        s.post[h] = 2.0 / (1.0 + std::exp(-(mix[4 + h] * c.scale[1] + c.base[4 + h])));
    }
    for (int i = 0; i < 4; ++i) {
        double mx = -1e300, sum = 0;
        for (int j = 0; j < 4; ++j) {
            s.M[i][j] = mix[8 + 4 * i + j] * c.scale[2] + c.base[8 + 4 * i + j];
            mx = std::max(mx, s.M[i][j]);
        }
        for (int j = 0; j < 4; ++j) sum += (s.M[i][j] = std::exp(s.M[i][j] - mx));
        for (int j = 0; j < 4; ++j) s.M[i][j] = s.M[i][j] / sum + 1e-6;
    }
    auto cols = [&] {
        for (int j = 0; j < 4; ++j) {
            double sum = 0;
            for (int i = 0; i < 4; ++i) sum += s.M[i][j];
            for (int i = 0; i < 4; ++i) s.M[i][j] /= sum + 1e-6;
        }
    };
    cols();
    for (int it = 1; it < 20; ++it) {
        for (int i = 0; i < 4; ++i) {
            double sum = 0;
            for (int j = 0; j < 4; ++j) sum += s.M[i][j];
            for (int j = 0; j < 4; ++j) s.M[i][j] /= sum + 1e-6;
        }
        cols();
    }
    return s;
}

}  // namespace

TEST_CASE("Sinkhorn: rows and columns of the combine matrix sum to 1") {
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0.0f, 0.7f);  // logits of trained-model size
    for (int trial = 0; trial < 200; ++trial) {
        float mix[24], base[24];
        for (auto& v : mix) v = g(rng);
        for (auto& v : base) v = g(rng);
        const float scale[3] = {1.0f, 1.0f, 1.0f + 0.2f * g(rng)};
        const auto s = ds4::ref::hc_split_sinkhorn(mix, scale, base, 4, 20, 1e-6f);
        for (int i = 0; i < 4; ++i) {
            float row = 0, col = 0;
            for (int j = 0; j < 4; ++j) {
                row += s.comb[i * 4 + j];
                col += s.comb[j * 4 + i];
                CHECK(s.comb[i * 4 + j] > 0.0f);
            }
            CHECK(col == doctest::Approx(1.0).epsilon(1e-5));  // the last pass is a column pass
            CHECK(row == doctest::Approx(1.0).epsilon(1e-4));
            CHECK(s.pre[i] > 0.0f);
            CHECK(s.pre[i] <= 1.0f + 1e-6f);
            CHECK(s.post[i] >= 0.0f);
            CHECK(s.post[i] <= 2.0f);
        }
    }
}

TEST_CASE("hc_pre matches the naive double formula") {
    for (int n_embd : {64, 96, 257}) {
        const hc_case c = make_case(n_embd, 17 + n_embd, 24);
        std::vector<float> x_in(n_embd);
        const auto s = ds4::ref::hc_pre(c.X.data(), c.fn.data(), c.scale.data(), c.base.data(), n_embd, 4, 20,
                                        1e-6f, 1e-6f, x_in.data());
        const naive_split e = naive_hc_split(c);
        for (int h = 0; h < 4; ++h) {
            CHECK(s.pre[h] == doctest::Approx(e.pre[h]).epsilon(1e-5));
            CHECK(s.post[h] == doctest::Approx(e.post[h]).epsilon(1e-5));
            for (int j = 0; j < 4; ++j) CHECK(s.comb[h * 4 + j] == doctest::Approx(e.M[h][j]).epsilon(1e-4));
        }
        for (int d = 0; d < n_embd; ++d) {
            double want = 0, mag = 0;
            for (int h = 0; h < 4; ++h) {
                want += double(c.X[h * n_embd + d]) * e.pre[h];
                mag += std::fabs(double(c.X[h * n_embd + d]) * e.pre[h]);
            }
            CHECK(std::fabs(x_in[d] - want) <= 2e-5 * mag + 1e-30);
        }
    }
}

TEST_CASE("hc_post is M^T X + post (x) F") {
    const int n_embd = 131;
    const hc_case c = make_case(n_embd, 5, 24);
    std::vector<float> x_in(n_embd), F(n_embd), Y(4 * n_embd);
    const auto s = ds4::ref::hc_pre(c.X.data(), c.fn.data(), c.scale.data(), c.base.data(), n_embd, 4, 20,
                                    1e-6f, 1e-6f, x_in.data());
    std::mt19937 rng(9);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (auto& v : F) v = g(rng);
    ds4::ref::hc_post(F.data(), c.X.data(), s, n_embd, 4, Y.data());
    for (int j = 0; j < 4; ++j) {
        for (int d = 0; d < n_embd; ++d) {
            double want = double(F[d]) * s.post[j], mag = std::fabs(want);
            for (int i = 0; i < 4; ++i) {
                want += double(s.comb[i * 4 + j]) * c.X[i * n_embd + d];
                mag += std::fabs(double(s.comb[i * 4 + j]) * c.X[i * n_embd + d]);
            }
            CHECK(std::fabs(Y[j * n_embd + d] - want) <= 4e-7 * mag);
        }
    }
    // The stated order: F*post first, then i = 0..3, float accumulation.
    float acc = F[7] * s.post[2];
    for (int i = 0; i < 4; ++i) acc += s.comb[i * 4 + 2] * c.X[i * n_embd + 7];
    CHECK(Y[2 * n_embd + 7] == acc);
}

TEST_CASE("output head HC mix matches the naive formula") {
    const int n_embd = 200;
    const hc_case c = make_case(n_embd, 23, 4);
    std::vector<float> e(n_embd);
    ds4::ref::output_hc_mix(c.X.data(), c.fn.data(), c.scale.data(), c.base.data(), n_embd, 4, 1e-6f, 1e-6f,
                            e.data());
    double ss = 0;
    for (float v : c.X) ss += double(v) * v;
    const double r = 1.0 / std::sqrt(ss / (4 * n_embd) + 1e-6);
    double w[4];
    for (int h = 0; h < 4; ++h) {
        double pre = 0;
        for (int i = 0; i < 4 * n_embd; ++i) pre += c.fn_d[std::size_t(h) * 4 * n_embd + i] * (c.X[i] * r);
        w[h] = 1.0 / (1.0 + std::exp(-(pre * c.scale[0] + c.base[h]))) + 1e-6;
    }
    for (int d = 0; d < n_embd; ++d) {
        double want = 0, mag = 0;
        for (int h = 0; h < 4; ++h) {
            want += c.X[h * n_embd + d] * w[h];
            mag += std::fabs(c.X[h * n_embd + d] * w[h]);
        }
        CHECK(std::fabs(e[d] - want) <= 2e-5 * mag);
    }
}
